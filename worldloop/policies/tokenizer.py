"""Action tokenizer: continuous actions <-> discrete tokens, one token per action dimension.

Each dimension is first normalised by the dataset's low/high percentiles (OpenVLA's q01/q99):
``low -> -1`` and ``high -> +1``, values outside are clipped. The range [-1, 1] is then cut into
``num_bins`` uniform bins; a token is a bin index and decodes to its bin's centre. So for an action
inside [low, high], ``decode(encode(x))`` is within half a bin of ``x``, and ``encode(decode(t)) == t``.
The statistics travel with the checkpoint as ``norm_stats.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

NORM_STATS_NAME = "norm_stats.json"
MIN_RANGE = 1e-6
"""A dimension whose low and high percentiles coincide (a constant action) gets this range."""


NUM_BINS = 256
"""Action tokens per dimension: uniform bins over the normalised range [-1, 1] (OpenVLA's 256)."""


class ActionTokenizer:
    def __init__(self, low: torch.Tensor | list[float], high: torch.Tensor | list[float], num_bins: int = NUM_BINS):
        low = torch.as_tensor(low, dtype=torch.float32).flatten()
        high = torch.as_tensor(high, dtype=torch.float32).flatten()
        if low.shape != high.shape or low.numel() == 0:
            raise ValueError(f"norm stats: low {tuple(low.shape)} and high {tuple(high.shape)} must be equal, non-empty vectors")
        if not torch.isfinite(low).all() or not torch.isfinite(high).all():
            raise ValueError("norm stats contain NaN or infinite values")
        self.low = low
        self.high = torch.maximum(high, low + MIN_RANGE)
        self.num_bins = int(num_bins)

    @property
    def action_dim(self) -> int:
        return self.low.numel()

    @classmethod
    def fit(cls, actions: torch.Tensor | np.ndarray, percentiles: tuple[float, float] | list[float] = (1.0, 99.0), num_bins: int = NUM_BINS) -> ActionTokenizer:
        """Statistics from ``actions`` (N, A): the given low/high percentiles of each dimension."""
        actions = np.asarray(torch.as_tensor(actions, dtype=torch.float32).cpu())
        if actions.ndim != 2 or len(actions) == 0:
            raise ValueError(f"fit needs actions of shape (N, A) with N > 0, got {actions.shape}")
        low, high = np.percentile(actions.astype(np.float64), list(percentiles), axis=0)
        return cls(torch.from_numpy(low).float(), torch.from_numpy(high).float(), num_bins)

    # ---------------------------------------------------------------------------------------------

    def normalize(self, actions: torch.Tensor) -> torch.Tensor:
        """Environment units -> [-1, 1] (clipped)."""
        low, high = self._stats(actions)
        return (2 * (actions.float() - low) / (high - low) - 1).clamp(-1, 1)

    def unnormalize(self, normalized: torch.Tensor) -> torch.Tensor:
        """[-1, 1] -> environment units."""
        low, high = self._stats(normalized)
        return (normalized.float() + 1) / 2 * (high - low) + low

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """(..., A) float actions -> (..., A) int64 tokens in [0, num_bins)."""
        self._check_dim(actions)
        position = (self.normalize(actions) + 1) / 2 * self.num_bins
        return position.floor().long().clamp(0, self.num_bins - 1)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """(..., A) tokens -> (..., A) float32 actions at the bin centres."""
        self._check_dim(tokens)
        if tokens.dtype.is_floating_point:
            raise TypeError(f"tokens must be an integer tensor, got {tokens.dtype}")
        centre = (tokens.float() + 0.5) / self.num_bins * 2 - 1
        return self.unnormalize(centre)

    def bin_width(self) -> torch.Tensor:
        """(A,) width of one bin in environment units."""
        return (self.high - self.low) / self.num_bins

    # ---------------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"low": self.low.tolist(), "high": self.high.tolist(), "num_bins": self.num_bins}

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "norm stats") -> ActionTokenizer:
        for key in ("low", "high", "num_bins"):
            if key not in data:
                raise ValueError(f"{where} has no '{key}' entry (expected keys low, high, num_bins)")
        return cls(data["low"], data["high"], data["num_bins"])

    @classmethod
    def load(cls, folder: str | Path) -> ActionTokenizer:
        from worldloop.utils.io import read_json

        path = Path(folder) / NORM_STATS_NAME
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: the policy checkpoint has no action normalisation stats")
        return cls.from_json(read_json(path), str(path))

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.low.to(like.device), self.high.to(like.device)

    def _check_dim(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.action_dim:
            raise ValueError(f"last dimension {x.shape[-1]} does not match the tokenizer's action dimension {self.action_dim}")

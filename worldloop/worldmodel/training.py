"""What the VAE's training (:mod:`worldloop.worldmodel.train_vae`) and the DiT's (:mod:`worldloop.worldmodel.train_dit`,
and the world model's refinement on new episodes) share: the episodes they read, the dataset split, the training
budget and its learning-rate schedule, the optimizer, the moving average of the weights and the logging interval.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Iterable, Protocol

import numpy as np
import torch

from worldloop.utils import distributed

WEIGHT_DECAY = 0.01
"""The DiT's AdamW weight decay."""
GRAD_CLIP = 1.0
"""The DiT's gradient-norm clip."""
LOG_EVERY = 25
"""Steps between the training losses written to TensorBoard (reading a loss waits for the GPU)."""


class EpisodeLike(Protocol):
    frames: Any  # (T, H, W, 3) uint8
    actions: Any  # (T, A) float32


def episode_frames(episode: EpisodeLike) -> torch.Tensor:
    """The episode's frames (T, H, W, 3) uint8."""
    return torch.as_tensor(np.asarray(episode.frames))


def episode_actions(episode: EpisodeLike) -> np.ndarray:
    """The episode's actions (T, A) float32."""
    return np.asarray(episode.actions, dtype=np.float32)


def load_split(dataset_dir: str | Path, seed: int, held_out_fraction: float | None = None) -> tuple[list, list, Any]:
    """(train episodes, held-out episodes, dataset) of a LeRobot dataset folder, split per task (held_out_fraction
    None: worldloop.data.dataset.HELD_OUT_FRACTION, the split training keeps out)."""
    from worldloop.data.dataset import HELD_OUT_FRACTION, TrajectoryDataset, split_episodes

    held_out_fraction = HELD_OUT_FRACTION if held_out_fraction is None else held_out_fraction

    dataset = TrajectoryDataset(dataset_dir)
    train_idx, held_idx = split_episodes(dataset, held_out_fraction=held_out_fraction, seed=seed)
    return list(dataset.episodes(train_idx)), list(dataset.episodes(held_idx)), dataset


class TrainingBudget:
    """How far training is through its budget: ``steps`` optimizer steps, or ``time_limit_s`` seconds
    of training (summed over resumed runs) when that is set, whichever runs out first. The learning
    rate follows it, so a time-limited run still warms up and decays: a schedule over ``steps`` alone
    left a 100-s H200 run of train-vae inside its warm-up (154 of 300 warm-up steps)."""

    def __init__(self, steps: int, time_limit_s: float = 0.0, seconds_done: float = 0.0):
        self.steps, self.time_limit_s = steps, time_limit_s
        self.seconds_done = seconds_done  # training seconds of earlier runs, from the checkpoint
        self.started = time.time()

    def seconds(self) -> float:
        """Training seconds so far; under torchrun with a time limit, rank 0's clock on every rank (one small
        all-reduce per call), so that the ranks stop at the same step and follow the same learning rate."""
        seconds = self.seconds_done + time.time() - self.started
        if self.time_limit_s and distributed.active():
            seconds = float(distributed.all_sum(seconds if distributed.is_main() else 0.0))
        return seconds

    def fraction(self, step: int) -> float:
        by_steps = step / max(1, self.steps)
        return max(by_steps, self.seconds() / self.time_limit_s) if self.time_limit_s else by_steps

    def out_of_time(self) -> bool:
        return bool(self.time_limit_s) and self.seconds() >= self.time_limit_s

    def lr_factor(self, step: int) -> float:
        """Linear warm-up over the first 5 % of the budget, then cosine decay to 10 % at its end."""
        fraction = self.fraction(step + 1)
        if fraction < 0.05:
            return fraction / 0.05
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (fraction - 0.05) / 0.95)))


def progress(iterable: Iterable, **kwargs: Any):
    """A tqdm progress bar over ``iterable``."""
    from tqdm.auto import tqdm

    return tqdm(iterable, **kwargs)


def make_optimizer(parameters, lr: float, weight_decay: float, device: torch.device) -> torch.optim.AdamW:
    """AdamW (betas 0.9, 0.99), its update fused into one kernel per step on CUDA (the small DiT's step launched
    thousands of kernels, a third of them the optimizer's and the EMA's)."""
    return torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.99), fused=device.type == "cuda")


@torch.no_grad()
def ema_step(ema: torch.nn.Module, model: torch.nn.Module, decay: float) -> None:
    """One step of the exponential moving average of ``model``'s weights in ``ema``: ema <- decay ema + (1 - decay) model
    (one multi-tensor kernel for all weights, not one per tensor)."""
    torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 1.0 - decay)

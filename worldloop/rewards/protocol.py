"""The success-judge protocol shared by the trained classifier and TOPReward.

A judge reads, per environment, the last ``window`` frames and its instruction, and returns a
score and a success decision. Everything is batched over environments: one call scores all of them,
on the judge's device, without a Python loop over environments.

    judge = load_judge("runs/rw", device)                  # worldloop.rewards.load_judge: a classifier folder
    judge = load_judge("topreward:/models/Qwen3-VL-8B-Instruct", device)
    scores = judge.score(windows, instructions)            # windows (B, judge.window, H, W, 3) uint8
    done = judge.success(windows, instructions)            # (B,) bool: probability(score) >= threshold
    judge.task_thresholds = {"open the door": 0.9}       # optional: a threshold of its own for one instruction
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch

@runtime_checkable
class Judge(Protocol):
    """Scores windows of frames for task success."""

    window: int
    """Frames the judge reads per environment (1 for the classifier, 16 for TOPReward)."""
    threshold: float
    """Success when ``probability(score) >= threshold``."""
    task_thresholds: dict[str, float]
    """Per instruction, a threshold in place of ``threshold`` (reward.calibrate.threshold_per_task sets them; empty: one for all)."""
    device: torch.device

    def score(self, windows: torch.Tensor, instructions: Sequence[str]) -> torch.Tensor:
        """(B, window, H, W, 3) uint8 + B instructions -> (B,) float32 scores (higher = more success)."""
        ...

    def probability(self, scores: torch.Tensor) -> torch.Tensor:
        """Scores -> P(success) in [0, 1], the scale of ``threshold``."""
        ...

    def success(self, windows: torch.Tensor, instructions: Sequence[str]) -> torch.Tensor:
        """(B,) bool: ``probability(score(...)) >=`` each instruction's threshold (``success_thresholds``)."""
        ...


def judged_success(judge: Judge, windows: torch.Tensor, instructions: Sequence[str]) -> torch.Tensor:
    """(B,) bool: the judge's P(success) of each window at or above its instruction's threshold; every judge's ``success``."""
    probability = judge.probability(judge.score(windows, instructions))
    return probability >= success_thresholds(judge, instructions, probability.device)


def success_thresholds(judge: Judge, instructions: Sequence[str], device: torch.device | str | None = None) -> torch.Tensor:
    """(B,) the threshold each window is judged at: its instruction's in ``judge.task_thresholds``, else ``judge.threshold``."""
    per_task = judge.task_thresholds
    if not per_task:
        return torch.full((len(instructions),), float(judge.threshold), device=device)
    return torch.tensor([per_task.get(text, judge.threshold) for text in instructions], device=device)


def check_windows(windows: torch.Tensor, instructions: Sequence[str], window: int, who: str) -> None:
    """Raise a clear error unless ``windows`` is (B, window, H, W, 3) uint8 with B instructions."""
    if not isinstance(windows, torch.Tensor):
        raise TypeError(f"{who}: windows must be a torch.Tensor (B, {window}, H, W, 3) uint8, got {type(windows).__name__}")
    if windows.dtype != torch.uint8:
        raise TypeError(f"{who}: windows must be uint8 RGB, got {windows.dtype}")
    if windows.ndim != 5 or windows.shape[-1] != 3:
        raise ValueError(f"{who}: windows must have shape (B, {window}, H, W, 3), got {tuple(windows.shape)}")
    if windows.shape[1] != window:
        raise ValueError(f"{who}: this judge reads windows of {window} frames, got {windows.shape[1]} (shape {tuple(windows.shape)})")
    if isinstance(instructions, str) or len(instructions) != windows.shape[0]:
        got = "a single string" if isinstance(instructions, str) else f"{len(instructions)} instructions"
        raise ValueError(f"{who}: expected one instruction per window ({windows.shape[0]}), got {got}")

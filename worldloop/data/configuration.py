"""Configuration of trajectory collection."""

from __future__ import annotations

from dataclasses import dataclass

# Settings that change what a planned episode contains; a folder collected with other values
# cannot be resumed (the completed keys would mean different episodes).
PLAN_DEFINING = (
    "seed",
    "sim.backend",
    "sim.image_size",
    "sim.camera",
    "sim.max_steps",
    "sim.success_hold_steps",
    "expert",
)

NOISY_FRACTION = 0.5
"""Share of each task's expert episodes collected with the noisy expert (`expert.*`; every other episode); the rest
are clean. Zero noise in `expert.*` makes every episode clean."""

FPS = 20
"""Frame rate recorded in every collected dataset and its videos, and of the evaluation videos (LIBERO's control rate)."""


@dataclass
class CollectConfig:
    """Collecting trajectories in the real simulator into a LeRobot v3 dataset."""

    episodes_per_task: int = 5
    """Episodes recorded for every task of the suite."""
    num_envs: int = 4
    """Environments stepped together (spread over `sim.num_workers` processes)."""

    def validate(self) -> None:
        if self.episodes_per_task < 1 or self.num_envs < 1:
            raise ValueError(f"episodes_per_task and num_envs must be >= 1, got {self.episodes_per_task}, {self.num_envs}")

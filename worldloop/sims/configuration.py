"""Configuration of the real simulators and of the scripted experts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class SimConfig:
    """A vectorised real simulator."""

    backend: Literal["metaworld"] = "metaworld"
    """Which simulator runs the tasks."""
    suite: str = "mt10"
    """Named task suite ('mt10', 'mt50'); ignored when `tasks` is set."""
    tasks: list[str] = field(default_factory=list)
    """Explicit task names (e.g. ['reach-v3', 'drawer-open-v3']); empty means the whole suite."""
    image_size: int = 64
    """Side of the square RGB frames in pixels (64, 128 or 256)."""
    camera: str = "corner"
    """Camera the frames are rendered from (Meta-World: corner, corner2, corner3, topview, behindGripper, gripperPOV)."""
    shadows: bool = False
    """Render shadows (slower; off keeps the scene faithful at our resolutions)."""
    max_steps: int = 200
    """Episode length limit in simulator steps (truncation)."""
    chunk_size: int = 8
    """Actions per chunk: one `step` executes this many actions and returns this many frames."""
    success_hold_steps: int = 0
    """Steps an episode continues after its first success before it ends (0: end at success)."""
    num_workers: int = 2
    """Simulator worker processes; environments are spread over them."""

    def validate(self) -> None:
        if self.image_size not in (64, 128, 256):
            raise ValueError(f"image_size={self.image_size} is not supported; allowed: 64, 128, 256")
        if self.chunk_size < 1 or self.max_steps < 1 or self.num_workers < 1 or self.success_hold_steps < 0:
            raise ValueError("chunk_size, max_steps and num_workers must be >= 1, success_hold_steps >= 0")


@dataclass
class ExpertConfig:
    """Meta-World's scripted per-task policies, made imperfect on purpose."""

    action_noise: float = 0.0
    """Std of Gaussian noise added to every expert action (actions live in [-1, 1])."""
    perturb_prob: float = 0.0
    """Probability that an episode contains a perturbation (a burst of random actions)."""
    perturb_steps: int = 20
    """Length of a perturbation burst in steps."""

    def validate(self) -> None:
        if self.action_noise < 0 or not 0 <= self.perturb_prob <= 1 or self.perturb_steps < 0:
            raise ValueError("action_noise >= 0, 0 <= perturb_prob <= 1 and perturb_steps >= 0 are required")

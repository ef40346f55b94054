"""A toy world behind the real environment protocol, for testing RL in seconds on a CPU.

A red dot on a dark square image must reach a green target. The target's place depends on the
task; the dot starts at a seeded random place. An action is a 2-D move in [-1, 1]^2 (scaled by
``speed``); success is the dot within ``radius`` of the target. The same world comes in three
pieces, like the real system:

- :class:`ToyEnv`: the "real simulator" (a :class:`~worldloop.envs.protocol.VecEnv`);
- :class:`ToyWorldModel`: a perfect "world model" that reads the dot and target off the frames
  (API of the world model: ``reset(first_frames, memory_frames)``, ``step(chunks) -> frames``);
- :class:`ToyJudge`: a "reward model" that scores a window of frames (API of the judges).

Everything is batched tensor code on any device.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from worldloop.envs.protocol import REWARD_SCALE, EnvReset, EnvStep, check_actions
from worldloop.rewards.protocol import judged_success

TARGETS = {
    "reach-top-right": (0.75, 0.25),
    "reach-bottom-left": (0.25, 0.75),
}
"""Task name -> target (x, y) in [0, 1]^2 (x to the right, y down the image)."""

BACKGROUND = (30, 30, 30)
DOT = (230, 40, 40)
TARGET = (40, 200, 40)


def render(dots: torch.Tensor, targets: torch.Tensor, image_size: int, dot_radius: float = 0.05, target_half: float = 0.12) -> torch.Tensor:
    """Frames (..., H, W, 3) uint8: a green square outline (the target) and a red dot drawn over it;
    positions (..., 2) in [0, 1]."""
    centres = (torch.arange(image_size, device=dots.device, dtype=torch.float32) + 0.5) / image_size
    x, y = centres[None, :], centres[:, None]  # (1, W), (H, 1)
    dx, dy = x - dots[..., 0, None, None], y - dots[..., 1, None, None]
    on_dot = dx**2 + dy**2 <= dot_radius**2
    chebyshev = torch.maximum((x - targets[..., 0, None, None]).abs(), (y - targets[..., 1, None, None]).abs())
    on_target = (chebyshev - target_half).abs() <= 0.6 / image_size
    colour = lambda rgb: torch.tensor(rgb, dtype=torch.uint8, device=dots.device)  # noqa: E731
    frames = colour(BACKGROUND).expand(*on_dot.shape, 3).clone()
    frames[on_target] = colour(TARGET)
    frames[on_dot] = colour(DOT)
    return frames


def locate(frames: torch.Tensor, rgb: tuple[int, int, int]) -> torch.Tensor:
    """Centroid (..., 2) in [0, 1] of the pixels of colour ``rgb`` in frames (..., H, W, 3); 0.5 when absent."""
    image_size = frames.shape[-2]
    match = (frames.int() - torch.tensor(rgb, device=frames.device)).abs().sum(-1) < 30  # (..., H, W)
    centres = (torch.arange(image_size, device=frames.device, dtype=torch.float32) + 0.5) / image_size
    count = match.sum(dim=(-2, -1)).float()
    x = (match.float() * centres[None, :]).sum(dim=(-2, -1))
    y = (match.float() * centres[:, None]).sum(dim=(-2, -1))
    position = torch.stack([x, y], dim=-1) / count.clamp(min=1)[..., None]
    return torch.where(count[..., None] > 0, position, torch.full_like(position, 0.5))


class ToyEnv:
    """The toy world as a vectorised, chunked environment (the protocol of the real simulators)."""

    def __init__(
        self,
        num_envs: int,
        tasks: Sequence[str] = ("reach-top-right",),
        image_size: int = 32,
        chunk_size: int = 4,
        max_steps: int = 16,
        speed: float = 0.08,
        radius: float = 0.12,
        reward_scale: float = REWARD_SCALE,
        device: str | torch.device = "cpu",
    ):
        unknown = [t for t in tasks if t not in TARGETS]
        if unknown:
            raise ValueError(f"unknown toy tasks {unknown}; allowed: {sorted(TARGETS)}")
        self.num_envs, self.task_names = num_envs, list(tasks)
        self.image_size, self.chunk_size, self.max_steps, self.action_dim = image_size, chunk_size, max_steps, 2
        self.speed, self.radius, self.reward_scale, self.device = speed, radius, reward_scale, torch.device(device)
        self.instructions = [instruction(self.task_names[0])] * num_envs
        self._dots = torch.full((num_envs, 2), 0.5, device=self.device)
        self._targets = torch.full((num_envs, 2), 0.5, device=self.device)
        self._elapsed = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self._done = torch.zeros(num_envs, dtype=torch.bool, device=self.device)

    def reset(self, task_ids: Sequence[int | str], seeds: Sequence[int]) -> EnvReset:
        if len(task_ids) != self.num_envs or len(seeds) != self.num_envs:
            raise ValueError(f"reset needs {self.num_envs} task ids and seeds, got {len(task_ids)} and {len(seeds)}")
        names = [t if isinstance(t, str) else self.task_names[t] for t in task_ids]
        starts = np.stack([np.random.default_rng(int(s)).uniform(0.15, 0.85, size=2) for s in seeds])
        self._dots = torch.tensor(starts, dtype=torch.float32, device=self.device)
        self._targets = torch.tensor([TARGETS[n] for n in names], dtype=torch.float32, device=self.device)
        self._elapsed.zero_()
        self._done.zero_()
        self.instructions = [instruction(n) for n in names]
        return EnvReset(render(self._dots, self._targets, self.image_size), list(self.instructions), self._dots.clone())

    def step(self, actions: torch.Tensor) -> EnvStep:
        check_actions(actions, self.num_envs, self.chunk_size, self.action_dim)
        moves = self.speed * actions.to(self.device).clamp(-1, 1)
        active = ~self._done
        # Positions after each action while the episode runs; frozen from the action that ends it.
        path = (self._dots[:, None] + moves.cumsum(dim=1)).clamp(0, 1)  # (N, K, 2)
        hit = (path - self._targets[:, None]).norm(dim=-1) < self.radius  # (N, K)
        step_index = self._elapsed[:, None] + torch.arange(1, self.chunk_size + 1, device=self.device)
        ends = hit | (step_index >= self.max_steps)
        first_end = torch.where(ends, torch.arange(self.chunk_size, device=self.device), self.chunk_size).min(dim=1).values
        k = torch.arange(self.chunk_size, device=self.device)[None]
        frozen = (k > first_end[:, None]) | ~active[:, None]
        last = path.gather(1, first_end.clamp(max=self.chunk_size - 1)[:, None, None].expand(-1, 1, 2))
        path = torch.where(frozen[..., None], torch.where(active[:, None, None], last, self._dots[:, None]), path)
        success = hit & ~frozen
        done = (k >= first_end[:, None]) & active[:, None] | self._done[:, None]
        executed = torch.minimum(first_end + 1, torch.full_like(first_end, self.chunk_size))
        self._elapsed += torch.where(active, executed, 0)
        truncated = active & done[:, -1] & ~success.any(dim=1)
        reward = self.reward_scale * success.any(dim=1).float()  # c * (R_after - R_before), R = success
        self._dots = path[:, -1]
        self._done = done[:, -1]
        frames = render(path, self._targets[:, None].expand(-1, self.chunk_size, -1), self.image_size)
        return EnvStep(frames, success, done, reward, truncated, path.clone())

    @property
    def elapsed_steps(self) -> torch.Tensor:
        return self._elapsed.clone()

    def close(self) -> None:
        pass


def instruction(task: str) -> str:
    where = task.removeprefix("reach-").replace("-", " ")
    return f"move the red dot onto the green square at the {where}"


class ToyWorldModel:
    """A perfect world model of the toy world: it reads the dot and the target off the context
    frames and moves the dot by the actions (the world model's reset/step API)."""

    def __init__(self, image_size: int = 32, chunk_size: int = 4, speed: float = 0.08, device: str | torch.device = "cpu"):
        self.image_size, self.chunk_size, self.action_dim, self.speed = image_size, chunk_size, 2, speed
        self.device = torch.device(device)
        self._dots: torch.Tensor | None = None
        self._targets: torch.Tensor | None = None

    def reset(self, first_frames: torch.Tensor, memory_frames: torch.Tensor | None = None, seeds=None, memory_actions=None) -> None:
        """Seeds and memory actions are accepted for the API's sake: this world is deterministic and reads the state off the frames."""
        current = first_frames if memory_frames is None else memory_frames[:, -1]
        self._dots, self._targets = locate(current, DOT), locate(first_frames, TARGET)

    def step(self, action_chunks: torch.Tensor) -> torch.Tensor:
        if self._dots is None:
            raise RuntimeError("ToyWorldModel.step before reset")
        path = (self._dots[:, None] + self.speed * action_chunks.clamp(-1, 1).cumsum(dim=1)).clamp(0, 1)
        self._dots = path[:, -1]
        return render(path, self._targets[:, None].expand_as(path), self.image_size)


class ToyJudge:
    """A success judge of the toy world (the judges' API), a video judge: success when the dot came
    within ``radius`` of the target in any frame of the window; score = a sigmoid of the best margin."""

    def __init__(self, image_size: int = 32, radius: float = 0.12, window: int = 4, threshold: float = 0.5):
        self.image_size, self.radius, self.window, self.threshold = image_size, radius, window, threshold
        self.task_thresholds: dict[str, float] = {}

    def score(self, windows: torch.Tensor, instructions: list[str]) -> torch.Tensor:
        if windows.ndim != 5 or windows.shape[1] != self.window:
            raise ValueError(f"windows must be (B, {self.window}, H, W, 3), got {tuple(windows.shape)}")
        distance = (locate(windows, DOT) - locate(windows, TARGET)).norm(dim=-1).min(dim=1).values  # (B,)
        return torch.sigmoid((self.radius - distance) * 100.0)

    def probability(self, scores: torch.Tensor) -> torch.Tensor:
        return scores

    def success(self, windows: torch.Tensor, instructions: list[str]) -> torch.Tensor:
        return judged_success(self, windows, instructions)

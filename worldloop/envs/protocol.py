"""The one environment interface that the real simulators and the imagined (world-model)
environment both implement. RL, evaluation and collection import this protocol only.

An environment is a batch of N episodes stepped together in *chunks*: one ``step`` takes K
actions per environment (an action chunk, as a VLA emits it) and returns the K frames they
produce. Frames are RGB uint8, right side up, ``(H, W, 3)`` with H = W = ``image_size``.
Tensors live on the environment's ``device`` (CPU for real simulators, the GPU for the world
model), so a GPU pipeline never round-trips through the CPU.

Episode bookkeeping is per environment: each has its own step counter, and once an episode is
done its later steps are not simulated (its frames repeat the last one, ``done`` stays True)
until the next ``reset``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import torch

REWARD_SCALE = 5.0
"""c in every environment's chunk reward c * (R_after - R_before), R = 1 once the episode has succeeded (WoVR's c)."""


@dataclass
class EnvReset:
    frames: torch.Tensor
    """(N, H, W, 3) uint8: the first observation of every episode."""
    instructions: list[str]
    """One English instruction per environment."""
    state: torch.Tensor | None = None
    """(N, S) float32 proprioceptive state, when the environment has one."""


@dataclass
class EnvStep:
    frames: torch.Tensor
    """(N, K, H, W, 3) uint8: the observation after each of the K actions."""
    success: torch.Tensor
    """(N, K) bool: the task's success signal after each action."""
    done: torch.Tensor
    """(N, K) bool: True from the action at which the episode ended (success or time limit) on."""
    reward: torch.Tensor
    """(N,) float32: the chunk's reward, c * (R_after - R_before), R the success signal (the real simulator: succeeded
    at any step so far, so a success reached mid-chunk is credited even when lost by the chunk's end)."""
    truncated: torch.Tensor
    """(N,) bool: the episode ended in this chunk by the time limit, not by success."""
    state: torch.Tensor | None = None
    """(N, K, S) float32 proprioceptive state after each action, when the environment has one."""


@runtime_checkable
class VecEnv(Protocol):
    """A batch of episodes stepped in action chunks."""

    num_envs: int
    """N, the number of environments."""
    chunk_size: int
    """K, actions per step."""
    action_dim: int
    """A, the dimension of one action."""
    image_size: int
    """Side of the square frames."""
    max_steps: int
    """Episode length limit in actions."""
    device: torch.device
    """Where the returned tensors live."""

    def reset(self, task_ids: Sequence[int | str], seeds: Sequence[int]) -> EnvReset:
        """Start N new episodes: ``task_ids[i]`` (index into the env's task list, or a name) with
        ``seeds[i]`` (the simulator's initial-state seed; an imagined env uses it to pick initial
        states)."""
        ...

    def step(self, actions: torch.Tensor) -> EnvStep:
        """Execute an action chunk ``actions`` of shape (N, K, A) in environment units."""
        ...

    @property
    def elapsed_steps(self) -> torch.Tensor:
        """(N,) int64: actions executed in each environment's current episode."""
        ...

    def close(self) -> None:
        """Release workers and memory."""
        ...


def check_actions(actions: torch.Tensor, num_envs: int, chunk_size: int, action_dim: int) -> None:
    """Raise a clear error unless ``actions`` is a float (N, K, A) tensor."""
    expected = (num_envs, chunk_size, action_dim)
    if not isinstance(actions, torch.Tensor):
        raise TypeError(f"actions must be a torch.Tensor of shape {expected}, got {type(actions).__name__}")
    if tuple(actions.shape) != expected:
        raise ValueError(f"actions have shape {tuple(actions.shape)}; expected (num_envs, chunk_size, action_dim) = {expected}")
    if not actions.is_floating_point():
        raise TypeError(f"actions must be floating point, got {actions.dtype}")

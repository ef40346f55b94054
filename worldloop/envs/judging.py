"""A judge's verdicts on a batch of episodes, chunk by chunk, and a real environment judged alongside.

The imagined environment ends its episodes on these verdicts. Wrapped around the real simulator,
the same verdicts on the real frames say how far the judge alone agrees with the simulator's own
success: the first of the imagination-reality gap's three sources (see ``RealityCheck``).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from worldloop.envs.protocol import EnvReset, EnvStep, VecEnv
from worldloop.rewards.protocol import success_thresholds


class ChunkVerdicts:
    """Per env, the latest ``judge.window`` frames and the judge's verdict at each chunk's end; an
    episode succeeds once the judge has said so at ``success_chunks`` consecutive chunk ends."""

    def __init__(self, judge: Any, success_chunks: int = 1):
        if success_chunks < 1:
            raise ValueError(f"success_chunks must be >= 1, got {success_chunks}")
        self.judge, self.success_chunks = judge, success_chunks
        self.history = torch.zeros(0, judge.window, 1, 1, 3, dtype=torch.uint8)
        """(N, window, H, W, 3) uint8: the frames the next verdict reads, the newest last."""
        self.streak = torch.zeros(0, dtype=torch.long)
        """(N,) consecutive chunk ends judged a success."""
        self.probability = torch.zeros(0)
        """(N,) the latest verdict's P(success), 0 where the env was not active (calibrating a threshold reads it)."""

    def start(self, recent: torch.Tensor) -> None:
        """New episodes from ``recent`` (N, R, H, W, 3), the frames up to the current one; the oldest
        repeats where R is shorter than the judge's window."""
        window = self.judge.window
        padded = torch.cat([recent[:, :1].expand(-1, max(window - recent.shape[1], 0), -1, -1, -1), recent], dim=1)
        self.history = padded[:, -window:].contiguous()
        self.streak = torch.zeros(len(recent), dtype=torch.long, device=recent.device)
        self.probability = torch.zeros(len(recent), device=recent.device)

    def update(self, frames: torch.Tensor, instructions: Sequence[str], active: torch.Tensor) -> torch.Tensor:
        """One chunk's frames (N, K, H, W, 3) of the envs still ``active`` (N,) -> (N,) bool: success at its end."""
        self.history = torch.cat([self.history, frames], dim=1)[:, -self.judge.window :]
        probability = self.judge.probability(self.judge.score(self.history, list(instructions))).to(frames.device).float()
        active = active.to(frames.device)
        self.probability = torch.where(active, probability, 0.0)
        threshold = success_thresholds(self.judge, instructions, frames.device)
        judged = (probability >= threshold) & active  # the judge's success(), from the probability kept above
        self.streak = torch.where(judged, self.streak + 1, 0)
        return self.streak >= self.success_chunks


def streak_score(probability: torch.Tensor, success_chunks: int) -> torch.Tensor:
    """(N, T) P(success) of each chunk's verdict -> (N,) the highest threshold at which some
    ``success_chunks`` consecutive verdicts all pass, i.e. at which ChunkVerdicts would call the episode
    a success: the best over windows of the window's lowest P (0 where T < success_chunks)."""
    if probability.shape[1] < success_chunks:
        return probability.new_zeros(probability.shape[0])
    return probability.unfold(1, success_chunks, 1).min(dim=2).values.max(dim=1).values


class JudgedEnv:
    """Any :class:`VecEnv`, passed through unchanged, with the judge's verdicts on its own frames beside
    its success: ``success_once`` (N,) says whether the judge called each episode a success before it
    ended. The judge ends nothing here; the simulator's own success and time limit do. ``probability`` (N, T) holds the
    P(success) of every chunk's verdict since the reset (0 once an episode has ended)."""

    def __init__(self, env: VecEnv, judge: Any, success_chunks: int = 1):
        self.env = env
        self.verdicts = ChunkVerdicts(judge, success_chunks)
        self.success_once = torch.zeros(env.num_envs, dtype=torch.bool)
        self._done = torch.zeros(env.num_envs, dtype=torch.bool)
        self._instructions: list[str] = []
        self._probability: list[torch.Tensor] = []

    @property
    def probability(self) -> torch.Tensor:
        return torch.stack(self._probability, dim=1) if self._probability else torch.zeros(self.env.num_envs, 0)

    def reset(self, task_ids: Sequence[int | str], seeds: Sequence[int]) -> EnvReset:
        first = self.env.reset(task_ids, seeds)
        self.verdicts.start(first.frames[:, None])
        self.success_once = torch.zeros(self.env.num_envs, dtype=torch.bool, device=first.frames.device)
        self._done = torch.zeros_like(self.success_once)
        self._instructions = list(first.instructions)
        self._probability = []
        return first

    def step(self, actions: torch.Tensor) -> EnvStep:
        step = self.env.step(actions)
        frames = step.frames.to(self.success_once.device)
        self.success_once |= self.verdicts.update(frames, self._instructions, ~self._done)
        self._probability.append(self.verdicts.probability)
        self._done = step.done[:, -1].to(self._done.device)
        return step

    def __getattr__(self, name: str) -> Any:  # num_envs, chunk_size, max_steps, elapsed_steps, close, ...
        return getattr(self.env, name)

"""The imagined environment: a world model for the dynamics and a judge for reward and termination,
behind the same vectorised, chunked protocol as the real simulators (DIAMOND's WorldModelEnv idea).

- ``reset(task_ids, seeds)`` draws one initial state per group of ``group_size`` consecutive envs
  (GRPO's group shares it): an episode's first frame, or, with probability ``kir_ratio``, a KIR
  keyframe with its memory frames and its episode's first frame as the anchor.
- ``step(chunks)``: the world model renders the chunk's K frames; the judge reads the latest
  ``judge.window`` frames and says success; an episode succeeds once the judge has said so at the
  end of ``success_chunks`` consecutive chunks (1: its first verdict); the reward is
  r = c (R_t - R_{t-1}) with R that success; success terminates, ``max_steps`` truncates.
  Per-env step counters; finished envs repeat their last frame. One batched call of each model per
  step, no per-env Python loops.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from worldloop.envs.judging import ChunkVerdicts
from worldloop.envs.protocol import REWARD_SCALE, EnvReset, EnvStep, check_actions
from worldloop.rewards.protocol import Judge
from worldloop.worldmodel.protocol import WorldModelLike

MEMORY_FRAMES = 4
"""Frames of memory the world model's context holds after the anchor: [o_0, last 4 frames]."""


@dataclass
class InitialStates:
    """A pool of states an imagined episode can start from (on the CPU; M states)."""

    anchors: torch.Tensor
    """(M, H, W, 3) uint8: the first frame of the episode each state comes from."""
    memory: torch.Tensor
    """(M, 4, H, W, 3) uint8: the 4 frames before ``current`` (the anchor repeated for first frames)."""
    current: torch.Tensor
    """(M, H, W, 3) uint8: the observation the episode starts from."""
    instructions: list[str]
    """(M) the task's instruction."""
    is_keyframe: torch.Tensor
    """(M,) bool: a KIR keyframe (True) or an episode's first frame (False)."""
    memory_actions: torch.Tensor | None = None
    """(M, 4, A) float32: the actions that produced the last 4 frames up to ``current`` (zeros for first frames); None: unknown."""

    def __len__(self) -> int:
        return len(self.instructions)

    @staticmethod
    def from_first_frames(frames: torch.Tensor, instructions: list[str]) -> InitialStates:
        """Episodes' first frames (M, H, W, 3): anchor = current = memory."""
        frames = torch.as_tensor(frames)
        memory = frames[:, None].expand(-1, MEMORY_FRAMES, -1, -1, -1).clone()
        return InitialStates(frames, memory, frames.clone(), list(instructions), torch.zeros(len(frames), dtype=torch.bool), None)

    @staticmethod
    def concat(*pools: InitialStates) -> InitialStates:
        pools = tuple(p for p in pools if len(p)) or pools[:1]
        known = [p.memory_actions for p in pools if p.memory_actions is not None]
        actions = None
        if known:  # unknown memory actions of the other pools are zeros (as for first frames)
            zeros = lambda p: torch.zeros(len(p), MEMORY_FRAMES, known[0].shape[-1])  # noqa: E731
            actions = torch.cat([p.memory_actions if p.memory_actions is not None else zeros(p) for p in pools])
        return InitialStates(
            torch.cat([p.anchors for p in pools]),
            torch.cat([p.memory for p in pools]),
            torch.cat([p.current for p in pools]),
            [text for p in pools for text in p.instructions],
            torch.cat([p.is_keyframe for p in pools]),
            actions,
        )


def initial_states_from_dataset(dataset: Any, episodes: Sequence[int] | None = None) -> InitialStates:
    """The first frame of each episode of a :class:`worldloop.data.dataset.TrajectoryDataset`."""
    frames, instructions = [], []
    for episode in dataset.episodes(list(episodes) if episodes is not None else None):
        frames.append(torch.as_tensor(np.asarray(episode.frames[0])))
        instructions.append(episode.instruction)
    if not frames:
        raise ValueError(f"dataset {getattr(dataset, 'root', '')} has no episodes to start imagined rollouts from")
    return InitialStates.from_first_frames(torch.stack(frames), instructions)


def initial_states_from_keyframes(folder: str | Path) -> InitialStates:
    """KIR keyframes written by ``worldloop kir`` (see :mod:`worldloop.data.keyframes`)."""
    from worldloop.data.keyframes import load_keyframes

    keyframes = load_keyframes(folder)
    count = len(keyframes["entries"])
    return InitialStates(
        torch.from_numpy(keyframes["anchor"]),
        torch.from_numpy(keyframes["memory"]),
        torch.from_numpy(keyframes["keyframe"]),
        [e["instruction"] for e in keyframes["entries"]],
        torch.ones(count, dtype=torch.bool),
        torch.from_numpy(keyframes["memory_actions"]).float(),
    )


class ImaginedEnv:
    """N imagined episodes, stepped in chunks by a world model and judged by a reward model."""

    def __init__(
        self,
        world_model: WorldModelLike,
        judge: Judge,
        initial_states: InitialStates,
        num_envs: int,
        group_size: int = 8,
        max_steps: int = 200,
        reward_scale: float = REWARD_SCALE,
        kir_ratio: float = 0.5,
        device: str | torch.device = "cpu",
        success_chunks: int = 1,
    ):
        image_size = int(world_model.image_size)
        judge_size = getattr(judge, "image_size", None)
        if judge_size is not None and int(judge_size) != image_size:
            raise ValueError(f"the judge reads {judge_size}x{judge_size} frames but the world model renders {image_size}x{image_size}: use a judge trained at the world model's resolution")
        pool_size = tuple(initial_states.current.shape[1:3])
        if len(initial_states) and pool_size != (image_size, image_size):
            raise ValueError(f"initial states are {pool_size} frames but the world model renders {image_size}x{image_size}")
        if num_envs % group_size != 0:
            raise ValueError(f"num_envs={num_envs} must be a multiple of group_size={group_size}")
        if max_steps % world_model.chunk_size != 0:
            raise ValueError(f"max_steps={max_steps} must be a multiple of the world model's chunk size {world_model.chunk_size}")
        self.world_model, self.judge, self.pool = world_model, judge, initial_states
        self.num_envs, self.group_size, self.max_steps = num_envs, group_size, max_steps
        self.chunk_size, self.action_dim, self.image_size = int(world_model.chunk_size), int(world_model.action_dim), image_size
        self.reward_scale, self.kir_ratio, self.device = reward_scale, kir_ratio, torch.device(device)
        self.verdicts = ChunkVerdicts(judge, success_chunks)
        self.task_names = sorted(set(initial_states.instructions))
        """The tasks are the instructions of the initial-state pool."""
        self.instructions: list[str] = []
        self._elapsed = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self._done = torch.zeros(num_envs, dtype=torch.bool, device=self.device)
        self._success_before = torch.zeros(num_envs, device=self.device)
        self.started_from_keyframe = torch.zeros(num_envs, dtype=torch.bool)
        """(N,) whether each current episode started from a KIR keyframe."""

    # ---------------------------------------------------------------------------------------- reset

    def reset(self, task_ids: Sequence[int | str], seeds: Sequence[int]) -> EnvReset:
        """Group g (envs g*G .. g*G+G-1) starts from one state of task ``task_ids[g*G]``, drawn with
        ``seeds[g*G]``: a keyframe with probability ``kir_ratio`` (when the task has any), else a first frame."""
        if len(task_ids) != self.num_envs or len(seeds) != self.num_envs:
            raise ValueError(f"reset needs {self.num_envs} task ids and seeds, got {len(task_ids)} and {len(seeds)}")
        if len(self.pool) == 0:
            raise ValueError("no initial states to start imagined episodes from (give first frames or keyframes; reset_to still works)")
        chosen = []
        for start in range(0, self.num_envs, self.group_size):
            group_tasks = {self._task_name(t) for t in task_ids[start : start + self.group_size]}
            if len(group_tasks) != 1:
                raise ValueError(f"envs {start}..{start + self.group_size - 1} form one group and must share a task, got {sorted(group_tasks)}")
            chosen.append(self._draw(group_tasks.pop(), int(seeds[start])))
        index = torch.tensor(chosen).repeat_interleave(self.group_size)
        self.started_from_keyframe = self.pool.is_keyframe[index]
        # Members of a group share the state but not the world model's noise.
        noise_seeds = [int(seeds[start]) * self.group_size + member for start in range(0, self.num_envs, self.group_size) for member in range(self.group_size)]
        pool = self.pool
        memory_actions = pool.memory_actions[index] if pool.memory_actions is not None else None
        return self._start(pool.anchors[index], pool.memory[index], pool.current[index], [pool.instructions[i] for i in index.tolist()], noise_seeds, memory_actions)

    def reset_to(self, frames: torch.Tensor, instructions: list[str], anchors: torch.Tensor | None = None, memory: torch.Tensor | None = None,
                 noise_seeds: Sequence[int] | None = None) -> EnvReset:  # fmt: skip
        """Start N episodes from given observations (e.g. the real simulator's first frames, for the
        imagination-reality gap); without ``anchors``/``memory`` the frames are also the anchors. Episode i's
        world-model noise is seeded ``noise_seeds[i]`` (default i): the same on every such start unless the seeds differ."""
        frames = torch.as_tensor(frames)
        if frames.shape != (self.num_envs, self.image_size, self.image_size, 3):
            raise ValueError(f"reset_to frames have shape {tuple(frames.shape)}; expected {(self.num_envs, self.image_size, self.image_size, 3)}")
        anchors = frames if anchors is None else anchors
        memory = anchors[:, None].expand(-1, MEMORY_FRAMES, -1, -1, -1) if memory is None else memory
        self.started_from_keyframe = torch.zeros(self.num_envs, dtype=torch.bool)
        return self._start(anchors, memory, frames, list(instructions), list(range(self.num_envs)) if noise_seeds is None else [int(seed) for seed in noise_seeds], None)

    def _start(
        self, anchors: torch.Tensor, memory: torch.Tensor, current: torch.Tensor, instructions: list[str], noise_seeds: list[int], memory_actions: torch.Tensor | None
    ) -> EnvReset:
        anchors, memory, current = (x.to(self.device) for x in (anchors, memory, current))
        # The world model's context: the anchor, then the last 4 frames up to the current one.
        recent = torch.cat([memory, current[:, None]], dim=1)  # (N, 5, H, W, 3)
        actions = memory_actions.to(self.device) if memory_actions is not None else None
        self.world_model.reset(anchors, recent[:, -MEMORY_FRAMES:], seeds=noise_seeds, memory_actions=actions)
        self.verdicts.start(recent)
        self._elapsed.zero_()
        self._done.zero_()
        self._success_before.zero_()
        self.instructions = instructions
        return EnvReset(current, list(instructions), None)

    def _task_name(self, task: int | str) -> str:
        if isinstance(task, str):
            if task not in self.task_names:
                raise ValueError(f"unknown task '{task}'; the initial states hold: {self.task_names}")
            return task
        return self.task_names[int(task)]

    def _draw(self, task: str, seed: int) -> int:
        generator = np.random.default_rng(seed)
        of_task = np.array([i for i, text in enumerate(self.pool.instructions) if text == task])
        keyframe = self.pool.is_keyframe.numpy()[of_task]
        use_keyframe = keyframe.any() and generator.random() < self.kir_ratio
        candidates = of_task[keyframe] if use_keyframe else of_task[~keyframe]
        if len(candidates) == 0:  # a task with keyframes only
            candidates = of_task
        return int(generator.choice(candidates))

    # ----------------------------------------------------------------------------------------- step

    def step(self, actions: torch.Tensor) -> EnvStep:
        check_actions(actions, self.num_envs, self.chunk_size, self.action_dim)
        active = ~self._done  # (N,)
        frames = self.world_model.step(actions.to(self.device))  # (N, K, H, W, 3) uint8
        last = self.verdicts.history[:, -1:]  # finished episodes repeat their last frame
        frames = torch.where(active[:, None, None, None, None], frames, last.expand_as(frames))
        success_now = self.verdicts.update(frames, self.instructions, active)  # (N,)
        reward = self.reward_scale * (success_now.float() - self._success_before) * active
        self._success_before = torch.maximum(self._success_before, success_now.float())

        k = torch.arange(self.chunk_size, device=self.device)
        steps_left = self.max_steps - self._elapsed  # (N,)
        truncated = active & ~success_now & (steps_left <= self.chunk_size)
        # The judge reads the chunk's end: success ends the episode at the chunk's last action,
        # the time limit at the action that reaches max_steps.
        end_index = torch.where(success_now, self.chunk_size - 1, steps_left - 1)
        ends = success_now | truncated
        done = (~active)[:, None] | (ends[:, None] & (k[None] >= end_index[:, None]))
        success = success_now[:, None] & (k[None] == self.chunk_size - 1)
        self._elapsed += torch.where(active, torch.clamp(steps_left, max=self.chunk_size), 0)
        self._done = done[:, -1]
        return EnvStep(frames, success, done, reward.float(), truncated, None)

    @property
    def elapsed_steps(self) -> torch.Tensor:
        return self._elapsed.clone()

    @property
    def success_chunks(self) -> int:
        """Consecutive chunk ends the judge must call a success (kept by ``verdicts``)."""
        return self.verdicts.success_chunks

    def close(self) -> None:
        pass

"""KIR: keyframe-initialised rollouts. Task-critical intermediate states to start imagined episodes from.

Keyframes come from two sources:

- successful demonstrations of a dataset: the moment before each gripper change (the sign of
  ``action[3]``, Meta-World's gripper command, flips) and before each contact (the first object's
  position, ``state[4:7]`` in Meta-World's observation, starts to move), up to the first success;
- with a policy: its real rollouts that failed, one state every ``FAILURE_STRIDE`` frames and
  before each of its gripper changes (the states the policy reaches and does not get out of); the
  rollouts are run here, or read from a dataset that already holds them (``kir --failures``).

"The moment before" an event at frame t is frame t - ``LEAD_FRAMES``. Each keyframe keeps the 4
frames before it (memory for the world model's context, the first frame repeated when the episode is
younger), the actions that produced the last 4 frames up to it, and its episode's first frame (the
world model's anchor).

The keyframe folder's format: :mod:`worldloop.data.keyframes`.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from worldloop.data.keyframes import MEMORY, load_keyframes, write_keyframes  # noqa: F401  (load_keyframes: re-exported)

LEAD_FRAMES = 4
"""A gripper change or contact at frame t gives the keyframe t - LEAD_FRAMES (the moment before it)."""
MAX_PER_EPISODE = 4
"""At most this many keyframes per episode (evenly chosen among the candidates)."""
FAILURE_STRIDE = 16
"""In a failed rollout, one keyframe every this many frames (plus its gripper changes)."""
GRIPPER = -1
"""Index of the gripper command in the action: the last (Meta-World: xyz delta, gripper; LIBERO: xyz, rotation, gripper)."""
OBJECT = slice(4, 7)
"""The first object's position in the state (Meta-World's 39-d observation)."""
METAWORLD_STATE_DIM = 39
"""Only Meta-World's state holds an object's position (LIBERO's is the robot's proprioception)."""
CONTACT_SPEED = 2e-3
"""Object displacement per step (simulator units) above which it counts as moved."""
SETTLE_FRAMES = 5
"""Object motion in the first frames is the scene settling, not contact."""


def gripper_changes(actions: np.ndarray) -> list[int]:
    """Frames t at which the gripper command's sign flips (t is the first action of the new sign); [] without a gripper."""
    if actions.ndim != 2 or actions.shape[1] < 2:
        return []
    sign = np.sign(actions[:, GRIPPER])
    return [int(t) for t in np.nonzero(sign[1:] * sign[:-1] < 0)[0] + 1]


def contacts(state: np.ndarray | None) -> list[int]:
    """Frames t at which the first object starts to move (after the settling frames); [] without a Meta-World state."""
    if state is None or state.shape[1] != METAWORLD_STATE_DIM:
        return []
    moving = np.linalg.norm(np.diff(state[:, OBJECT], axis=0), axis=1) > CONTACT_SPEED  # moving[t]: between t and t+1
    onsets = np.nonzero(moving[1:] & ~moving[:-1])[0] + 1
    return [int(t) for t in onsets if t >= SETTLE_FRAMES]


def choose(events: list[tuple[int, str]], lead: int, limit: int, end: int) -> list[tuple[int, str]]:
    """Events (t, reason) -> keyframes (t - lead, reason) in [4, end) (a keyframe has a full memory
    of real frames), one per frame, at most ``limit`` evenly spread."""
    frames: dict[int, str] = {}
    for t, reason in sorted(events):
        k = t - lead
        if MEMORY <= k < end and k not in frames:
            frames[k] = reason
    chosen = sorted(frames.items())
    if len(chosen) > limit:
        chosen = [chosen[i] for i in np.linspace(0, len(chosen) - 1, limit).round().astype(int)]
    return chosen


def demonstration_keyframes(episode: Any, lead: int, limit: int) -> list[tuple[int, str]]:
    """Keyframes of a successful episode (frames, actions, state, success) up to its first success; [] if it failed."""
    if not np.asarray(episode.success).any():
        return []
    first_success = int(np.argmax(episode.success))
    events = [(t, "gripper") for t in gripper_changes(episode.actions)] + [(t, "contact") for t in contacts(episode.state)]
    return choose(events, lead, limit, end=first_success + 1)


def failure_keyframes(actions: np.ndarray, length: int, lead: int, stride: int, limit: int) -> list[tuple[int, str]]:
    """Keyframes of a failed rollout: every ``stride`` frames and before each gripper change."""
    events = [(t + lead, "policy_failure") for t in range(stride, length, stride)] + [(t, "policy_failure") for t in gripper_changes(actions)]
    return choose(events, lead, limit, end=length)


def cut(frames: np.ndarray, actions: np.ndarray, k: int) -> dict[str, np.ndarray]:
    """The keyframe k of an episode with its memory frames, the actions before it and the anchor."""
    before = np.arange(k - MEMORY, k)
    memory_actions = np.where((before >= 0)[:, None], actions[np.clip(before, 0, None)], 0.0).astype(np.float32)
    return {"keyframe": frames[k], "memory": frames[np.clip(before, 0, None)], "anchor": frames[0], "memory_actions": memory_actions}


def dataset_keyframes(dataset: Any, lead: int, limit: int, failure_stride: int | None = None) -> Iterable[tuple[dict[str, Any], dict[str, np.ndarray]]]:
    """(entry, arrays) of every keyframe of every successful episode of a TrajectoryDataset. With
    ``failure_stride``, the dataset holds a policy's own real rollouts (``collect --policy``) and its
    failed episodes give the keyframes of :func:`policy_failure_keyframes`, without rolling out again."""
    for episode in dataset.episodes():
        actions = np.asarray(episode.actions)
        if np.asarray(episode.success).any():
            chosen = demonstration_keyframes(episode, lead, limit)
        else:
            chosen = failure_keyframes(actions, len(actions), lead, failure_stride, limit) if failure_stride else []
        for k, reason in chosen:
            entry = {"episode": int(episode.index), "frame": k, "reason": reason, "source": "dataset", "instruction": episode.instruction}
            yield entry, cut(np.asarray(episode.frames), actions, k)


def policy_failure_keyframes(
    policy: Any, env: Any, tasks: list[str], episodes_per_task: int, seeds: list[int], lead: int, stride: int, limit: int, temperature: float = 1.0, greedy: bool = False
):
    """Run ``policy`` in the real ``env`` (one env per episode), keep every frame, and yield the
    keyframes of its failed rollouts."""
    import torch

    from worldloop.rl.rollout import autocast, policy_device

    task_ids = [task for task in tasks for _ in range(episodes_per_task)]
    first = env.reset(task_ids, seeds)
    observation = first.frames
    frames, actions = [first.frames.cpu()[:, None]], []
    succeeded = torch.zeros(env.num_envs, dtype=torch.bool)
    with torch.no_grad():
        for _ in range(-(-env.max_steps // env.chunk_size)):
            with autocast(policy_device(policy)):
                out = policy.act(observation, list(first.instructions), temperature=temperature, greedy=greedy)
            step = env.step(out.actions.float().to(env.device))
            observation = step.frames[:, -1]
            frames.append(step.frames.cpu())
            actions.append(out.actions.float().cpu())
            succeeded |= step.success.any(dim=1).cpu()
            if bool(step.done[:, -1].all()):
                break
    video = torch.cat(frames, dim=1).numpy()  # (N, 1 + T*K, H, W, 3): frame t is before action t
    all_actions = torch.cat(actions, dim=1).numpy()  # (N, T*K, A)
    lengths = env.elapsed_steps.cpu().numpy()
    for i in np.nonzero(~succeeded.numpy())[0]:
        length = int(lengths[i])
        for k, reason in failure_keyframes(all_actions[i, :length], length, lead, stride, limit):
            entry = {"episode": int(i), "frame": k, "reason": reason, "source": "policy", "instruction": first.instructions[i]}
            yield entry, cut(video[i], all_actions[i], k)

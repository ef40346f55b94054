"""Success labels for frames and windows of recorded episodes.

The alignment, thought through once here and used by training and calibration alike:

- an episode stores ``frames[t]`` = the observation BEFORE action ``t`` and ``success[t]`` = the
  simulator's success flag AFTER action ``t``;
- so ``success[t]`` describes ``frames[t + 1]``: the labelled pairs are
  ``(frames[t], success[t - 1])`` for ``t >= 1``. ``frames[0]`` (nothing done yet) carries no
  label and is skipped; ``success[T - 1]`` describes the observation after the last action, which
  is stored only when the dataset keeps T + 1 frames (then it is used);
- consequence: when collection stops an episode at its first success
  (``sim.success_hold_steps = 0``), the one success-labelled observation is never stored and the
  data has no positive frame. Collect reward data with ``sim.success_hold_steps > 0``;
  :func:`labelled_frames` says so when it finds no positive.

A judge's window ending at frame ``t`` (frames ``t - window + 1 .. t``, the first frame repeated
where the episode is shorter) gets the label of frame ``t``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np
import torch

MAX_FRAMES = 200_000
"""Labelled frames train-reward holds in memory at most."""

NO_POSITIVE_HINT = (
    "either no episode succeeded (the scripted experts' demonstrations do: worldloop collect --policy expert), or the "
    "episodes ended at their first success and never stored the frame after it (an episode's success flag describes the "
    "frame AFTER its action): collect with sim.success_hold_steps > 0 (e.g. 10)"
)


def require_success_frames(train: "LabelledFrames", held_out: "LabelledFrames | None" = None) -> None:
    """A ValueError saying what is missing and how much was found when ``train`` has no success-labelled frame (or
    nothing but them): too few successful episodes to hold some out, or none at all."""
    def count(frames: "LabelledFrames | None") -> tuple[int, int, int]:  # (episodes, successful episodes, success frames)
        if frames is None or not len(frames):
            return 0, 0, 0
        return len(frames.episode.unique()), len(frames.episode[frames.success].unique()), int(frames.success.sum())

    (episodes, _, _), (held_episodes, held_successful, held_frames) = count(train), count(held_out)
    if train.success.all():
        raise ValueError(f"every one of the {len(train)} training frames is labelled success; failure frames are needed too")
    if train.success.any():
        return
    if held_successful:
        raise ValueError(f"the {episodes} training episodes hold no success-labelled frame; the only {held_successful} successful "
                         f"episode(s) ({held_frames} success frames) are among the {held_episodes} held out to measure the judge on: "
                         "too few successful episodes to train on some and hold out others. Collect more episodes that succeed "
                         "(a larger --episodes-per-task, or the scripted experts' demonstrations among the --dataset folders)")  # fmt: skip
    raise ValueError(f"none of the {episodes + held_episodes} episodes has a success-labelled frame: {NO_POSITIVE_HINT}")


def frame_labels(episode: Any) -> tuple[np.ndarray, np.ndarray]:
    """(frame indices t, labels success[t - 1]) of one episode, as numpy arrays."""
    num_frames, num_labels = len(episode.frames), len(episode.success)
    last = min(num_frames - 1, num_labels)  # highest labelled frame index
    times = np.arange(1, last + 1)
    labels = np.asarray(episode.success, dtype=bool)[times - 1]
    return times, labels


@dataclass
class LabelledFrames:
    """Labelled single frames gathered from many episodes, kept as uint8."""

    frames: torch.Tensor  # (N, H, W, 3) uint8
    success: torch.Tensor  # (N,) bool
    task: torch.Tensor  # (N,) long, index into ``instructions``
    episode: torch.Tensor  # (N,) long, running number of its episode in the order read (unique across datasets)
    time: torch.Tensor  # (N,) long, frame index within its episode
    instructions: list[str]

    def __len__(self) -> int:
        return len(self.success)

    @classmethod
    def cat(cls, parts: list["LabelledFrames"]) -> "LabelledFrames":
        """One set of the frames of ``parts`` (which share one instruction list); episode numbers stay unique."""
        if any(part.instructions != parts[0].instructions for part in parts):
            raise ValueError("labelled frames with different instruction lists cannot be joined")
        offsets = np.cumsum([0] + [int(part.episode.max()) + 1 if len(part) else 0 for part in parts[:-1]])
        episodes = torch.cat([part.episode + int(offset) for part, offset in zip(parts, offsets)])
        fields = [torch.cat([getattr(part, name) for part in parts]) for name in ("frames", "success", "task")]
        return cls(*fields, episodes, torch.cat([part.time for part in parts]), parts[0].instructions)

    def to(self, device: torch.device | str) -> "LabelledFrames":
        return LabelledFrames(
            self.frames.to(device),
            self.success.to(device),
            self.task.to(device),
            self.episode.to(device),
            self.time.to(device),
            self.instructions,
        )


def labelled_frames(episodes: Iterable[Any], instructions: list[str], max_frames: int = MAX_FRAMES) -> LabelledFrames:
    """Every labelled frame of ``episodes`` (up to ``max_frames``, held in memory as uint8; episodes beyond it
    are not read); ``instructions`` fixes the task indices."""
    index = {text: i for i, text in enumerate(instructions)}
    frames, success, task, episode_ids, times = [], [], [], [], []
    total = 0
    for number, episode in enumerate(episodes):
        if episode.instruction not in index:
            raise ValueError(f"episode {episode.index}: instruction '{episode.instruction}' is not among the {len(instructions)} known")
        t, labels = frame_labels(episode)
        if total + len(t) > max_frames:
            break
        frames.append(torch.as_tensor(np.asarray(episode.frames)[t]))
        success.append(torch.as_tensor(labels))
        task.append(torch.full((len(t),), index[episode.instruction], dtype=torch.long))
        episode_ids.append(torch.full((len(t),), number, dtype=torch.long))
        times.append(torch.as_tensor(t, dtype=torch.long))
        total += len(t)
    if not frames:
        raise ValueError("no labelled frames: the episodes are empty or have a single frame each")
    return LabelledFrames(
        torch.cat(frames), torch.cat(success), torch.cat(task), torch.cat(episode_ids), torch.cat(times), list(instructions)
    )


@dataclass
class WindowBatch:
    windows: torch.Tensor  # (B, window, H, W, 3) uint8
    instructions: list[str]
    success: torch.Tensor  # (B,) bool
    episode: torch.Tensor  # (B,) long
    time: torch.Tensor  # (B,) long, index of each window's last frame
    episode_success: torch.Tensor  # (B,) bool: the episode succeeded at some step


def labelled_windows(episodes: Iterable[Any], window: int, stride: int, batch_size: int) -> Iterator[WindowBatch]:
    """Windows ending at every ``stride``-th labelled frame of each episode, in batches."""
    pending: list[tuple[torch.Tensor, str, torch.Tensor, int, torch.Tensor, bool]] = []
    count = 0
    for episode in episodes:
        times, labels = frame_labels(episode)
        keep = np.arange(len(times) - 1, -1, -stride)[::-1]  # always include the last labelled frame
        times, labels = times[keep], labels[keep]
        if len(times) == 0:
            continue
        frames = torch.as_tensor(np.asarray(episode.frames))
        starts = torch.as_tensor(times)[:, None] - window + 1 + torch.arange(window)[None, :]  # (n, window)
        windows = frames[starts.clamp(min=0)]  # (n, window, H, W, 3)
        pending.append((windows, episode.instruction, torch.as_tensor(labels), int(episode.index), torch.as_tensor(times), bool(np.any(episode.success))))
        count += len(times)
        while count >= batch_size:
            batch, pending, count = _take(pending, batch_size)
            yield batch
    while count > 0:
        batch, pending, count = _take(pending, min(batch_size, count))
        yield batch


def _take(pending: list, n: int) -> tuple[WindowBatch, list, int]:
    windows, instructions, success, episode, time, episode_success = [], [], [], [], [], []
    taken, rest = 0, []
    for item in pending:
        w, text, labels, ep, times, ok = item
        if taken >= n:
            rest.append(item)
            continue
        k = min(n - taken, len(labels))
        windows.append(w[:k])
        instructions += [text] * k
        success.append(labels[:k])
        episode.append(torch.full((k,), ep, dtype=torch.long))
        time.append(times[:k])
        episode_success.append(torch.full((k,), ok, dtype=torch.bool))
        if k < len(labels):
            rest.append((w[k:], text, labels[k:], ep, times[k:], ok))
        taken += k
    batch = WindowBatch(torch.cat(windows), instructions, torch.cat(success), torch.cat(episode), torch.cat(time), torch.cat(episode_success))
    return batch, rest, sum(len(item[2]) for item in rest)

"""Synthetic episodes and tiny Qwen3-VL folders for the reward tests."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TASKS = ("reach the left target", "reach the right target")
TINY_VIDEO_SIZE = {"shortest_edge": 16 * 32 * 32, "longest_edge": 16 * 32 * 32}  # 32x32 frames: 2x2 patches


@dataclass
class FakeEpisode:
    """The fields of worldloop.data.dataset.Episode that the reward code reads."""

    frames: np.ndarray  # (T, H, W, 3) uint8, observation before action t
    success: np.ndarray  # (T,) bool, success after action t
    instruction: str
    task_index: int
    index: int


def cue_episode(index: int, task_index: int, succeed: bool, length: int = 12, size: int = 32, seed: int = 0) -> FakeEpisode:
    """A shared scene (noise background) where a white square appears at the left or the right.
    Task 0 succeeds when it is on the left, task 1 when on the right; the square appears after
    action ``length // 2`` (so it is visible from frame length // 2 + 1 on)."""
    rng = np.random.default_rng(seed * 1000 + index)
    frames = rng.integers(40, 120, size=(length, size, size, 3)).astype(np.uint8)
    side = task_index if succeed else 1 - task_index  # 0 = left, 1 = right
    appear = length // 2
    lo, hi = size // 3, size // 3 + size // 4
    columns = slice(2, 2 + size // 4) if side == 0 else slice(size - 2 - size // 4, size - 2)
    frames[appear + 1 :, lo:hi, columns] = 255
    success = np.zeros(length, dtype=bool)
    if succeed:
        success[appear:] = True
    return FakeEpisode(frames, success, TASKS[task_index], task_index, index)


def cue_episodes(count: int, seed: int = 0, length: int = 12, size: int = 32) -> list[FakeEpisode]:
    return [cue_episode(i, i % 2, (i // 2) % 2 == 0, length, size, seed) for i in range(count)]


def drop_true_token(source: Path, target: Path) -> Path:
    """Copy a Qwen3-VL folder, removing the token ' True' (and the merge building it) from its tokenizer."""
    shutil.copytree(source, target)
    path = target / "tokenizer.json"
    data = json.loads(path.read_text())
    model = data["model"]
    del model["vocab"]["ĠTrue"]
    def keeps(merge) -> bool:
        left, right = merge if isinstance(merge, list) else merge.split(" ")
        return "ĠTrue" not in (left, right, left + right)

    model["merges"] = [m for m in model["merges"] if keeps(m)]
    path.write_text(json.dumps(data))
    return target

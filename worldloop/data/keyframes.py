"""A KIR keyframe folder on disk: written by ``worldloop kir`` (:mod:`worldloop.rl.kir`), read by the imagined
environment to start episodes from.

Format of a keyframe folder ``KF`` (next to the dataset by convention, e.g. ``DATASET/keyframes``):

- ``KF/index.json``: ``{"format": "worldloop-keyframes/1", "dataset": path, "image_size": H,
  "memory_frames": 4, "action_dim": A, "counts": {reason: n}, "entries": [{"episode": int,
  "frame": int, "reason": "gripper"|"contact"|"policy_failure", "source": "dataset"|"policy",
  "instruction": str}, ...]}`` (``episode``/``frame`` index the dataset episode, or the policy
  rollout for ``source="policy"``);
- ``KF/keyframes.npz``: arrays aligned with ``entries``: ``keyframe`` (M, H, W, 3) uint8,
  ``memory`` (M, 4, H, W, 3) uint8 (frames frame-4 .. frame-1), ``anchor`` (M, H, W, 3) uint8,
  ``memory_actions`` (M, 4, A) float32 (actions frame-4 .. frame-1; zero before the episode).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np

from worldloop.utils.io import atomic_path, atomic_write_json, read_json

FORMAT = "worldloop-keyframes/1"
INDEX_FILE = "index.json"
ARRAYS_FILE = "keyframes.npz"
MEMORY = 4
"""Frames (and actions) kept before each keyframe."""


def write_keyframes(out: str | Path, items: Iterable[tuple[dict[str, Any], dict[str, np.ndarray]]], dataset: str, image_size: int, action_dim: int) -> dict[str, Any]:
    """Write (entry, arrays) pairs as ``out/index.json`` + ``out/keyframes.npz``; returns the index."""
    out = Path(out)
    entries, arrays = [], {name: [] for name in ("keyframe", "memory", "anchor", "memory_actions")}
    for entry, cut_arrays in items:
        entries.append(entry)
        for name in arrays:
            arrays[name].append(cut_arrays[name])
    if not entries:
        raise ValueError("no keyframes found: the dataset has no successful episode with a gripper change or contact (and no failed policy rollouts)")
    stacked = {name: np.stack(values) for name, values in arrays.items()}
    with atomic_path(out / ARRAYS_FILE) as tmp:
        with open(tmp, "wb") as handle:
            np.savez(handle, **stacked)
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry["reason"]] = counts.get(entry["reason"], 0) + 1
    index = {"format": FORMAT, "dataset": str(dataset), "image_size": image_size, "memory_frames": MEMORY, "action_dim": action_dim, "counts": counts, "entries": entries}
    atomic_write_json(out / INDEX_FILE, index)
    return index


def load_keyframes(folder: str | Path) -> dict[str, Any]:
    """Read a keyframe folder: the index's fields plus the arrays, checked for consistency."""
    folder = Path(folder)
    index = read_json(folder / INDEX_FILE)
    if index.get("format") != FORMAT:
        raise ValueError(f"{folder / INDEX_FILE} is not a worldloop keyframe index (format {index.get('format')!r}, expected {FORMAT!r})")
    path = folder / ARRAYS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the keyframe folder is incomplete")
    with np.load(path) as data:
        arrays = {name: data[name] for name in ("keyframe", "memory", "anchor", "memory_actions")}
    count = len(index["entries"])
    for name, array in arrays.items():
        if len(array) != count:
            raise ValueError(f"{path}: '{name}' holds {len(array)} keyframes but {INDEX_FILE} lists {count}")
    return index | arrays

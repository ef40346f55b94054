"""Read any LeRobot v3.0 dataset as whole episodes of uint8 frames, actions, success and text.

Works on datasets written by :class:`worldloop.data.writer.DatasetWriter` and on datasets recorded
with LeRobot itself (several episodes per data/video file, image or video cameras, no success
labels). Decoded frames are cached on disk as ``.npy`` files (written atomically), keyed by the
source video's path, size and modification time, so the second read of an episode is a plain
file read and a changed source is decoded again.
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from worldloop.data import lerobot_format as fmt
from worldloop.data.video import read_mp4
from worldloop.utils.io import atomic_path, read_json


@dataclass
class Episode:
    """One episode. Row t pairs the observation before action t with that action."""

    frames: np.ndarray
    """(T, H, W, 3) uint8: the camera frame before action t."""
    actions: np.ndarray
    """(T, A) float32: the action taken at step t."""
    state: np.ndarray | None
    """(T, S) float32 proprioceptive state before action t, or None when the dataset has none."""
    success: np.ndarray
    """(T,) bool: the task's success signal after action t (all False when the dataset has no labels)."""
    instruction: str
    """The English task instruction."""
    task_index: int
    """Row of the instruction in the dataset's tasks table."""
    index: int
    """The episode_index in the dataset."""
    info: dict[str, Any] = field(default_factory=dict)
    """worldloop's per-episode extras (plan ``key``, ``seed``, ``noisy``, ...); empty for other datasets."""

    def __len__(self) -> int:
        return len(self.actions)


class TrajectoryDataset:
    """A LeRobot v3.0 dataset folder, episode by episode.

    ``camera_key`` picks the camera among the video/image features (default: ``observation.image``
    when present, otherwise the first camera). ``cache_dir`` holds decoded frames (default
    ``root/.cache/frames``, or a per-user cache when ``root`` is read-only). ``mmap=True`` returns
    frames as read-only memory maps instead of arrays in memory.
    """

    def __init__(
        self,
        root: str | Path,
        camera_key: str | None = None,
        cache_dir: str | Path | None = None,
        mmap: bool = False,
        action_key: str = fmt.ACTION_KEY,
        state_key: str = fmt.STATE_KEY,
        success_key: str = fmt.SUCCESS_KEY,
    ):
        self.root = Path(root)
        info_path = self.root / fmt.INFO_PATH
        if not self.root.is_dir():
            raise FileNotFoundError(f"dataset folder {self.root} does not exist")
        if not info_path.is_file():
            raise FileNotFoundError(f"{self.root} is not a LeRobot dataset: {info_path} is missing")
        self.info = read_json(info_path)
        version = self.info.get("codebase_version")
        if version != fmt.CODEBASE_VERSION:
            raise ValueError(
                f"{info_path}: codebase_version is {version!r}; worldloop reads LeRobot {fmt.CODEBASE_VERSION} datasets "
                "(convert older ones with LeRobot's convert_dataset_v21_to_v30)"
            )
        self.features: dict[str, Any] = self.info.get("features", {})
        cameras = [k for k, f in self.features.items() if f.get("dtype") in ("video", "image")]
        if camera_key is None:
            if not cameras:
                raise ValueError(f"{info_path} has no video or image feature; features: {sorted(self.features)}")
            camera_key = fmt.IMAGE_KEY if fmt.IMAGE_KEY in cameras else cameras[0]
        elif camera_key not in cameras:
            raise ValueError(f"{info_path}: camera '{camera_key}' is not a video/image feature; cameras: {cameras}")
        if action_key not in self.features:
            raise ValueError(f"{info_path}: missing feature '{action_key}'; features: {sorted(self.features)}")
        self.camera_key, self.cameras = camera_key, cameras
        self.action_key = action_key
        self.state_key = state_key if state_key in self.features else None
        self.success_key = success_key if success_key in self.features else None
        self.is_video = self.features[camera_key]["dtype"] == "video"
        self.mmap = mmap

        self.fps = int(self.info["fps"])
        height, width = self.features[camera_key]["shape"][:2]
        if self.features[camera_key].get("names", [None])[0] in ("channels", "channel"):
            height, width = self.features[camera_key]["shape"][1:3]  # (C, H, W) order
        self.frame_shape = (int(height), int(width))
        self.image_size = int(height)
        self.action_dim = int(np.prod(self.features[action_key]["shape"]))
        self.state_dim = int(np.prod(self.features[self.state_key]["shape"])) if self.state_key else None
        self.tasks = fmt.read_tasks(self.root / fmt.TASKS_PATH)
        self._rows = self._read_episodes()
        self.num_episodes = len(self._rows)
        self._tables: dict[Path, Any] = {}
        self.cache_dir = self._choose_cache_dir(cache_dir)

    # ----------------------------------------------------------------------------------------
    # Public API

    def __len__(self) -> int:
        return self.num_episodes

    @property
    def lengths(self) -> list[int]:
        return [int(r["length"]) for r in self._rows]

    @property
    def task_indices(self) -> list[int]:
        """task_index of every episode (its first task)."""
        return [self.tasks.index(r["tasks"][0]) if r["tasks"][0] in self.tasks else -1 for r in self._rows]

    def episode_info(self, i: int) -> dict[str, Any]:
        """worldloop's extras of episode ``i`` (``key``, ``seed``, ``noisy``, ``success``); empty elsewhere."""
        row = self._row(i)
        return {k[len(fmt.WORLDLOOP_PREFIX) :]: v for k, v in row.items() if k.startswith(fmt.WORLDLOOP_PREFIX)}

    def episode(self, i: int) -> Episode:
        row = self._row(i)
        table = self._episode_table(row)
        length = int(row["length"])
        actions = _column(table, self.action_key, np.float32).reshape(length, -1)
        state = _column(table, self.state_key, np.float32).reshape(length, -1) if self.state_key else None
        success = _column(table, self.success_key, bool).reshape(length) if self.success_key else np.zeros(length, bool)
        task_index = int(table.column("task_index")[0].as_py()) if "task_index" in table.column_names else 0
        instruction = self.tasks[task_index] if 0 <= task_index < len(self.tasks) else row["tasks"][0]
        return Episode(
            frames=self.frames(i, table=table),
            actions=actions,
            state=state,
            success=success,
            instruction=instruction,
            task_index=task_index,
            index=int(row["episode_index"]),
            info=self.episode_info(i),
        )

    def episodes(self, indices: Sequence[int] | None = None) -> Iterator[Episode]:
        for i in range(self.num_episodes) if indices is None else indices:
            yield self.episode(i)

    def frames(self, i: int, table: Any = None) -> np.ndarray:
        """(T, H, W, 3) uint8 frames of episode ``i``, decoded once and then read from the cache."""
        row = self._row(i)
        length = int(row["length"])
        source = self._frame_source(row)
        tag = f"{self.camera_key}|{source}|{row.get(f'videos/{self.camera_key}/from_timestamp')}|{length}"
        try:
            stat = source.stat()
            tag += f"|{stat.st_size}|{stat.st_mtime_ns}"
        except FileNotFoundError:
            pass  # decoding below names the missing file
        digest = hashlib.sha1(tag.encode()).hexdigest()[:16]
        stem = f"{_safe(self.camera_key)}-ep{int(row['episode_index']):06d}"
        cached = self.cache_dir / f"{stem}-{digest}.npy" if self.cache_dir else None
        if cached is not None and cached.is_file():
            try:
                return np.load(cached, mmap_mode="r" if self.mmap else None)
            except (ValueError, OSError):
                cached.unlink(missing_ok=True)  # a damaged cache entry is decoded again
        frames = self._decode(row, table)
        if cached is not None:
            for stale in self.cache_dir.glob(f"{stem}-*.npy"):
                if stale != cached:  # decoded from an older version of the source
                    stale.unlink(missing_ok=True)
            with atomic_path(cached) as tmp:
                with open(tmp, "wb") as handle:
                    np.save(handle, frames)
            if self.mmap:
                return np.load(cached, mmap_mode="r")
        return frames

    def warm_cache(self, workers: int = 1) -> None:
        """Decode every episode into the frame cache now, in ``workers`` processes, so that several
        jobs reading this dataset at once (SFT, world model, judge) do not each decode it."""
        if self.cache_dir is None:
            raise ValueError(f"{self.root}: no writable frame cache, nothing to warm")
        if workers <= 1:
            for i in range(self.num_episodes):
                self.frames(i)
            return
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        shares = [list(range(self.num_episodes))[w::workers] for w in range(workers)]
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            # the results are the cache files; list() re-raises a worker's error here
            list(pool.map(_decode_into_cache, [(self.root, self.camera_key, self.cache_dir, share) for share in shares if share]))

    # ----------------------------------------------------------------------------------------
    # Internals

    def _row(self, i: int) -> dict[str, Any]:
        if not 0 <= i < self.num_episodes:
            raise IndexError(f"episode {i} out of range: {self.root} has {self.num_episodes} episodes")
        return self._rows[i]

    def _read_episodes(self) -> list[dict[str, Any]]:
        folder = self.root / fmt.EPISODES_DIR
        paths = sorted(folder.glob("*/*.parquet"))
        if not paths:
            raise FileNotFoundError(f"{self.root} is not a LeRobot v3.0 dataset: no {folder}/chunk-*/file-*.parquet")
        rows = []
        for path in paths:
            table = fmt.read_parquet(path)
            keep = [c for c in table.column_names if not c.startswith("stats/")]
            rows.extend(table.select(keep).to_pylist())
        required = ["episode_index", "tasks", "length", "dataset_from_index", "dataset_to_index"]
        if self.is_video:
            required += [f"videos/{self.camera_key}/{k}" for k in ("chunk_index", "file_index", "from_timestamp")]
        required += ["data/chunk_index", "data/file_index"]
        for name in required:
            if rows and name not in rows[0]:
                raise ValueError(f"{paths[0]}: episodes table lacks column '{name}'")
        rows.sort(key=lambda r: r["episode_index"])
        # Rows beyond info.json's total_episodes belong to an episode whose commit did not finish.
        total = int(self.info.get("total_episodes", len(rows)))
        rows = [r for r in rows if r["episode_index"] < total]
        if not rows:
            raise ValueError(f"{self.root} holds no episode (info.json total_episodes={total})")
        return rows

    def _data_path(self, row: dict[str, Any]) -> Path:
        return self.root / self.info["data_path"].format(chunk_index=row["data/chunk_index"], file_index=row["data/file_index"])

    def _frame_source(self, row: dict[str, Any]) -> Path:
        if not self.is_video:
            return self._data_path(row)
        key = self.camera_key
        return self.root / self.info["video_path"].format(
            video_key=key, chunk_index=row[f"videos/{key}/chunk_index"], file_index=row[f"videos/{key}/file_index"]
        )

    def _episode_table(self, row: dict[str, Any]):
        """The data rows of one episode (data files are read once and kept)."""
        import pyarrow.compute as pc

        path = self._data_path(row)
        table = self._tables.get(path)
        if table is None:
            columns = [c for c in (self.action_key, self.state_key, self.success_key, "episode_index", "task_index", "frame_index") if c]
            if not self.is_video:
                columns.append(self.camera_key)
            table = fmt.read_parquet(path)
            missing = [c for c in columns if c not in table.column_names]
            if missing:
                raise ValueError(f"data file {path} lacks column(s) {missing}; its columns: {table.column_names}")
            table = table.select(columns)
            self._tables = {path: table}  # one file at a time: LeRobot files hold many episodes, ours one
        episode = table.filter(pc.equal(table.column("episode_index"), row["episode_index"]))
        if "frame_index" in episode.column_names:
            episode = episode.sort_by("frame_index")
        if episode.num_rows != int(row["length"]):
            raise ValueError(
                f"data file {path} holds {episode.num_rows} rows of episode {row['episode_index']}, the episodes table says {row['length']}; "
                "the file is truncated or does not belong to this dataset"
            )
        return episode

    def _decode(self, row: dict[str, Any], table: Any) -> np.ndarray:
        length = int(row["length"])
        if not self.is_video:
            table = table if table is not None else self._episode_table(row)
            from PIL import Image

            images = table.column(self.camera_key).to_pylist()
            return np.stack([np.asarray(Image.open(io.BytesIO(im["bytes"])).convert("RGB")) for im in images])
        path = self._frame_source(row)
        start = float(row[f"videos/{self.camera_key}/from_timestamp"])
        end = row.get(f"videos/{self.camera_key}/to_timestamp")
        frames = read_mp4(path, start_time=start, end_time=None if end is None else float(end))
        if len(frames) < length:
            raise ValueError(
                f"video file {path} yields {len(frames)} frames for episode {row['episode_index']} but the episode has {length}; "
                "the video is truncated or its timestamps are wrong"
            )
        return np.ascontiguousarray(frames[:length])

    def _choose_cache_dir(self, cache_dir: str | Path | None) -> Path | None:
        candidates = [Path(cache_dir)] if cache_dir is not None else [self.root / ".cache" / "frames"]
        if cache_dir is None:
            user = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "worldloop" / "frames"
            candidates.append(user / hashlib.sha1(str(self.root.resolve()).encode()).hexdigest()[:16])
        for folder in candidates:
            try:
                folder.mkdir(parents=True, exist_ok=True)
                if os.access(folder, os.W_OK):
                    return folder
            except OSError:
                continue
        return None  # no writable cache: decode every time


def _decode_into_cache(job: tuple[Path, str, Path, list[int]]) -> None:
    root, camera_key, cache_dir, indices = job
    dataset = TrajectoryDataset(root, camera_key=camera_key, cache_dir=cache_dir)
    for i in indices:
        dataset.frames(i)


HELD_OUT_FRACTION = 0.1
"""Share of each task's episodes that training keeps out for its held-out metrics: SFT, the VAE and the world model split
a dataset alike (same seed, same split), so eval-wm measures on episodes neither model saw."""


def split_episodes(ds: TrajectoryDataset, held_out_fraction: float = HELD_OUT_FRACTION, seed: int = 0) -> tuple[list[int], list[int]]:
    """Split episode positions into (train, held_out), per task, reproducibly.

    Each task keeps round(fraction * n) of its n episodes held out, at least one when the fraction is
    positive and the task has two or more episodes, and always at least one for training.
    """
    if not 0 <= held_out_fraction < 1:
        raise ValueError(f"held_out_fraction must be in [0, 1), got {held_out_fraction}")
    by_task: dict[int, list[int]] = {}
    for position, task in enumerate(ds.task_indices):
        by_task.setdefault(task, []).append(position)
    rng = np.random.default_rng(seed)
    train, held_out = [], []
    for task in sorted(by_task):
        members = list(by_task[task])
        rng.shuffle(members)
        n = len(members)
        k = int(round(held_out_fraction * n))
        if held_out_fraction > 0 and n >= 2:
            k = max(k, 1)
        k = min(k, n - 1)
        held_out.extend(members[:k])
        train.extend(members[k:])
    return sorted(train), sorted(held_out)


def _column(table: Any, name: str, dtype: Any) -> np.ndarray:
    column = table.column(name).combine_chunks()
    import pyarrow as pa

    if pa.types.is_fixed_size_list(column.type) or pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        values = column.flatten().to_numpy(zero_copy_only=False)
    else:
        values = column.to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=dtype)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)

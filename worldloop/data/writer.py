"""Write trajectories as a LeRobot v3.0 dataset, one atomically committed episode at a time.

Crash safety drives the design. Each episode gets its own data file and video file
(``data/chunk-CCC/file-FFF.parquet``, ``videos/<key>/chunk-CCC/file-FFF.mp4``, allowed by v3).
``add_episode`` commits in this order, every file through a temporary name and one rename:

    1. the video file, 2. the data file,
    3. meta/tasks.parquet (when the task is new), meta/stats.json, meta/episodes/...parquet,
    4. meta/info.json — the commit point: its ``total_episodes`` says which episodes exist.

A kill at any moment therefore leaves a dataset whose info.json names only complete episodes.
What a kill can leave behind is harmless to readers: temporary files (hidden names that neither
LeRobot's ``data/*/*.parquet`` glob nor our reader match), or a data/video file of the
uncommitted next episode (LeRobot reads ``total_frames`` rows only, and these rows come after
them). Opening the folder again with :class:`DatasetWriter` (what a resumed ``collect`` does)
removes such orphans and rewrites the derived meta files from the committed episodes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from worldloop.data import lerobot_format as fmt
from worldloop.data.video import video_codec, write_mp4
from worldloop.utils.io import atomic_path, atomic_write_json, read_json
from worldloop.utils.runfolder import LOCK_NAME, FolderLock  # noqa: F401  (LOCK_NAME: the lock file's name, for readers)


class DatasetWriter:
    """Append episodes to a LeRobot v3.0 dataset at ``root`` (created, or reopened to resume).

    Reopening an existing dataset checks that fps, image size, camera key, action and state
    dimensions match and raises ValueError naming the first mismatch otherwise. Only one writer may
    hold a folder at a time (an advisory lock file).
    """

    def __init__(
        self,
        root: str | Path,
        fps: int,
        image_size: int,
        action_dim: int,
        state_dim: int | None = None,
        image_key: str = fmt.IMAGE_KEY,
        chunks_size: int = fmt.DEFAULT_CHUNKS_SIZE,
        crf: int = 18,
    ):
        self.root = Path(root)
        self.fps, self.image_size, self.action_dim, self.state_dim = int(fps), int(image_size), int(action_dim), state_dim
        self.image_key, self.chunks_size, self.crf = image_key, int(chunks_size), int(crf)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = FolderLock(self.root).acquire()

        self.info = self._new_info()
        self.tasks: list[str] = []
        self.episodes: list[dict[str, Any]] = []  # one row of the episodes table per committed episode
        self._episode_stats: list[dict[str, dict[str, np.ndarray]]] = []
        if (self.root / fmt.INFO_PATH).exists():
            self._reopen()
        self._remove_orphans()

    # ----------------------------------------------------------------------------------------
    # Public API

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    @property
    def num_frames(self) -> int:
        return int(self.episodes[-1]["dataset_to_index"]) if self.episodes else 0

    def completed_keys(self) -> set[str]:
        """The ``key`` of every committed episode (what a resumed collection skips)."""
        return {row[fmt.WORLDLOOP_PREFIX + "key"] for row in self.episodes if row.get(fmt.WORLDLOOP_PREFIX + "key")}

    def episode_rows(self) -> list[dict[str, Any]]:
        """The committed episodes table, one dict per episode (stats columns left out)."""
        return [{k: v for k, v in row.items() if not k.startswith("stats/")} for row in self.episodes]

    def add_episode(
        self,
        frames: np.ndarray,
        actions: np.ndarray,
        success: np.ndarray,
        instruction: str,
        state: np.ndarray | None = None,
        key: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> int:
        """Commit one episode; returns its episode_index.

        frames (T, H, W, 3) uint8: the observation before each action; actions (T, A) float;
        success (T,) bool: the success signal after each action; state (T, S) float when the
        dataset has a state. ``key`` identifies the episode for resuming (e.g. a plan id);
        ``extra`` holds scalars (int, float, bool, str) kept in the episodes table as
        ``worldloop/<name>`` columns.
        """
        frames, actions, success, state = self._check_episode(frames, actions, success, state, instruction)
        length = len(frames)
        episode_index = self.num_episodes
        chunk_index, file_index = fmt.episode_location(episode_index, self.chunks_size)
        if instruction not in self.tasks:
            self.tasks.append(instruction)
            new_task = True
        else:
            new_task = False
        task_index = self.tasks.index(instruction)
        start = self.num_frames

        # 1. video, 2. data: complete files under their final names, not yet referenced by the meta.
        video_path = self.root / fmt.VIDEO_PATH.format(video_key=self.image_key, chunk_index=chunk_index, file_index=file_index)
        write_mp4(video_path, frames, self.fps, crf=self.crf)
        columns = self._frame_columns(actions, success, state, episode_index, task_index, start)
        data_path = self.root / fmt.DATA_PATH.format(chunk_index=chunk_index, file_index=file_index)
        _write_parquet(data_path, _frames_table(columns, self.info["features"]))

        # 3. derived meta, 4. info.json last.
        stats = self._episode_stats_of(frames, columns)
        row: dict[str, Any] = {
            "episode_index": episode_index,
            "tasks": [instruction],
            "length": length,
            "data/chunk_index": chunk_index,
            "data/file_index": file_index,
            "dataset_from_index": start,
            "dataset_to_index": start + length,
            f"videos/{self.image_key}/chunk_index": chunk_index,
            f"videos/{self.image_key}/file_index": file_index,
            f"videos/{self.image_key}/from_timestamp": 0.0,
            f"videos/{self.image_key}/to_timestamp": length / self.fps,
            "meta/episodes/chunk_index": 0,
            "meta/episodes/file_index": 0,
            fmt.WORLDLOOP_PREFIX + "key": key or "",
            fmt.WORLDLOOP_PREFIX + "success": bool(success.any()),
        }
        for name, value in (extra or {}).items():
            if not isinstance(value, (bool, int, float, str)):
                raise TypeError(f"extra['{name}'] must be a bool, int, float or str, got {type(value).__name__}")
            row[fmt.WORLDLOOP_PREFIX + name] = value
        row.update(fmt.flatten_stats(stats))
        self.episodes.append(row)
        self._episode_stats.append(stats)
        try:
            self._write_meta(tasks_changed=new_task)
        except BaseException:
            # Not committed: forget it in memory too (its files are orphans for the next open).
            self.episodes.pop()
            self._episode_stats.pop()
            if new_task:
                self.tasks.pop()
            raise
        return episode_index

    def close(self) -> None:
        self._lock.release()

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.release()

    # ----------------------------------------------------------------------------------------
    # Layout

    def _features(self) -> dict[str, Any]:
        features: dict[str, Any] = {
            self.image_key: fmt.video_feature(self.image_size, self.image_size, self.fps, video_codec()),
        }
        if self.state_dim:
            features[fmt.STATE_KEY] = fmt.vector_feature(self.state_dim, "state")
        features[fmt.ACTION_KEY] = fmt.vector_feature(self.action_dim, "action")
        features[fmt.SUCCESS_KEY] = {"dtype": "bool", "shape": [1], "names": None}
        features.update({k: dict(v) for k, v in fmt.INDEX_FEATURES.items()})
        return features

    def _new_info(self) -> dict[str, Any]:
        return {
            "codebase_version": fmt.CODEBASE_VERSION,
            "robot_type": "sawyer",
            "total_episodes": 0,
            "total_frames": 0,
            "total_tasks": 0,
            "chunks_size": self.chunks_size,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200,
            "fps": self.fps,
            "splits": {},
            "data_path": fmt.DATA_PATH,
            "video_path": fmt.VIDEO_PATH,
            "features": self._features(),
        }

    def _frame_columns(self, actions, success, state, episode_index: int, task_index: int, start: int) -> dict[str, np.ndarray]:
        length = len(actions)
        columns: dict[str, np.ndarray] = {}
        if self.state_dim:
            columns[fmt.STATE_KEY] = state
        columns[fmt.ACTION_KEY] = actions
        columns[fmt.SUCCESS_KEY] = success
        columns["timestamp"] = (np.arange(length) / self.fps).astype(np.float32)
        columns["frame_index"] = np.arange(length, dtype=np.int64)
        columns["episode_index"] = np.full(length, episode_index, dtype=np.int64)
        columns["index"] = np.arange(start, start + length, dtype=np.int64)
        columns["task_index"] = np.full(length, task_index, dtype=np.int64)
        return columns

    def _episode_stats_of(self, frames: np.ndarray, columns: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
        stats = {self.image_key: fmt.image_stats(frames)}
        for name, values in columns.items():
            values = values.reshape(len(values), -1) if values.ndim > 1 else values.reshape(-1, 1)
            stats[name] = fmt.array_stats(values, axis=(0,))
        return stats

    def _check_episode(self, frames, actions, success, state, instruction):
        frames = np.asarray(frames)
        length = len(frames)
        size = self.image_size
        if frames.dtype != np.uint8 or frames.shape[1:] != (size, size, 3) or length == 0:
            raise ValueError(f"frames must be uint8 (T, {size}, {size}, 3) with T >= 1, got {frames.dtype} {frames.shape}")
        actions = np.asarray(actions, dtype=np.float32)
        if actions.shape != (length, self.action_dim):
            raise ValueError(f"actions must have shape (T, A) = ({length}, {self.action_dim}), got {actions.shape}")
        success = np.asarray(success, dtype=bool).reshape(-1)
        if success.shape != (length,):
            raise ValueError(f"success must have shape (T,) = ({length},), got {success.shape}")
        if self.state_dim:
            if state is None:
                raise ValueError(f"this dataset has observation.state of dimension {self.state_dim}; add_episode got state=None")
            state = np.asarray(state, dtype=np.float32)
            if state.shape != (length, self.state_dim):
                raise ValueError(f"state must have shape (T, S) = ({length}, {self.state_dim}), got {state.shape}")
        elif state is not None:
            raise ValueError("this dataset has no observation.state (state_dim=None) but add_episode got a state")
        if not isinstance(instruction, str) or not instruction:
            raise ValueError(f"instruction must be a non-empty string, got {instruction!r}")
        return frames, actions, success, state

    # ----------------------------------------------------------------------------------------
    # Meta files and recovery

    def _write_meta(self, tasks_changed: bool) -> None:
        if tasks_changed or not (self.root / fmt.TASKS_PATH).exists():
            _write_parquet(self.root / fmt.TASKS_PATH, fmt.tasks_table(self.tasks))
        atomic_write_json(self.root / fmt.STATS_PATH, fmt.stats_to_json(fmt.aggregate_stats(self._episode_stats)))
        _write_parquet(self.root / fmt.EPISODES_PATH.format(chunk_index=0, file_index=0), _episodes_table(self.episodes))
        self.info.update(
            total_episodes=self.num_episodes,
            total_frames=self.num_frames,
            total_tasks=len(self.tasks),
            splits={"train": f"0:{self.num_episodes}"},
        )
        atomic_write_json(self.root / fmt.INFO_PATH, self.info)

    def _reopen(self) -> None:
        """Load the committed episodes of an existing dataset (info.json's count is the truth)."""
        info = read_json(self.root / fmt.INFO_PATH)
        expected = self._new_info()
        if info.get("codebase_version") != fmt.CODEBASE_VERSION:
            raise ValueError(f"{self.root} holds a dataset of codebase_version {info.get('codebase_version')!r}; can only append to {fmt.CODEBASE_VERSION}")
        if info.get("fps") != self.fps:
            raise ValueError(f"{self.root} was written at fps={info.get('fps')}; this writer has fps={self.fps}")
        for name, feature in expected["features"].items():
            have = info.get("features", {}).get(name)
            if have is None or list(have.get("shape", [])) != list(feature["shape"]) or have.get("dtype") != feature["dtype"]:
                got = None if have is None else (have.get("dtype"), have.get("shape"))
                raise ValueError(
                    f"{self.root} is incompatible with this writer: feature '{name}' is {got} there, expected ({feature['dtype']}, {feature['shape']})"
                )
        extra = set(info.get("features", {})) - set(expected["features"])
        if extra:
            raise ValueError(f"{self.root} has features {sorted(extra)} that this writer does not write")
        total = int(info.get("total_episodes", 0))
        self.chunks_size = int(info.get("chunks_size", self.chunks_size))
        self.info = {**expected, **{k: v for k, v in info.items() if k != "features"}, "features": info["features"]}
        if total == 0:
            return
        table = fmt.read_parquet(self.root / fmt.EPISODES_PATH.format(chunk_index=0, file_index=0))
        rows = sorted(table.to_pylist(), key=lambda r: r["episode_index"])
        if len(rows) < total:
            raise ValueError(f"{self.root / fmt.EPISODES_PATH.format(chunk_index=0, file_index=0)} lists {len(rows)} episodes but info.json says {total}")
        self.episodes = rows[:total]  # rows past total_episodes were never committed
        self.tasks = fmt.read_tasks(self.root / fmt.TASKS_PATH)
        self._episode_stats = [fmt.unflatten_stats(r) for r in self.episodes]
        for row in self.episodes:
            for task in row["tasks"]:
                if task not in self.tasks:
                    raise ValueError(f"{self.root}: episode {row['episode_index']} has task {task!r} missing from {fmt.TASKS_PATH}")
        used = {t for row in self.episodes for t in row["tasks"]}
        # Tasks written for an episode that never committed sit at the end; drop them.
        num_tasks = len(self.tasks)
        while self.tasks and self.tasks[-1] not in used:
            self.tasks.pop()
        if len(rows) > total or len(self.tasks) < num_tasks:  # an interrupted commit: rewrite the derived meta
            self._write_meta(tasks_changed=True)

    def _remove_orphans(self) -> None:
        """Delete temporary files and data/video files that no committed episode references."""
        keep = set()
        for row in self.episodes:
            keep.add(self.root / fmt.DATA_PATH.format(chunk_index=row["data/chunk_index"], file_index=row["data/file_index"]))
            keep.add(
                self.root
                / fmt.VIDEO_PATH.format(
                    video_key=self.image_key,
                    chunk_index=row[f"videos/{self.image_key}/chunk_index"],
                    file_index=row[f"videos/{self.image_key}/file_index"],
                )
            )
        for folder in (self.root / "data", self.root / "videos", self.root / "meta"):
            if not folder.is_dir():
                continue
            for path in folder.rglob("*"):
                if not path.is_file():
                    continue
                temporary = path.name.startswith(".") and path.name.endswith(".tmp")
                orphan = folder.name != "meta" and path.suffix in (".parquet", ".mp4") and path not in keep
                if temporary or orphan:
                    path.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------
# Parquet tables


def _write_parquet(path: Path, table) -> None:
    import pyarrow.parquet as pq

    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="snappy")


def _frames_table(columns: dict[str, np.ndarray], features: dict[str, Any]):
    """Per-frame rows with the arrow types LeRobot's loader expects (vectors as fixed-size lists)."""
    import pyarrow as pa

    arrays, fields = [], []
    for name, values in columns.items():
        dtype = features[name]["dtype"]
        if values.ndim == 2:
            flat = pa.array(values.reshape(-1), type=pa.from_numpy_dtype(np.dtype(dtype)))
            array = pa.FixedSizeListArray.from_arrays(flat, values.shape[1])
        else:
            array = pa.array(values, type=pa.bool_() if dtype == "bool" else pa.from_numpy_dtype(np.dtype(dtype)))
        arrays.append(array)
        fields.append(pa.field(name, array.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _episodes_table(rows: list[dict[str, Any]]):
    import pyarrow as pa

    names: list[str] = []
    for row in rows:
        names.extend(k for k in row if k not in names)
    return pa.Table.from_pydict({name: [row.get(name) for row in rows] for name in names})

"""The LeRobot v3.0 dataset layout: paths, feature descriptions and statistics.

A dataset is a folder::

    meta/info.json                               codebase_version "v3.0", fps, features, path templates, totals
    meta/tasks.parquet                           one row per task: the instruction (index) and task_index
    meta/episodes/chunk-000/file-000.parquet     one row per episode: length, tasks, where its rows and video lie, stats
    meta/stats.json                              statistics of every feature over the whole dataset
    data/chunk-CCC/file-FFF.parquet              one row per frame: state, action, next.success, indices, timestamp
    videos/<camera key>/chunk-CCC/file-FFF.mp4   the camera's frames, H.264

Both the writer and the reader use the helpers here, so that they agree on every name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

CODEBASE_VERSION = "v3.0"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
DEFAULT_CHUNKS_SIZE = 1000

IMAGE_KEY = "observation.image"
STATE_KEY = "observation.state"
ACTION_KEY = "action"
SUCCESS_KEY = "next.success"
INDEX_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
WORLDLOOP_PREFIX = "worldloop/"
"""Episode-table columns that worldloop adds (plan key, seed, ...); LeRobot ignores them."""


def video_feature(height: int, width: int, fps: int, codec: str) -> dict[str, Any]:
    return {
        "dtype": "video",
        "shape": [height, width, 3],
        "names": ["height", "width", "channels"],
        "info": {
            "video.height": height,
            "video.width": width,
            "video.codec": "h264" if codec in ("libx264", "h264") else codec,
            "video.pix_fmt": "yuv420p",
            "video.is_depth_map": False,
            "video.fps": fps,
            "video.channels": 3,
            "has_audio": False,
        },
    }


def vector_feature(dim: int, prefix: str) -> dict[str, Any]:
    return {"dtype": "float32", "shape": [dim], "names": [f"{prefix}_{i}" for i in range(dim)]}


def episode_location(episode_index: int, chunks_size: int) -> tuple[int, int]:
    """(chunk_index, file_index) of the data and video files of one episode (one file per episode)."""
    return divmod(episode_index, chunks_size)


# --------------------------------------------------------------------------------------------
# Statistics, as LeRobot keeps them: min, max, mean, std, count and a few quantiles per feature.


def array_stats(values: np.ndarray, axis: tuple[int, ...], keepdims: bool = False) -> dict[str, np.ndarray]:
    values = values.astype(np.float64)
    stats = {
        "min": values.min(axis=axis, keepdims=keepdims),
        "max": values.max(axis=axis, keepdims=keepdims),
        "mean": values.mean(axis=axis, keepdims=keepdims),
        "std": values.std(axis=axis, keepdims=keepdims),
        "count": np.array([values.shape[0]]),
    }
    quantiles = np.quantile(values, QUANTILES, axis=axis, keepdims=keepdims)
    for q, value in zip(QUANTILES, quantiles):
        stats[f"q{int(round(q * 100)):02d}"] = value
    return stats


def image_stats(frames: np.ndarray, max_samples: int = 20, max_side: int = 32) -> dict[str, np.ndarray]:
    """Per-channel stats of frames in [0, 1], shaped (3, 1, 1) like LeRobot's, estimated (as LeRobot
    does) on at most ``max_samples`` frames subsampled to at most ``max_side`` pixels a side."""
    step = max(1, -(-len(frames) // max_samples))
    stride = max(1, frames.shape[1] // max_side)
    sample = frames[::step, ::stride, ::stride].astype(np.float32) / 255.0  # (t, h, w, 3)
    stats = array_stats(sample.transpose(0, 3, 1, 2), axis=(0, 2, 3), keepdims=True)  # (1, 3, 1, 1)
    stats = {k: (v[0] if k != "count" else np.array([len(frames)])) for k, v in stats.items()}
    return stats


def aggregate_stats(per_episode: list[dict[str, dict[str, np.ndarray]]]) -> dict[str, dict[str, np.ndarray]]:
    """Combine per-episode stats: exact min/max/mean/std, count-weighted quantiles (approximate)."""
    combined: dict[str, dict[str, np.ndarray]] = {}
    keys = sorted({k for stats in per_episode for k in stats})
    for key in keys:
        parts = [stats[key] for stats in per_episode if key in stats]
        counts = np.array([float(np.asarray(p["count"]).reshape(-1)[0]) for p in parts])
        weights = (counts / counts.sum()).reshape((-1,) + (1,) * np.asarray(parts[0]["mean"]).ndim)
        means = np.stack([np.asarray(p["mean"], dtype=np.float64) for p in parts])
        mean = (weights * means).sum(0)
        second = (weights * (np.stack([np.asarray(p["std"], dtype=np.float64) for p in parts]) ** 2 + (means - mean) ** 2)).sum(0)
        out = {
            "min": np.min(np.stack([np.asarray(p["min"]) for p in parts]), axis=0),
            "max": np.max(np.stack([np.asarray(p["max"]) for p in parts]), axis=0),
            "mean": mean,
            "std": np.sqrt(np.maximum(second, 0.0)),
            "count": np.array([int(counts.sum())]),
        }
        for name in parts[0]:
            if name.startswith("q") and all(name in p for p in parts):
                out[name] = (weights * np.stack([np.asarray(p[name], dtype=np.float64) for p in parts])).sum(0)
        combined[key] = out
    return combined


def stats_to_json(stats: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    return {k: {name: np.asarray(v).tolist() for name, v in s.items()} for k, s in stats.items()}


def flatten_stats(stats: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    """{"stats/<feature>/<stat>": list} columns of the episodes table."""
    return {f"stats/{k}/{name}": np.asarray(v).tolist() for k, s in stats.items() for name, v in s.items()}


def unflatten_stats(row: dict[str, Any]) -> dict[str, dict[str, np.ndarray]]:
    stats: dict[str, dict[str, np.ndarray]] = {}
    for column, value in row.items():
        if column.startswith("stats/") and value is not None:
            feature, _, name = column[len("stats/") :].rpartition("/")
            stats.setdefault(feature, {})[name] = np.asarray(value)
    return stats


# --------------------------------------------------------------------------------------------
# meta/tasks.parquet: LeRobot writes it with pandas, the task string as the row index. We write the
# same bytes with pyarrow alone (pandas metadata included, so pandas restores the index).


def tasks_table(tasks: list[str]):
    import pyarrow as pa

    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object", "metadata": {"encoding": "UTF-8"}}],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64", "metadata": None},
            {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.0",
    }
    schema = pa.schema([("task_index", pa.int64()), ("task", pa.string())], metadata={b"pandas": json.dumps(pandas_meta).encode()})
    return pa.table({"task_index": list(range(len(tasks))), "task": tasks}, schema=schema)


def read_tasks(path: Path) -> list[str]:
    """Instructions ordered by task_index, from a tasks.parquet written by us, LeRobot or pandas."""
    table = read_parquet(path)
    names = table.column_names
    meta = table.schema.metadata or {}
    text_column = None
    if b"pandas" in meta:
        index_columns = [c for c in json.loads(meta[b"pandas"]).get("index_columns", []) if isinstance(c, str)]
        text_column = index_columns[0] if index_columns else None
    if text_column is None:
        text_column = next((c for c in ("task", "__index_level_0__") if c in names), None)
    if text_column is None or "task_index" not in names:
        raise ValueError(f"{path} has columns {names}; expected 'task_index' and the task text (column 'task' or the pandas index)")
    order = table.column("task_index").to_pylist()
    texts = table.column(text_column).to_pylist()
    tasks = [""] * len(order)
    for i, text in zip(order, texts):
        if not 0 <= i < len(order):
            raise ValueError(f"{path}: task_index {i} out of range 0..{len(order) - 1}")
        tasks[i] = text
    return tasks


def read_parquet(path: Path, columns: list[str] | None = None):
    """Read a parquet file, naming it when it is missing, truncated or corrupt."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"parquet file {path} does not exist")
    try:
        return pq.read_table(path, columns=columns)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as error:
        raise ValueError(f"parquet file {path} is truncated or corrupt ({error})") from error
    except KeyError as error:
        raise ValueError(f"parquet file {path} lacks column {error}") from error

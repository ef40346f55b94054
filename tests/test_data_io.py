"""Video files, the LeRobot v3.0 writer and the reader: round trips, other people's datasets, bad files."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from worldloop.data import lerobot_format as fmt
from worldloop.data.dataset import TrajectoryDataset, split_episodes
from worldloop.data.video import read_mp4, write_mp4
from worldloop.data.writer import DatasetWriter

SIZE = 32


def smooth_frames(length: int, seed: int, size: int = SIZE) -> np.ndarray:
    """Frames a video codec can hold well: moving gradients, different per seed."""
    y, x = np.mgrid[0:size, 0:size] / size
    t = np.arange(length)[:, None, None] / 10
    channels = [np.sin(2 * x + t + seed), np.cos(2 * y - t + 2 * seed), np.sin(1.5 * (x + y) + 0.5 * t)]
    return ((np.stack(channels, -1) * 0.5 + 0.5) * 255).astype(np.uint8)


def random_episode(rng: np.random.Generator, length: int, seed: int, success_at: int | None):
    success = np.zeros(length, bool)
    if success_at is not None:
        success[success_at:] = True
    return {
        "frames": smooth_frames(length, seed),
        "actions": rng.uniform(-1, 1, (length, 4)).astype(np.float32),
        "success": success,
        "state": rng.standard_normal((length, 39)).astype(np.float32),
    }


@pytest.fixture
def written(tmp_path):
    rng = np.random.default_rng(0)
    episodes = [random_episode(rng, 12 + 5 * i, i, 10 + 5 * i if i != 1 else None) for i in range(3)]
    instructions = ["open the drawer", "push the puck", "open the drawer"]
    root = tmp_path / "ds"
    with DatasetWriter(root, fps=10, image_size=SIZE, action_dim=4, state_dim=39) as writer:
        for i, (episode, text) in enumerate(zip(episodes, instructions)):
            writer.add_episode(instruction=text, key=f"k{i}", extra={"seed": i}, **episode)
    return root, episodes, instructions


def test_video_round_trip_and_time_window(tmp_path):
    frames = smooth_frames(30, 0)
    path = tmp_path / "v.mp4"
    write_mp4(path, frames, fps=10)
    decoded = read_mp4(path)
    assert decoded.shape == frames.shape and decoded.dtype == np.uint8
    assert np.abs(decoded.astype(int) - frames).mean() < 3.0
    window = read_mp4(path, start_time=1.0, end_time=2.0)  # frames 10..19
    assert np.array_equal(window, decoded[10:20])
    with pytest.raises(ValueError, match="uint8"):
        write_mp4(tmp_path / "bad.mp4", frames.astype(np.float32), fps=10)
    assert not (tmp_path / "bad.mp4").exists()


def test_round_trip_exact_arrays_and_codec_tolerance(written):
    root, episodes, instructions = written
    ds = TrajectoryDataset(root)
    assert (ds.num_episodes, ds.fps, ds.image_size, ds.action_dim, ds.state_dim) == (3, 10, SIZE, 4, 39)
    assert ds.tasks == ["open the drawer", "push the puck"]
    for i, (expected, text) in enumerate(zip(episodes, instructions)):
        episode = ds.episode(i)
        assert episode.index == i and episode.instruction == text and len(episode) == len(expected["actions"])
        assert np.array_equal(episode.actions, expected["actions"])
        assert np.array_equal(episode.state, expected["state"])
        assert np.array_equal(episode.success, expected["success"])
        assert episode.frames.shape == expected["frames"].shape and episode.frames.dtype == np.uint8
        assert np.abs(episode.frames.astype(int) - expected["frames"]).mean() < 3.0
        assert episode.info["key"] == f"k{i}" and episode.info["seed"] == i
    info = json.loads((root / fmt.INFO_PATH).read_text())
    assert info["codebase_version"] == "v3.0" and info["total_frames"] == sum(len(e["actions"]) for e in episodes)
    assert set(json.loads((root / fmt.STATS_PATH).read_text())) >= {"action", "observation.state", "observation.image"}


def test_decoded_frames_cache_is_used_and_invalidated(written):
    root, _, _ = written
    first = TrajectoryDataset(root).frames(0)
    cached = list((root / ".cache" / "frames").glob("*ep000000-*.npy"))
    assert len(cached) == 1
    np.save(cached[0], np.zeros_like(first))  # poison the cache: a cache hit returns zeros
    assert not TrajectoryDataset(root).frames(0).any()
    video = root / fmt.VIDEO_PATH.format(video_key=fmt.IMAGE_KEY, chunk_index=0, file_index=0)
    os.utime(video, ns=(video.stat().st_atime_ns, video.stat().st_mtime_ns + 10**9))  # the source changed
    assert np.array_equal(TrajectoryDataset(root).frames(0), first)


def test_warm_cache_decodes_every_episode_once_in_worker_processes(written, tmp_path):
    root, _, _ = written
    expected = [TrajectoryDataset(root, cache_dir=tmp_path / "reference").frames(i) for i in range(3)]
    dataset = TrajectoryDataset(root, cache_dir=tmp_path / "warm")
    dataset.warm_cache(workers=2)
    cached = sorted((tmp_path / "warm").glob("*.npy"))
    assert len(cached) == 3
    for i, frames in enumerate(expected):
        assert np.array_equal(np.load(cached[i]), frames)
        assert np.array_equal(dataset.frames(i), frames)


def test_reader_opens_a_lerobot_style_dataset(tmp_path):
    """Several episodes per data and video file (from_timestamp offsets), pandas-style tasks table,
    another camera name, a second camera, no state and no success labels."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root, fps, lengths = tmp_path / "lr", 10, [7, 9]
    camera = "observation.images.top"
    videos = [smooth_frames(n, s) for s, n in enumerate(lengths)]
    write_mp4(root / fmt.VIDEO_PATH.format(video_key=camera, chunk_index=0, file_index=0), np.concatenate(videos), fps)
    write_mp4(root / fmt.VIDEO_PATH.format(video_key="observation.images.wrist", chunk_index=0, file_index=0), np.concatenate(videos)[:, ::-1], fps)
    actions = np.random.default_rng(1).uniform(-1, 1, (sum(lengths), 6)).astype(np.float32)
    episode_index = np.repeat([0, 1], lengths)
    data = pa.table(
        {
            "action": pa.FixedSizeListArray.from_arrays(pa.array(actions.reshape(-1)), 6),
            "timestamp": pa.array(np.concatenate([np.arange(n) / fps for n in lengths]).astype(np.float32)),
            "frame_index": pa.array(np.concatenate([np.arange(n) for n in lengths])),
            "episode_index": pa.array(episode_index),
            "index": pa.array(np.arange(sum(lengths))),
            "task_index": pa.array(np.repeat([1, 0], lengths)),
        }
    )
    (root / "data/chunk-000").mkdir(parents=True)
    pq.write_table(data, root / "data/chunk-000/file-000.parquet")
    tasks = pa.table({"task_index": [0, 1], "__index_level_0__": ["stack the cups", "fold the towel"]})
    (root / "meta").mkdir()
    pq.write_table(tasks, root / fmt.TASKS_PATH)
    starts = np.cumsum([0] + lengths) / fps
    episodes = {
        "episode_index": [0, 1],
        "tasks": [["fold the towel"], ["stack the cups"]],
        "length": lengths,
        "data/chunk_index": [0, 0],
        "data/file_index": [0, 0],
        "dataset_from_index": [0, lengths[0]],
        "dataset_to_index": [lengths[0], sum(lengths)],
    }
    for key in (camera, "observation.images.wrist"):
        episodes.update({f"videos/{key}/chunk_index": [0, 0], f"videos/{key}/file_index": [0, 0]})
        episodes.update({f"videos/{key}/from_timestamp": list(starts[:2]), f"videos/{key}/to_timestamp": list(starts[1:])})
    (root / "meta/episodes/chunk-000").mkdir(parents=True)
    pq.write_table(pa.table(episodes), root / "meta/episodes/chunk-000/file-000.parquet")
    video_feature = fmt.video_feature(SIZE, SIZE, fps, "av1")
    features = {camera: video_feature, "observation.images.wrist": video_feature, "action": fmt.vector_feature(6, "a")}
    features.update(fmt.INDEX_FEATURES)
    info = {"codebase_version": "v3.0", "fps": fps, "total_episodes": 2, "features": features, "data_path": fmt.DATA_PATH, "video_path": fmt.VIDEO_PATH}
    (root / fmt.INFO_PATH).write_text(json.dumps(info))

    ds = TrajectoryDataset(root)
    assert ds.camera_key == camera and ds.state_dim is None and ds.action_dim == 6
    second = ds.episode(1)
    assert second.instruction == "stack the cups" and len(second) == lengths[1] and not second.success.any()
    assert np.array_equal(second.actions, actions[lengths[0] :])
    assert np.abs(second.frames.astype(int) - videos[1]).mean() < 3.0
    wrist = TrajectoryDataset(root, camera_key="observation.images.wrist", cache_dir=tmp_path / "cache").frames(1)
    assert np.abs(wrist.astype(int) - videos[1][:, ::-1]).mean() < 3.0
    with pytest.raises(ValueError, match="not a video/image feature"):
        TrajectoryDataset(root, camera_key="action")


def test_split_is_per_task_reproducible_and_disjoint(written):
    root, _, _ = written
    ds = TrajectoryDataset(root)
    train, held_out = split_episodes(ds, held_out_fraction=0.5, seed=3)
    assert sorted(train + held_out) == [0, 1, 2] and not set(train) & set(held_out)
    assert held_out in ([0], [2])  # the drawer task (episodes 0, 2) gives one; the single push episode stays in train
    assert split_episodes(ds, 0.5, seed=3) == (train, held_out)


def test_clear_errors_for_bad_folders(tmp_path, written):
    root, _, _ = written
    with pytest.raises(FileNotFoundError, match="not a LeRobot dataset"):
        TrajectoryDataset(tmp_path)
    old = tmp_path / "old"
    shutil.copytree(root, old)
    info = json.loads((old / fmt.INFO_PATH).read_text())
    (old / fmt.INFO_PATH).write_text(json.dumps({**info, "codebase_version": "v2.1"}))
    with pytest.raises(ValueError, match="v2.1.*v3.0"):
        TrajectoryDataset(old)
    features = {k: v for k, v in info["features"].items() if k != "action"}
    (old / fmt.INFO_PATH).write_text(json.dumps({**info, "features": features}))
    with pytest.raises(ValueError, match="missing feature 'action'"):
        TrajectoryDataset(old)


def test_truncated_parquet_and_mp4_name_the_file(tmp_path, written):
    root, _, _ = written
    broken = tmp_path / "broken"
    shutil.copytree(root, broken, ignore=shutil.ignore_patterns(".cache"))
    data_file = broken / fmt.DATA_PATH.format(chunk_index=0, file_index=1)
    data_file.write_bytes(data_file.read_bytes()[: data_file.stat().st_size // 2])
    video_file = broken / fmt.VIDEO_PATH.format(video_key=fmt.IMAGE_KEY, chunk_index=0, file_index=2)
    video_file.write_bytes(video_file.read_bytes()[: video_file.stat().st_size // 2])
    ds = TrajectoryDataset(broken)
    assert ds.episode(0).frames.shape[0] == 12  # untouched episodes still read
    with pytest.raises(ValueError, match=f"{data_file}.*truncated or corrupt"):
        ds.episode(1)
    with pytest.raises(ValueError, match=f"{video_file}.*truncated or corrupt"):
        ds.frames(2)
    episodes_file = broken / fmt.EPISODES_PATH.format(chunk_index=0, file_index=0)
    episodes_file.write_bytes(episodes_file.read_bytes()[:100])
    with pytest.raises(ValueError, match=f"{episodes_file}.*truncated or corrupt"):
        TrajectoryDataset(broken)


def test_interrupted_commit_leaves_a_readable_dataset_and_reopen_cleans_it(tmp_path, written, monkeypatch):
    root, episodes, _ = written
    import worldloop.data.writer as writer_module

    real_write_json = writer_module.atomic_write_json

    def die_on_info(path, obj):
        if Path(path).name == "info.json":
            raise KeyboardInterrupt  # killed after data, video, stats and episodes table, before the commit point
        real_write_json(path, obj)

    with pytest.raises(KeyboardInterrupt):
        with DatasetWriter(root, fps=10, image_size=SIZE, action_dim=4, state_dim=39) as writer:
            monkeypatch.setattr(writer_module, "atomic_write_json", die_on_info)
            writer.add_episode(instruction="a new task", key="k3", **episodes[0])
    monkeypatch.setattr(writer_module, "atomic_write_json", real_write_json)
    orphan = root / fmt.DATA_PATH.format(chunk_index=0, file_index=3)
    assert orphan.exists()  # the uncommitted episode's files are there ...
    ds = TrajectoryDataset(root)  # ... but the dataset reads as the 3 committed episodes
    assert ds.num_episodes == 3 and ds.tasks[:2] == ["open the drawer", "push the puck"]

    with DatasetWriter(root, fps=10, image_size=SIZE, action_dim=4, state_dim=39) as writer:
        assert not orphan.exists() and writer.completed_keys() == {"k0", "k1", "k2"}
        assert writer.add_episode(instruction="push the puck", key="k3", **episodes[1]) == 3
    ds = TrajectoryDataset(root)
    assert ds.num_episodes == 4 and ds.tasks == ["open the drawer", "push the puck"]
    assert np.array_equal(ds.episode(3).actions, episodes[1]["actions"])


def test_reopen_with_other_layout_or_bad_episode_is_refused(written):
    root, episodes, _ = written
    with pytest.raises(ValueError, match="observation.image"):
        DatasetWriter(root, fps=10, image_size=64, action_dim=4, state_dim=39)
    with DatasetWriter(root, fps=10, image_size=SIZE, action_dim=4, state_dim=39) as writer:
        bad = dict(episodes[0], actions=episodes[0]["actions"][:, :3])
        with pytest.raises(ValueError, match=r"actions must have shape \(T, A\) = \(12, 4\)"):
            writer.add_episode(instruction="x", **bad)
        assert writer.num_episodes == 3


def test_reader_decodes_image_features_stored_in_parquet(tmp_path):
    """LeRobot's non-video datasets keep each frame as PNG bytes in the data parquet."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    root, length = tmp_path / "img", 5
    frames = smooth_frames(length, 4)
    pngs = []
    for frame in frames:
        buffer = io.BytesIO()
        Image.fromarray(frame).save(buffer, format="PNG")
        pngs.append({"bytes": buffer.getvalue(), "path": None})
    data = pa.table(
        {
            "observation.images.cam": pngs,
            "action": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(length * 2, np.float32)), 2),
            "frame_index": np.arange(length),
            "episode_index": np.zeros(length, np.int64),
            "task_index": np.zeros(length, np.int64),
        }
    )
    (root / "data/chunk-000").mkdir(parents=True)
    pq.write_table(data, root / "data/chunk-000/file-000.parquet")
    (root / "meta/episodes/chunk-000").mkdir(parents=True)
    pq.write_table(fmt.tasks_table(["wave"]), root / fmt.TASKS_PATH)
    episodes = {"episode_index": [0], "tasks": [["wave"]], "length": [length], "data/chunk_index": [0], "data/file_index": [0]}
    episodes.update(dataset_from_index=[0], dataset_to_index=[length])
    pq.write_table(pa.table(episodes), root / "meta/episodes/chunk-000/file-000.parquet")
    image = {"dtype": "image", "shape": [SIZE, SIZE, 3], "names": ["height", "width", "channels"]}
    info = {"codebase_version": "v3.0", "fps": 5, "total_episodes": 1, "data_path": fmt.DATA_PATH, "video_path": None}
    info["features"] = {"observation.images.cam": image, "action": fmt.vector_feature(2, "a"), **fmt.INDEX_FEATURES}
    (root / fmt.INFO_PATH).write_text(json.dumps(info))

    episode = TrajectoryDataset(root).episode(0)
    assert np.array_equal(episode.frames, frames) and episode.instruction == "wave" and episode.state is None

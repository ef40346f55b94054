"""LeRobot's own LeRobotDataset opens what DatasetWriter writes (runs only where `lerobot` is installed).

worldloop does not depend on lerobot; docs/dataset-format.md gives the version and command this
was verified with.
"""

from __future__ import annotations

import numpy as np
import pytest

lerobot_dataset = pytest.importorskip("lerobot.datasets.lerobot_dataset")


def test_lerobot_opens_our_dataset_with_equal_contents(tmp_path, monkeypatch):
    from worldloop.data.dataset import TrajectoryDataset
    from worldloop.data.writer import DatasetWriter

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a local folder: never ask the hub
    rng = np.random.default_rng(0)
    root, size, written = tmp_path / "ds", 32, []
    y, x = np.mgrid[0:size, 0:size] / size
    with DatasetWriter(root, fps=20, image_size=size, action_dim=4, state_dim=39) as writer:
        for i, (length, text) in enumerate([(9, "open the drawer"), (14, "push the puck"), (11, "open the drawer")]):
            t = np.arange(length)[:, None, None] / 8
            frames = (np.stack([np.sin(2 * x + t + i), np.cos(2 * y - t), np.sin(x + y + t)], -1) * 120 + 128).astype(np.uint8)
            success = np.arange(length) == length - 1 if i != 1 else np.zeros(length, bool)
            episode = dict(frames=frames, actions=rng.uniform(-1, 1, (length, 4)), success=success, state=rng.standard_normal((length, 39)))
            writer.add_episode(instruction=text, key=f"k{i}", **episode)
            written.append((episode, text))

    theirs = lerobot_dataset.LeRobotDataset(repo_id="local/worldloop-test", root=root)
    ours = TrajectoryDataset(root)
    assert theirs.num_episodes == 3 and len(theirs) == sum(len(e["actions"]) for e, _ in written)
    assert theirs.meta.video_keys == ["observation.image"] and theirs.fps == 20
    position = 0
    for i, (episode, text) in enumerate(written):
        mine = ours.episode(i)
        for t in range(len(episode["actions"])):
            item = theirs[position]
            position += 1
            assert item["task"] == text and int(item["episode_index"]) == i and int(item["frame_index"]) == t
            np.testing.assert_array_equal(item["action"].numpy(), episode["actions"][t].astype(np.float32))
            np.testing.assert_array_equal(item["observation.state"].numpy(), episode["state"][t].astype(np.float32))
            assert bool(item["next.success"]) == bool(episode["success"][t])
            image = (item["observation.image"].permute(1, 2, 0).numpy() * 255).round()  # (3, H, W) float in [0, 1]
            assert np.abs(image - mine.frames[t]).max() <= 1  # the same decoded frame

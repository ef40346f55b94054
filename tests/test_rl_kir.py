"""KIR keyframes: gripper changes and contacts in successful demonstrations, failed policy rollouts, the folder format."""

import numpy as np
import pytest
import torch

from worldloop.cli import main
from worldloop.data.dataset import TrajectoryDataset
from worldloop.data.writer import DatasetWriter
from worldloop.envs.imagined import initial_states_from_keyframes
from worldloop.envs.toy import TARGETS, ToyEnv, render
from worldloop.rl.kir import load_keyframes, policy_failure_keyframes

LENGTH = 40


def episode(success_from: int | None, flips: tuple[int, ...], contact: int | None, seed: int):
    rng = np.random.default_rng(seed)
    frames = np.zeros((LENGTH, 32, 32, 3), np.uint8)
    for t in range(LENGTH):  # a bar that moves right: every frame differs clearly
        frames[t, :, :, 0] = 40 + 4 * t
        frames[t, 8:24, (t % 28) : (t % 28) + 4] = 255
    actions = rng.uniform(-1, 1, (LENGTH, 4)).astype(np.float32)
    gripper = -np.ones(LENGTH, np.float32)
    for t in flips:
        gripper[t:] *= -1
    actions[:, 3] = gripper
    state = np.zeros((LENGTH, 39), np.float32)
    if contact is not None:
        state[:, 4] = 0.01 * np.clip(np.arange(LENGTH) - contact, 0, None)
    success = np.zeros(LENGTH, bool)
    if success_from is not None:
        success[success_from:] = True
    return frames, actions, success, state


def test_kir_keyframes_from_successful_demonstrations(tmp_path):
    root = tmp_path / "dataset"
    with DatasetWriter(root, fps=10, image_size=32, action_dim=4, state_dim=39) as writer:
        for i, (success_from, flips, contact) in enumerate([(35, (15, 30), 20), (None, (15,), 20), (10, (25,), None)]):
            frames, actions, success, state = episode(success_from, flips, contact, i)
            writer.add_episode(frames, actions, success, "open the drawer", state=state)
    out = tmp_path / "keyframes"
    assert main(["kir", "--dataset", str(root), "--out", str(out)]) == 0

    keyframes = load_keyframes(out)
    entries = keyframes["entries"]
    # Only the successful episode 0 counts (episode 1 failed; episode 2's gripper change comes after its success).
    assert [(e["episode"], e["frame"], e["reason"]) for e in entries] == [(0, 11, "gripper"), (0, 16, "contact"), (0, 26, "gripper")]
    assert keyframes["counts"] == {"gripper": 2, "contact": 1}
    ep = TrajectoryDataset(root).episode(0)
    for i, e in enumerate(entries):
        k = e["frame"]
        assert np.array_equal(keyframes["keyframe"][i], ep.frames[k])
        assert np.array_equal(keyframes["memory"][i], ep.frames[k - 4 : k])
        assert np.array_equal(keyframes["anchor"][i], ep.frames[0])
        assert np.allclose(keyframes["memory_actions"][i], ep.actions[k - 4 : k])
    assert (out / "config.yaml").is_file()

    # --failures: the dataset's failed episode 1 (gripper flip at 15) gives policy-failure keyframes
    # every 16 frames (FAILURE_STRIDE) and before the flip (LEAD_FRAMES 4), 4 at most: events 11, 16, 32
    both = tmp_path / "with_failures"
    assert main(["kir", "--dataset", str(root), "--failures", "--out", str(both)]) == 0
    failures = [(e["episode"], e["frame"], e["source"]) for e in load_keyframes(both)["entries"] if e["reason"] == "policy_failure"]
    assert failures == [(1, 11, "dataset"), (1, 16, "dataset"), (1, 32, "dataset")]
    assert np.array_equal(load_keyframes(both)["keyframe"][-1], TrajectoryDataset(root).episode(1).frames[32])

    states = initial_states_from_keyframes(out)
    assert len(states) == 3 and states.is_keyframe.all() and states.memory.shape == (3, 4, 32, 32, 3)
    assert states.instructions == ["open the drawer"] * 3

    with pytest.raises(ValueError, match="not a worldloop keyframe index"):
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "index.json").write_text('{"format": "other"}')
        load_keyframes(tmp_path / "bad")


class Scripted:
    """Even envs steer to the target (read off the image), odd envs move away from it (-0.5, +0.5)."""

    chunk_size, action_dim, image_size = 4, 2, 32

    def act(self, images, instructions, temperature=1.0, greedy=False):
        from worldloop.envs.toy import DOT, TARGET, locate
        from worldloop.policies.protocol import ActOutput

        steer = ((locate(images, TARGET) - locate(images, DOT)) / 0.08).clamp(-1, 1)
        away = torch.tensor([-0.5, 0.5]).expand(len(images), 2)
        direction = torch.where((torch.arange(len(images)) % 2 == 0)[:, None], steer, away)
        actions = direction[:, None].expand(-1, 4, -1).clone()
        return ActOutput(actions, torch.zeros(len(images), 4, 2, dtype=torch.long), torch.zeros(len(images), 4, 2))

    def parameters(self):
        return iter([torch.zeros(1)])


def test_keyframes_of_failed_policy_rollouts():
    env = ToyEnv(6, max_steps=16)
    seeds = list(range(6))
    items = list(policy_failure_keyframes(Scripted(), env, ["reach-top-right"], 6, seeds, lead=2, stride=4, limit=3))
    assert sorted({e["episode"] for e, _ in items}) == [1, 3, 5]  # the odd envs failed
    target = torch.tensor(TARGETS["reach-top-right"])
    for entry, arrays in items:
        assert entry["reason"] == "policy_failure" and entry["source"] == "policy"
        assert entry["frame"] in (4, 8, 12)
        start = torch.tensor(np.random.default_rng(seeds[entry["episode"]]).uniform(0.15, 0.85, size=2), dtype=torch.float32)
        dot = (start + entry["frame"] * 0.08 * torch.tensor([-0.5, 0.5])).clamp(0, 1)
        assert np.array_equal(arrays["keyframe"], render(dot, target, 32).numpy())  # the state the policy was in then
        assert arrays["memory"].shape == (4, 32, 32, 3) and np.allclose(arrays["memory_actions"], [[-0.5, 0.5]] * 4)
    assert len(items) == 9

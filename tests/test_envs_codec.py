"""A real environment observed through a world model's VAE: every frame reconstructed, nothing else changed."""

from __future__ import annotations

import json

import pytest
import torch

from _worldmodel_fixtures import tiny_vae
from worldloop.envs.codec import CodecObservations
from worldloop.envs.toy import ToyEnv
from worldloop.worldmodel.vae import reconstruct


def test_frames_pass_through_the_vae_and_nothing_else_changes():
    vae = tiny_vae()
    raw, seen = ToyEnv(3, image_size=32, chunk_size=2), CodecObservations(ToyEnv(3, image_size=32, chunk_size=2), vae, batch_size=4)
    first, first_seen = raw.reset(["reach-top-right"] * 3, [0, 1, 2]), seen.reset(["reach-top-right"] * 3, [0, 1, 2])
    assert torch.equal(first_seen.frames, reconstruct(vae, first.frames)) and not torch.equal(first_seen.frames, first.frames)
    assert first_seen.instructions == first.instructions
    actions = torch.full((3, 2, 2), 0.5)
    step, step_seen = raw.step(actions), seen.step(actions)
    assert step_seen.frames.shape == step.frames.shape == (3, 2, 32, 32, 3)
    assert torch.equal(step_seen.frames, reconstruct(vae, step.frames.reshape(-1, 32, 32, 3)).reshape(step.frames.shape))
    for name in ("success", "done", "reward", "truncated"):
        assert torch.equal(getattr(step_seen, name), getattr(step, name)), name
    assert seen.num_envs == 3 and torch.equal(seen.elapsed_steps, raw.elapsed_steps)  # the rest is the simulator's


def test_eval_observes_the_simulator_through_the_world_models_vae(tmp_path):
    from _policy_fixtures import tiny_config, tiny_policy
    from worldloop.data.video import read_mp4
    from worldloop.policies import EXPERT
    from worldloop.rl.evaluate import evaluate_policy

    tiny_vae().save_pretrained(tmp_path / "wm" / "vae")
    (tmp_path / "wm" / "config.json").write_text(json.dumps({"kind": "world_model", "image_size": 64}))
    config = tiny_config("sim.num_workers=1", "sim.image_size=64", "sim.max_steps=8", "eval.greedy=true")
    policy = tiny_policy(config)
    policy.image_size = 64  # the tiny policy's encoder pools to a fixed grid, so it runs at any size
    args = dict(tasks=["reach-v3"], episodes_per_task=1, videos_per_task=1, progress=False)
    raw = evaluate_policy(policy, config, out=tmp_path / "raw", **args)
    seen = evaluate_policy(policy, config, out=tmp_path / "seen", world_model=tmp_path / "wm", **args)
    assert raw["observed_through"] is None and seen["observed_through"] == str(tmp_path / "wm")
    assert "observing the simulator through" in (tmp_path / "seen" / "results.md").read_text()
    first_raw, first_seen = read_mp4(tmp_path / "raw" / "videos" / "reach-v3_000.mp4")[0], read_mp4(tmp_path / "seen" / "videos" / "reach-v3_000.mp4")[0]
    assert (first_raw.astype(int) - first_seen.astype(int)).__abs__().mean() > 5  # the recorded frames are the ones the policy saw
    with pytest.raises(ValueError, match="scripted expert acts on the simulator's state"):
        evaluate_policy(EXPERT, config, world_model=tmp_path / "wm", **args)
    (tmp_path / "wm" / "config.json").write_text(json.dumps({"kind": "world_model", "image_size": 128}))
    with pytest.raises(ValueError, match="imagines 128x128 frames"):
        evaluate_policy(policy, config, world_model=tmp_path / "wm", **args)

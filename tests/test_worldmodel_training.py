"""World-model training at tiny size: action conditioning is learned, resume is exact, errors are clear."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import json

import numpy as np
import pytest
import torch

from _worldmodel_fixtures import square_episodes
from worldloop.utils.checkpoint import latest_checkpoint
from worldloop.worldmodel import vae as vae_lib
from worldloop.worldmodel.configuration import VAEConfig, WorldModelConfig
from worldloop.worldmodel.evaluate import evaluate_world_model
from worldloop.worldmodel.rollout import sample_future
from worldloop.worldmodel.train import latent_statistics, train_vae, train_world_model

CPU = torch.device("cpu")


def fast_config(**changes) -> WorldModelConfig:
    base = dict(steps=6, batch_size=4, lr=1e-3, log_every=2, sample_every=1000, checkpoint_every=1000, sampling_steps=2, clip_stride=4)
    return WorldModelConfig(**{**base, **changes})


@pytest.fixture(scope="module")
def vae():
    """A random (untrained) tiny VAE is a fixed deterministic encoder; its latent statistics are measured."""
    torch.manual_seed(0)
    model = vae_lib.build_vae(VAEConfig()).eval()
    mean, std = latent_statistics(model, square_episodes(4, seed=9), CPU, clips=8)
    model.register_to_config(latents_mean=mean, latents_std=std)
    return model


def test_action_conditioning_is_learned(vae, tmp_path):
    """Actions move a square; after training, the predicted future follows the chunk it was given."""
    torch.manual_seed(0)
    episodes = square_episodes(32, seed=0, length=20)
    config = fast_config(steps=500, batch_size=32, lr=2e-3, clip_stride=1, context_noise=0.1, static_fraction=0.0, ema_decay=0.95)
    model = train_world_model(config, episodes, vae, tmp_path / "wm", CPU)
    # the same context, two opposite action chunks, and the true future each one produces
    rng = np.random.default_rng(123)
    right_wins = 0
    trials = 6
    for trial in range(trials):
        start = square_episodes(1, seed=100 + trial, length=1)[0].frames[0]
        futures = []
        for sign in (1.0, -1.0):
            actions = np.full((8, 2), sign, np.float32) * np.array([1.0, rng.choice([-1.0, 1.0])], np.float32)
            futures.append(actions)
        true_latents, predicted = [], []
        for actions in futures:
            # roll the square forward by hand with these actions
            frames = [start]
            position = np.argwhere(start[..., 0] > 200).min(0).astype(float)
            for a in actions:
                position = np.clip(position + 2 * a, 0, 32 - 8)
                frame = np.full((32, 32, 3), 30, np.uint8)
                frame[int(position[0]) : int(position[0]) + 8, int(position[1]) : int(position[1]) + 8] = (230, 200, 40)
                frames.append(frame)
            clip = torch.as_tensor(np.stack([start] * 5 + frames[1:]))[None]
            with torch.no_grad():
                latents = vae_lib.encode(vae, clip)
                latents[:, :, :1] = vae_lib.encode(vae, clip[:, :1])
            true_latents.append(latents[:, :, 2:])
            context = latents[:, :, :2]
            all_actions = model.normalise(torch.cat([torch.zeros(1, 5, 2), torch.as_tensor(actions)[None]], dim=1))
            noise = torch.randn(true_latents[-1].shape, generator=torch.Generator().manual_seed(trial))
            predicted.append(sample_future(model.dit, context, all_actions, noise, model.sigmas))
        for own, other, prediction in ((0, 1, predicted[0]), (1, 0, predicted[1])):
            right_wins += int((prediction - true_latents[own]).pow(2).mean() < (prediction - true_latents[other]).pow(2).mean())
        assert (predicted[0] - predicted[1]).abs().mean() > 0.05  # different chunks, different predictions
    assert right_wins >= int(0.8 * 2 * trials), f"prediction closer to its own action's future only {right_wins}/{2 * trials} times"


def test_resume_is_exact_and_resolution_is_checked(vae, tmp_path):
    episodes = square_episodes(4, seed=1, length=16)
    straight = train_world_model(fast_config(steps=4, checkpoint_every=2), episodes, vae, tmp_path / "a", CPU)
    train_world_model(fast_config(steps=2), episodes, vae, tmp_path / "b", CPU)
    assert latest_checkpoint(tmp_path / "b").name == "step_000000002"
    resumed = train_world_model(fast_config(steps=4), episodes, vae, tmp_path / "b", CPU)
    for (name, p), q in zip(straight.dit.state_dict().items(), resumed.dit.state_dict().values()):
        assert torch.equal(p, q), name
    assert json.loads((tmp_path / "b" / "results.json").read_text())["steps"] == 4
    bigger = square_episodes(4, seed=1, length=16, size=64)
    with pytest.raises(ValueError, match="another resolution"):
        train_world_model(fast_config(steps=6), bigger, vae, tmp_path / "b", CPU)


def test_train_vae_writes_a_loadable_folder_and_metrics(tmp_path):
    episodes = square_episodes(3, seed=2, length=12)
    metrics = train_vae(VAEConfig(steps=2, batch_size=2, log_every=1), episodes[:2], episodes[2:], tmp_path / "vae", CPU)
    saved = json.loads((tmp_path / "vae" / "metrics.json").read_text())
    assert saved["steps"] == 2 and 0 < saved["held_out"]["psnr"] < 100 and -1 <= saved["held_out"]["ssim"] <= 1
    loaded = vae_lib.load_vae(tmp_path / "vae")
    assert len(loaded.config.latents_mean) == loaded.config.z_dim == metrics["latent_channels"]
    with pytest.raises(FileNotFoundError):
        vae_lib.load_vae(tmp_path / "missing")


def test_evaluate_writes_metrics_and_strips(vae, tmp_path):
    from worldloop.worldmodel.rollout import WorldModel

    model = WorldModel.build(fast_config(), vae, 32, 2, device="cpu")
    episodes = square_episodes(2, seed=3, length=20)
    metrics = evaluate_world_model(model, episodes, [8, 16, 64], tmp_path / "eval", videos=1)
    assert sorted(metrics["horizons"]) == ["16", "8"] and metrics["skipped_horizons"] == [64]
    row = metrics["horizons"]["8"]
    assert row["episodes"] == 2 and row["copy_last_frame_psnr"] > 0 and metrics["lpips"].startswith("unavailable")
    assert (tmp_path / "eval" / "episode_00_strip.png").is_file() and (tmp_path / "eval" / "episode_00_real_vs_generated.mp4").is_file()
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["rollout_frames_per_second"] > 0

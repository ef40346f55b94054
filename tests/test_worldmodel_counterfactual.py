"""eval-wm's simulator check: the swapped-actions rollouts against what the simulator does under them."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from _worldmodel_fixtures import tiny_vae
from conftest import TINY_OVERRIDES
from worldloop.cli import main
from worldloop.config import load_config
from worldloop.data.dataset import TrajectoryDataset
from worldloop.worldmodel.counterfactual import counterfactual_metrics, simulate


@pytest.fixture(scope="module")
def episodes(tiny_dataset):
    dataset = TrajectoryDataset(tiny_dataset)
    return [dataset.episode(i) for i in range(len(dataset))]


@pytest.fixture(scope="module")
def sim_config():
    return load_config("tiny-cpu", TINY_OVERRIDES).sim


def test_the_simulator_reproduces_each_recording_and_the_swap_moves_it(episodes, sim_config):
    own, running = simulate(sim_config, episodes, episodes, 16)
    swapped, _ = simulate(sim_config, episodes, episodes[1:] + episodes[:1], 16)
    real = torch.stack([torch.as_tensor(e.frames[1:17]) for e in episodes])
    assert own.shape == swapped.shape == real.shape and own.dtype == torch.uint8
    assert running.shape == (len(episodes), 16) and bool(running[:, 0].all())
    from worldloop.worldmodel.metrics import psnr

    replay, effect = psnr(own, real), psnr(swapped, real)
    assert float(replay.min()) > 29  # the reset is the recorded scene; only the video codec's loss remains (~32 dB)
    assert float(effect.mean()) < float(replay.mean()) - 3  # other actions lead the arm elsewhere
    # an episode the simulator ends (here its time limit, 16 steps) leaves the frames after it out
    _, running = simulate(replace(sim_config, max_steps=16), episodes[1:2], episodes[1:2], 24)
    assert running.tolist() == [[True] * 16 + [False] * 8]


def test_counterfactual_metrics_by_hand():
    """4-frame episodes: the model draws the swapped truth exactly (its counterfactual is the 100-dB ceiling),
    its own-action frames are 10 levels off that truth and equal to the simulator under its own actions, the
    recording 20 levels off; the last frame of episode 1 is invalid and horizon 4 counts only episode 0."""
    truth = torch.full((2, 4, 8, 8, 3), 100, dtype=torch.uint8)
    generated, real = truth + 10, truth + 20
    valid = torch.ones(2, 4, dtype=torch.bool)
    valid[1, 3] = False
    rows = counterfactual_metrics(real, generated, truth.clone(), truth, generated.clone(), valid, [2, 4])
    ten, twenty = 20 * math.log10(255 / 10), 20 * math.log10(255 / 20)
    assert rows["2"]["episodes"] == 2 and rows["4"]["episodes"] == 1
    assert rows["2"]["counterfactual_psnr"] == pytest.approx(100.0) and rows["2"]["blind_psnr"] == pytest.approx(ten, rel=1e-5)
    assert rows["2"]["counterfactual_gain"] == pytest.approx(100.0 - ten, rel=1e-5) and rows["2"]["counterfactual_gain_stderr"] == pytest.approx(0.0, abs=1e-6)
    assert rows["2"]["simulator_action_effect_psnr"] == pytest.approx(twenty, rel=1e-5) and rows["2"]["replay_psnr"] == pytest.approx(ten, rel=1e-5)
    assert rows["2"]["factual_psnr"] == pytest.approx(100.0) and rows["2"]["action_following"] == pytest.approx(1.0)  # as exact either way
    assert math.isnan(rows["4"]["counterfactual_gain_stderr"])
    # a model that draws its own-action frames under the swapped actions too: no gain, following 0
    blind = counterfactual_metrics(real, generated, generated.clone(), truth, generated.clone(), valid, [2])["2"]
    assert blind["counterfactual_gain"] == pytest.approx(0.0) and blind["action_following"] == pytest.approx(0.0)


def test_bad_input_is_named(episodes, sim_config):
    with pytest.raises(ValueError, match="sim.image_size=64"):
        simulate(replace(sim_config, image_size=128), episodes, episodes, 8)
    with pytest.raises(ValueError, match="first frame is .* dB from the recorded one"):
        simulate(replace(sim_config, camera="topview"), episodes[:2], episodes[:2], 8)
    reseeded = [replace(e, info={**e.info, "seed": e.info["seed"] + 1}) for e in episodes[:2]]
    with pytest.raises(ValueError, match="observation differs from the recorded one"):
        simulate(sim_config, reseeded, reseeded, 8)
    stripped = [replace(e, info={}) for e in episodes[:2]]
    with pytest.raises(ValueError, match="collected by `worldloop collect`"):
        simulate(sim_config, stripped, stripped, 8)


def test_eval_wm_counterfactual_from_the_command_line(tiny_dataset, tmp_path):
    """A tiny untrained world model: the numbers mean nothing, the path is the real one (the held-out episodes,
    the simulator at the dataset's settings, metrics.json's counterfactual rows per horizon)."""
    from worldloop.worldmodel.configuration import WorldModelConfig
    from worldloop.worldmodel.rollout import WorldModel

    torch.manual_seed(0)
    WorldModel.build(WorldModelConfig(sampling_steps=1), tiny_vae(), 64, 4, device="cpu").save_pretrained(tmp_path / "wm")
    overrides = [*TINY_OVERRIDES, "world_model.eval_horizons=[8,16]", "world_model.sampling_steps=1"]
    assert main(["eval-wm", "--world-model", str(tmp_path / "wm"), "--dataset", str(tiny_dataset), "--out", str(tmp_path / "eval"),
                 "--counterfactual", "--held-out-fraction", "0.5", *overrides]) == 0
    rows = json.loads((tmp_path / "eval" / "metrics.json").read_text())["counterfactual"]
    from PIL import Image

    picture = Image.open(tmp_path / "eval" / "episode_00_counterfactual.png")  # recorded, model, simulator and model under the swap
    assert picture.size == (64 * 2, 64 * 4)  # 16 frames: every 8th, two columns
    assert sorted(rows) == ["16", "8"]
    for row in rows.values():
        assert row["episodes"] == 2 and row["replay_psnr"] > 29
        assert row["counterfactual_gain"] == pytest.approx(row["counterfactual_psnr"] - row["blind_psnr"], rel=1e-6)

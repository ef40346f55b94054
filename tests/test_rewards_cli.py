"""train-reward and calibrate-reward end to end on a small LeRobot dataset written by DatasetWriter."""

from __future__ import annotations

import numpy as np
import pytest

from _rewards_fixtures import cue_episodes
from worldloop.cli import main
from worldloop.utils.io import read_json


def write_cue_dataset(root, episodes: int, length: int = 12):
    from worldloop.data.writer import DatasetWriter

    with DatasetWriter(root, fps=10, image_size=32, action_dim=4) as writer:
        for episode in cue_episodes(episodes, length=length, size=32):
            actions = np.zeros((len(episode.frames), 4), np.float32)
            writer.add_episode(episode.frames, actions, episode.success, episode.instruction)
    return root


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_cue_dataset(tmp_path_factory.mktemp("data") / "cue", 8)


def test_train_then_calibrate_reward_cli(dataset, tmp_path, capsys):
    rw, cal = tmp_path / "rw", tmp_path / "cal"
    small = ["reward.classifier.input_size=16", "reward.training.steps=4", "reward.training.batch_size=8"]
    assert main(["train-reward", "--dataset", str(dataset), "--out", str(rw), *small, "sim.chunk_size=4"]) == 0
    metrics = read_json(rw / "metrics.json")
    assert metrics["steps"] == 4 and metrics["held_out"]["frames"] == 2 * 11  # one of each task's 4 episodes held out
    # Episode verdicts as RL makes them, once per the simulator's chunk
    assert "held_out episodes judged once every 4 frames (n=2)" in capsys.readouterr().out
    assert metrics["held_out"]["episodes"]["verdict_every"] == 4 and metrics["held_out"]["episodes"]["real_success_once"] == 0.5
    assert (rw / "model" / "model.safetensors").is_file() and (rw / "config.yaml").is_file()
    assert main(["calibrate-reward", "--judge", str(rw), "--dataset", str(dataset), "--out", str(cal), "--split", "held_out", *small]) == 0
    calibration = read_json(cal / "metrics.json")
    assert calibration["episodes"] == 2 and calibration["windows"] == 2 * 3  # frames 3, 7, 11 at stride 4
    assert (cal / "histogram.png").is_file() and (cal / "config.yaml").is_file()
    assert "AUROC" in capsys.readouterr().out
    # A missing dataset is named in the error (in a new folder: cal holds the finished calibration).
    assert main(["calibrate-reward", "--judge", str(rw), "--dataset", str(tmp_path / "nope"), "--out", str(tmp_path / "cal-nope")]) == 2
    assert "nope does not exist" in capsys.readouterr().err


def test_calibrate_reward_judges_world_model_frames(dataset, tmp_path, capsys):
    import torch

    from worldloop.worldmodel import vae as vae_lib
    from worldloop.worldmodel.configuration import VAEConfig, WorldModelConfig
    from worldloop.worldmodel.rollout import WorldModel

    small = ["reward.classifier.input_size=16", "reward.training.steps=2", "reward.training.batch_size=8"]
    rw = tmp_path / "rw"
    assert main(["train-reward", "--dataset", str(dataset), "--out", str(rw), *small]) == 0
    torch.manual_seed(0)
    for size in (32, 64):  # a random tiny world model at the dataset's resolution, and one at another
        WorldModel.build(WorldModelConfig(sampling_steps=1), vae_lib.build_vae(VAEConfig()), size, 4, device="cpu").save_pretrained(tmp_path / f"wm{size}")
    cal = tmp_path / "cal"
    assert main(["calibrate-reward", "--judge", str(rw), "--dataset", str(dataset), "--out", str(cal), "--world-model", str(tmp_path / "wm32"), *small]) == 0
    result = read_json(cal / "metrics.json")["world_model"]
    assert result["imagined"]["windows"] == read_json(cal / "metrics.json")["windows"] == 8 * 3
    assert result["episodes"]["count"] == 8 and result["episodes"]["real_success_once"] == 0.5
    assert 0.0 <= result["window_verdict_agreement"] <= 1.0 and (cal / "histogram_imagined.png").is_file()
    assert "on imagined frames" in capsys.readouterr().out
    assert main(["calibrate-reward", "--judge", str(rw), "--dataset", str(dataset), "--out", str(tmp_path / "cal-64"), "--world-model", str(tmp_path / "wm64")]) == 2
    assert "renders 64px frames" in capsys.readouterr().err
    # The judge trained on the world model's replays too: twice the training frames, held-out replays scored.
    rw_wm = tmp_path / "rw-wm"
    assert main(["train-reward", "--dataset", str(dataset), "--out", str(rw_wm), "--world-model", str(tmp_path / "wm32"), *small,
                 "reward.training.threshold_from=max_f1"]) == 0  # fmt: skip
    metrics, plain = read_json(rw_wm / "metrics.json"), read_json(rw / "metrics.json")
    assert metrics["train"]["frames"] == 2 * plain["train"]["frames"]
    assert metrics["held_out_imagined"]["frames"] == metrics["held_out"]["frames"] == 2 * 11
    # The saved threshold is the one that maximises F1 on the frames RL will judge: the held-out replays.
    assert plain["threshold_chosen_on"] == "fixed" and metrics["threshold_chosen_on"] == "max_f1 on held_out_imagined"
    assert read_json(rw_wm / "model" / "config.json")["threshold"] == metrics["threshold"] == metrics["held_out_imagined"]["suggested_threshold"]["max_f1"]
    assert "replays of the held-out episodes" in capsys.readouterr().out
    assert main(["train-reward", "--dataset", str(dataset), "--out", str(tmp_path / "rw-64"), "--world-model", str(tmp_path / "wm64"), *small]) == 2
    assert "renders 64px frames" in capsys.readouterr().err
    # --replay: the replays of one dataset's episodes (ones the world model did not train on) beside both datasets' real frames
    other = tmp_path / "other"
    write_cue_dataset(other, 4)
    replaying = ["--world-model", str(tmp_path / "wm32"), *small, "reward.training.threshold_from=max_f1"]
    rw_new = tmp_path / "rw-new"
    assert main(["train-reward", "--dataset", str(dataset), str(other), "--replay", str(other), "--out", str(rw_new), *replaying]) == 0
    mine = read_json(rw_new / "metrics.json")
    assert mine["train"]["frames"] == plain["train"]["frames"] + 2 * 2 * 11  # two of other's four episodes train (twice: real, replayed)
    assert mine["held_out"]["frames"] == 2 * 11 + 2 * 11 and mine["held_out_imagined"]["frames"] == 2 * 11
    assert f"with the replays of {other}" in capsys.readouterr().out
    for wrong in (["--replay", str(tmp_path / "elsewhere")], ["--replay", str(other), "--world-model"]):
        out = tmp_path / "rw-wrong"
        argv = ["train-reward", "--dataset", str(dataset), str(other), "--out", str(out), *replaying, *wrong]
        if wrong[-1] == "--world-model":  # --replay without a world model
            argv = ["train-reward", "--dataset", str(dataset), str(other), "--replay", str(other), "--out", str(out), *small]
        assert main(argv) == 2 and not out.exists()
        assert "--replay" in capsys.readouterr().err

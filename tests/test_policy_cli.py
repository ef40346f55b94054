"""`worldloop sft` on a real collected dataset, then `worldloop eval` of the result, end to end."""

from __future__ import annotations

import json

from _policy_fixtures import TINY
from worldloop.cli import main


def test_sft_then_eval_from_the_command_line(tiny_dataset, tmp_path):
    model, results = tmp_path / "model", tmp_path / "eval"
    assert main(["sft", "--dataset", str(tiny_dataset), "--out", str(model), "--episodes-per-task", "1", *TINY, "sft.steps=4"]) == 0
    sft = json.loads((model / "sft_results.json").read_text())
    assert len(sft["train_episodes"]) == 2 and sft["held_out_token_accuracy"] is not None  # one episode of each of 2 tasks
    assert {"config.json", "model.safetensors", "norm_stats.json", "config.yaml", "tb"} <= {p.name for p in model.iterdir()}
    code = main(["eval", "--policy", str(model), "--tasks", "reach-v3", "--episodes-per-task", "1", "--out", str(results), "--greedy", "sim.max_steps=8", "sim.num_workers=1"])
    assert code == 0
    saved = json.loads((results / "results.json").read_text())
    assert saved["episodes"] == 1 and saved["greedy"] is True and saved["per_task"]["reach-v3"]["mean_episode_length"] == 8
    assert (results / "config.yaml").is_file() and (results / "videos" / "reach-v3_000.mp4").is_file()

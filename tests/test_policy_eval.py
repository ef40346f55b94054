"""Real-simulator evaluation: the scripted expert's known success rate, reproducibility, clear errors."""

from __future__ import annotations

import json

import pytest

from _policy_fixtures import tiny_config, tiny_policy
from worldloop.policies import EXPERT
from worldloop.rl.evaluate import evaluate_policy

FAST_TASKS = ["reach-v3", "button-press-topdown-v3"]  # the expert solves them in ~45 and ~60 steps


def sim_config(*overrides: str):
    return tiny_config("sim.num_workers=1", "sim.image_size=64", *overrides)


def test_expert_succeeds_and_results_are_written(tmp_path):
    from worldloop.data.video import read_mp4

    results = evaluate_policy(EXPERT, sim_config(), tasks=FAST_TASKS, episodes_per_task=1, out=tmp_path, num_envs=2, videos_per_task=1, progress=False)
    assert results["success_once"] == 1.0, results["per_task"]
    assert results["episodes"] == 2 and set(results["per_task"]) == set(FAST_TASKS)
    assert 20 < results["mean_episode_length"] < 200
    saved = json.loads((tmp_path / "results.json").read_text())
    for key in ("success_once", "stderr", "episodes", "per_task"):
        assert key in saved
    assert len(set(saved["seeds"])) == 2 and min(saved["seeds"]) >= 2**31
    assert "| **overall** |" in (tmp_path / "results.md").read_text()
    videos = sorted((tmp_path / "videos").glob("*.mp4"))
    assert [v.name for v in videos] == ["button-press-topdown-v3_000.mp4", "reach-v3_000.mp4"]
    frames = read_mp4(videos[1])
    assert frames.shape == (results["per_task"]["reach-v3"]["mean_episode_length"] + 1, 64, 64, 3)


def test_policy_evaluation_is_reproducible(tmp_path):
    from worldloop.data.video import read_mp4

    def run(seed: int, name: str):
        config = sim_config("sim.max_steps=8", f"seed={seed}")
        policy = tiny_policy(config)
        policy.image_size = 64  # the tiny policy's encoder pools to a fixed grid, so it runs at any size
        results = evaluate_policy(policy, config, tasks=["reach-v3"], episodes_per_task=1, out=tmp_path / name, temperature=1.5,
                                  videos_per_task=1, progress=False)
        return results, read_mp4(tmp_path / name / "videos" / "reach-v3_000.mp4")

    first, first_video = run(0, "a")
    second, second_video = run(0, "b")
    _, other_video = run(1, "c")
    assert first["episodes"] == 1 and first["mean_episode_length"] == 8 and first_video.shape[0] == 9
    assert first["per_task"] == second["per_task"] and first["seeds"] == second["seeds"]
    assert (first_video == second_video).all()  # same sampled actions -> same frames
    assert not (first_video == other_video).all()  # another sampling seed moves the arm elsewhere


def test_mismatched_policy_gives_clear_errors():
    config = sim_config("sim.max_steps=8")
    with pytest.raises(ValueError, match="acts in 7 action dimensions but the environment takes 4"):
        evaluate_policy(tiny_policy(config, action_dim=7), config, tasks=["reach-v3"], episodes_per_task=1, progress=False)
    with pytest.raises(ValueError, match="sim.image_size=32"):
        evaluate_policy(tiny_policy(config), config, tasks=["reach-v3"], episodes_per_task=1, progress=False)


def test_two_evaluations_of_the_same_initial_states_are_compared_episode_by_episode(tmp_path, capsys):
    from worldloop.cli import main
    from worldloop.rl.evaluate import evaluation_seeds, paired_eval_change

    results = evaluate_policy(EXPERT, sim_config(), tasks=FAST_TASKS, episodes_per_task=1, progress=False)
    assert [row["per_episode"] for row in results["per_task"].values()] == ["1", "1"]

    def evaluation(outcomes: dict[str, str]) -> dict:
        seeds = evaluation_seeds(list(outcomes), len(next(iter(outcomes.values()))), 2**31)
        return {"seeds": seeds, "per_task": {t: {"episodes": len(o), "per_episode": o} for t, o in outcomes.items()}}

    before = evaluation({"reach-v3": "0011", "button-press-topdown-v3": "1100"})
    change = paired_eval_change(before, evaluation({"reach-v3": "1111", "button-press-topdown-v3": "1000"}))
    assert (change["difference"], change["gained"], change["lost"], change["episodes"]) == (1 / 8, 2, 1, 8)
    assert change["per_task"]["reach-v3"]["difference"] == 0.5 and change["per_task"]["button-press-topdown-v3"]["lost"] == 1
    with pytest.raises(ValueError, match="not start from the same initial states"):
        paired_eval_change(before, evaluation({"reach-v3": "00", "button-press-topdown-v3": "11"}))
    with pytest.raises(ValueError, match="without per-episode outcomes"):
        paired_eval_change(before | {"per_task": {"reach-v3": {"episodes": 4}}}, before)

    # the CLI refuses an evaluation of other initial states before it simulates anything
    (tmp_path / "before.json").write_text(json.dumps(before))
    assert main(["eval", "--policy", "expert", "--out", str(tmp_path / "e"), "--tasks", "reach-v3", "--episodes-per-task", "4",
                 "--against", str(tmp_path / "before.json"), "sim.num_workers=1", "sim.image_size=64"]) == 2  # fmt: skip
    assert "did not start from the initial states this evaluation will" in capsys.readouterr().err
    common = ["--tasks", "reach-v3", "--episodes-per-task", "2", "sim.num_workers=1", "sim.image_size=64", "eval.videos_per_task=0"]
    assert main(["eval", "--policy", "expert", "--out", str(tmp_path / "e1"), *common]) == 0
    assert main(["eval", "--policy", "expert", "--out", str(tmp_path / "e2"), "--against", str(tmp_path / "e1" / "results.json"), *common]) == 0
    assert "(the same initial states): overall +0.000 (no episode changed)" in capsys.readouterr().out
    saved = json.loads((tmp_path / "e2" / "results.json").read_text())["paired_change"]
    assert saved["episodes"] == 2 and saved["against"] == str(tmp_path / "e1" / "results.json")

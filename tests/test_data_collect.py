"""`worldloop collect` on the real simulator: summary, resume after Ctrl-C and kill -9, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from worldloop.cli import main
from worldloop.config import load_config, load_saved_config
from worldloop.data.collect import collect, collection_plan, expert_driver, format_summary, summarize
from worldloop.data.dataset import TrajectoryDataset

# One quick task, two chunks per episode at most: these tests are about bookkeeping, not skill.
SMALL = ["sim.tasks=[reach-v3]", "sim.max_steps=16", "sim.num_workers=1", "collect.num_envs=1"]


def snapshot(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*")) if p.is_file()}


def test_collect_two_tasks_gives_dataset_and_summary(tiny_dataset):
    config = load_saved_config(tiny_dataset)
    summary = json.loads((tiny_dataset / "summary.json").read_text())
    assert sorted(summary["tasks"]) == ["button-press-topdown-v3", "reach-v3"]
    assert all(block["episodes"] == 2 for block in summary["tasks"].values())
    assert summary["overall"]["episodes"] == 4 and (tiny_dataset / "config.yaml").is_file()

    ds = TrajectoryDataset(tiny_dataset)
    assert ds.num_episodes == 4 and ds.image_size == 64 and ds.state_dim == 39 and ds.action_dim == 4
    plan = {p.key: p for p in collection_plan(["reach-v3", "button-press-topdown-v3"], 2, 0.5, seed=0)}
    outcomes = []
    for episode in ds.episodes():
        planned = plan[episode.info["key"]]
        assert episode.info["seed"] == planned.seed and episode.info["noisy"] == planned.noisy
        assert 1 <= len(episode) <= 48 and episode.frames.shape == (len(episode), 64, 64, 3)
        assert episode.frames[0].std() > 10  # a rendered scene, not a blank buffer
        assert np.abs(episode.actions).max() <= 1.0
        if episode.success.any():  # the episode ends sim.success_hold_steps after its first success
            first = int(np.argmax(episode.success))
            assert len(episode) == min(first + 1 + config.sim.success_hold_steps, config.sim.max_steps)
        outcomes.append(bool(episode.success.any()))
    assert summary["overall"]["success_rate"] == pytest.approx(np.mean(outcomes))
    assert True in outcomes and False in outcomes


def test_resume_after_ctrl_c_completes_the_plan_without_duplicates(tmp_path):
    config = load_config("tiny-cpu", SMALL)
    out = tmp_path / "ds"
    calls = 0

    def interrupted_expert(env, frames, instructions):
        nonlocal calls
        calls += 1
        if calls == 3:  # the first chunk of the second episode
            raise KeyboardInterrupt
        return expert_driver(env, frames, instructions)

    with pytest.raises(KeyboardInterrupt):
        collect(config, out, driver=interrupted_expert, episodes_per_task=3, progress=False)
    assert TrajectoryDataset(out).num_episodes == 1

    summary = collect(config, out, episodes_per_task=3, progress=False)
    assert summary["run"] == {**summary["run"], "new_episodes": 2, "skipped_completed": 1}
    keys = [e.info["key"] for e in TrajectoryDataset(out).episodes()]
    assert keys == ["reach-v3/0000", "reach-v3/0001", "reach-v3/0002"]


def test_kill_9_mid_collection_loses_nothing_and_resumes(tmp_path):
    out = tmp_path / "ds"
    command = [sys.executable, "-m", "worldloop", "collect", "--out", str(out), "--episodes-per-task", "4", "--no-progress", *SMALL]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "MUJOCO_GL": "egl"})
    info = out / "meta" / "info.json"
    deadline = time.time() + 120
    try:
        while time.time() < deadline and process.poll() is None:
            if info.is_file() and json.loads(info.read_text())["total_episodes"] >= 1:
                break
            time.sleep(0.05)
        assert process.poll() is None, process.stderr.read().decode()[-2000:]
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
        process.stderr.close()
    committed = TrajectoryDataset(out).num_episodes
    assert 1 <= committed < 4

    assert main(["collect", "--out", str(out), "--episodes-per-task", "4", "--no-progress", *SMALL]) == 0
    ds = TrajectoryDataset(out)
    keys = [e.info["key"] for e in ds.episodes()]
    assert sorted(keys) == [f"reach-v3/{i:04d}" for i in range(4)]
    # no orphan files: one data file per episode
    assert len(list((out / "data").rglob("*.parquet"))) == 4
    # the plan's next episode, into a dataset of its own: another initial state than the first four's
    assert main(["collect", "--out", str(tmp_path / "next"), "--episodes-per-task", "1", "--first-episode", "4", "--no-progress", *SMALL]) == 0
    (after,) = TrajectoryDataset(tmp_path / "next").episodes()
    assert after.info["key"] == "reach-v3/0004" and after.info["seed"] not in {e.info["seed"] for e in ds.episodes()}


def test_config_typo_and_unknown_task_stop_before_writing(tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["collect", "--out", str(out), "collect.episodes_per_tsk=2"]) == 2
    assert "episodes_per_tsk" in capsys.readouterr().err
    assert main(["collect", "--out", str(out), "sim.tasks=[reach-v9]"]) == 2
    assert "reach-v9" in capsys.readouterr().err
    assert not out.exists()


def test_incompatible_resume_is_refused_and_changes_nothing(tiny_dataset, capsys):
    from conftest import TINY_OVERRIDES

    before = snapshot(tiny_dataset)
    assert main(["collect", "--out", str(tiny_dataset), "--episodes-per-task", "3", *TINY_OVERRIDES, "sim.image_size=128"]) == 2
    error = capsys.readouterr().err
    assert "sim.image_size: 64 there, 128 now" in error
    assert snapshot(tiny_dataset) == before


def test_plan_is_deterministic_prefix_stable_and_spreads_noisy_episodes():
    tasks = ["reach-v3", "push-v3"]
    five = collection_plan(tasks, 5, noisy_fraction=0.4, seed=7)
    ten = collection_plan(tasks, 10, noisy_fraction=0.4, seed=7)
    assert collection_plan(tasks, 5, 0.4, seed=7) == five
    assert {p.key: p for p in ten if p.episode < 5} == {p.key: p for p in five}  # more episodes extend the plan
    assert collection_plan(["push-v3"], 5, 0.4, seed=7) == [p for p in five if p.task == "push-v3"]  # seeds ignore other tasks
    assert [p.noisy for p in ten if p.task == "reach-v3"] == [False, False, True, False, True] * 2
    assert len({p.seed for p in ten}) == len(ten) and collection_plan(tasks, 5, 0.4, seed=8)[0].seed != five[0].seed
    # a plan from episode 5 on is the rest of the ten: initial states apart from the first five's
    assert collection_plan(tasks, 5, 0.4, seed=7, first_episode=5) == [p for p in ten if p.episode >= 5]


def test_summary_of_a_policys_rollouts_is_strict_json():
    rows = [{"worldloop/task": "reach-v3", "tasks": ["reach"], "worldloop/success": s, "length": n} for s, n in ((True, 40), (False, 200))]
    summary = summarize(rows)
    text = json.dumps(summary, allow_nan=False)  # no NaN for the empty noisy split: jq and browsers reject it
    assert json.loads(text)["overall"]["noisy"] == {"episodes": 0, "success_rate": None, "stderr": None, "mean_length": None}
    assert summary["overall"]["clean"]["success_rate"] == 0.5 and summary["tasks"]["reach-v3"]["mean_length"] == 120.0
    assert "-" in format_summary(summary).splitlines()[2]  # the empty split prints as a dash

"""The closed loop on the micro preset: every stage runs, an interrupted loop resumes, and the
report says what results.json says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from worldloop.cli import main
from worldloop.config import load_config
from worldloop.loop import STAGES_DIR, Inputs, plan, run_loop

# Test-time economies, each keeping what the test asserts: 56 steps still let the clean reach demos succeed (at ~46),
# so the judge has positives; two base rollouts per task still hold one out per task for the VAE; the base
# policy, the judge and the VAE only have to exist (micro: 80 steps, 3 rollouts, 60 SFT, 20 judge, 6 VAE steps); one VAE step
# is one held-out evaluation on the way (train-vae measures one at each tenth of its budget that a step crosses).
OVERRIDES = ["loop.eval_episodes_per_task=1", "rl.iterations=1", "rl.refine.every=1", "rl.refine.episodes_per_task=1", "rl.refine.steps=2",
             "rl.judge_threshold=replay", "sim.max_steps=56", "loop.base_rollouts_per_task=2", "sft.steps=30", "reward.training.steps=10",
             "vae.steps=1"]


def test_plan_skips_what_the_user_brings(tmp_path):
    config = load_config("micro")
    names = [s.name for s in plan(config, tmp_path, Inputs())[0]]
    assert names[:2] == ["demos", "policy_base"] and names[-1] == "eval_rl2"
    stages = plan(config, tmp_path, Inputs(dataset="d", base_policy="p", world_model="w", judge="j"))[0]
    assert not {"demos", "policy_base", "vae", "wm_base", "judge"} & {s.name for s in stages}
    wm_evo = next(s.argv for s in stages if s.name == "wm_evo")  # refined on the VAE of the world model brought
    assert wm_evo[wm_evo.index("--vae") + 1] == str(Path("w") / "vae") and wm_evo[wm_evo.index("--init") + 1] == "w"
    no_pace = [s.name for s in plan(load_config("micro", ["loop.pace=false"]), tmp_path, Inputs())[0]]
    assert no_pace[-1] == "eval_rl1" and "wm_evo" not in no_pace
    # on another run's base stages (an experiment's arm): RL and what follows only, on that run's products
    stages, paths = plan(config, tmp_path / "arm", Inputs(base=str(tmp_path / "base")))
    assert stages[0].name == "rl1" and all(s.gated for s in stages) and paths["judge"] == str(tmp_path / "base" / "judge")
    assert paths["rl2"] == str(tmp_path / "arm" / "rl2")


def test_the_judge_learns_the_replays_of_the_world_models_own_training_episodes(tmp_path):
    """Where the gate is enforced the judge learns the real frames and the world model's replays of them; the retired
    switch for replays of episodes the world model never saw (it lost, 2026-12-07) stops with what to do instead."""
    config = load_config("micro", ["loop.gate_min_kappa=0.6", "loop.base_rollouts_per_task=2"])
    stages = {s.name: s.argv for s in plan(config, tmp_path, Inputs())[0]}
    judge = stages["judge"]
    assert judge[judge.index("--world-model") + 1] == str(tmp_path / "wm_base") and "--replay" not in judge
    assert judge[judge.index("--dataset") + 1 : judge.index("--world-model")] == [str(tmp_path / "demos"), str(tmp_path / "rollouts_base")]
    assert "rollouts_judge" not in stages
    # a gate that only reports spares the replays
    reporting = {s.name: s.argv for s in plan(load_config("micro", ["loop.gate_min_kappa=null"]), tmp_path, Inputs())[0]}
    assert "--world-model" not in reporting["judge"]
    with pytest.raises(ValueError, match="judge_rollouts_per_task' was retired.*judge-on-unseen-replays"):
        load_config("micro", ["loop.judge_rollouts_per_task=32"])


def test_failed_stage_stops_the_loop_and_leaves_no_marker(tmp_path):
    with pytest.raises(RuntimeError, match="stage demos failed"):
        run_loop(load_config("micro"), tmp_path, Inputs(), "micro", [], verb=lambda argv: 3)
    assert not (tmp_path / STAGES_DIR).exists()


def test_loop_runs_every_stage_resumes_and_reports(tmp_path, capsys):
    config = load_config("micro", OVERRIDES)
    run = tmp_path / "run"
    calls = []

    def verb(argv):
        calls.append(argv[0])
        return main(argv)

    # "killed" after the first three stages: their markers stay, nothing else ran
    run_loop(config, run, Inputs(), "micro", OVERRIDES, verb=verb, stop_after="eval_base")
    assert calls == ["collect", "sft", "eval"]
    assert sorted(p.stem for p in (run / STAGES_DIR).glob("*.json")) == ["demos", "eval_base", "policy_base"]

    calls.clear()
    report = run_loop(config, run, Inputs(), "micro", OVERRIDES, verb=verb)
    assert "demos already complete" in capsys.readouterr().out
    assert calls[0] == "collect" and calls.count("sft") == 0  # resumed at the base-policy rollouts
    stages = [s.name for s in plan(config, run, Inputs())[0]]
    assert sorted(p.stem for p in (run / STAGES_DIR).glob("*.json")) == sorted(stages)
    assert (run / "rl2" / "policy" / "model.safetensors").is_file()
    # the world model learnt from the policy's real rollouts within RL (one per task), as its clips on disk say
    wm_evo = next(s.argv for s in plan(config, run, Inputs())[0] if s.name == "wm_evo")
    assert wm_evo[wm_evo.index("--init") + 1] == str(run / "rl1" / "world_model")  # PACE goes on from the refined model
    refined = json.loads((run / "rl1" / "results.json").read_text())["history"][0]
    assert refined["world_model/refine_real_episodes"] == 2 and (run / "rl1" / "refine" / "round_000001.safetensors").is_file(), refined
    # RL judged as the gate certified (its threshold and episode rule, chosen on the gate's calibration episodes), not
    # as rl.judge_threshold=replay would have chosen again; the refined world model keeps that judge
    gate = json.loads((run / "gate" / "gate.json").read_text())
    for stage in ("rl1", "rl2"):
        rl = load_config(run / stage / "config.yaml").rl
        assert rl.judge_threshold == gate["threshold"] and rl.success_chunks == gate["rule"]["success_chunks"]
    assert not (run / "rl1" / "judge_calibration.json").exists() and "world_model/judge_threshold" not in refined
    assert (run / "gate" / "gate_episodes.json").is_file() and gate["episodes"] == {"calibration": 4, "evaluation": 4}
    rollouts = json.loads((run / "rollouts_base" / "summary.json").read_text())["overall"]
    assert rollouts["episodes"] > 0 and rollouts["noisy"]["episodes"] == 0  # a policy's rollouts are not a noisy expert's

    results = json.loads((run / "results.json").read_text())
    text = report.read_text()
    assert set(results["overall"]) == {"base", "stage1", "stage2"}
    for name, rate in results["overall"].items():
        assert rate["episodes"] == 2  # 2 tasks x 1 episode
    overall_row = next(line for line in text.splitlines() if line.startswith("| **overall**"))
    cells = re.findall(r"([0-9.]+) ± ([0-9.]+) \(n=(\d+)\)", overall_row)
    assert [(float(a), float(b), int(n)) for a, b, n in cells] == [
        (round(r["success_once"], 3), round(r["stderr"], 3), r["episodes"]) for r in results["overall"].values()
    ]
    # imagination vs reality: one row per RL evaluation, its kappa as results.json has it ("-": undefined)
    evaluations = [e for block in results["imagination_vs_reality"].values() for e in block["evaluations"]]
    rows = [line for line in text.splitlines() if line.startswith(("| stage1 |", "| stage2 |")) and line.count("|") == 6]
    assert evaluations and len(rows) == len(evaluations)
    for row, e in zip(rows, evaluations):
        assert row.split("|")[5].strip() == (f"{e['kappa']:.2f} ± {e['kappa_stderr']:.2f}" if "kappa" in e else "-"), row
    # and how long imagination followed the real trajectory, one line per evaluation that measured it
    tracked = [e for e in evaluations if e.get("tracking")]
    lines = [line for line in text.splitlines() if line.startswith(("- stage1 @", "- stage2 @")) and "PSNR" in line]
    assert tracked and len(lines) == len(tracked)
    assert all(f"PSNR {e['tracking'][0]['psnr']:.1f}" in line for line, e in zip(lines, tracked)), lines
    # the policy's choices on the real frames through the world model's VAE (the real one has a VAE; the toys do not)
    assert all(0 <= row["token_agreement_reconstructed"] <= 1 for e in tracked for row in e["tracking"])
    # and where the gap came from: the judge on the real frames, the world model replaying the real actions, the closed loop
    sourced = [e for e in evaluations if e.get("gap_sources")]
    lines = [line for line in text.splitlines() if line.startswith(("- stage1 @", "- stage2 @")) and "against the simulator" in line]
    assert sourced and len(lines) == len(sourced)
    replayed = [f"the world model replaying the real actions {e['gap_sources']['replayed']['success_once']:.3f}" for e in sourced]
    assert all(text in line for text, line in zip(replayed, lines)), lines
    per_task = [line for line in text.splitlines() if line.startswith(("| stage1 |", "| stage2 |")) and line.count("|") == 8]
    assert len(per_task) == sum(len(e["real"]["per_task"]) for e in sourced), per_task
    horizons = results["world_model"]["base"]
    assert horizons and all("copy_last_frame_psnr" in m for m in horizons.values())
    assert (run / "per_task.png").is_file() and (run / "learning_curves.png").is_file()


def test_a_small_runs_report_says_so_at_its_top_and_beside_its_rates(tmp_path):
    from worldloop.report import render_markdown

    rate = lambda n: {"success_once": 0.0, "stderr": 0.0, "episodes": n}  # noqa: E731
    small = {"per_task": {"reach-v3": {"base": rate(1)}}, "overall": {"base": rate(10)}, "imagination_vs_reality": {}, "world_model": {},
             "stage_seconds": {}}  # fmt: skip
    text = render_markdown(tmp_path, small, [])
    assert text.splitlines()[4].startswith("**A small run.** Each policy was evaluated on 1 episode(s) per task")
    assert "| reach-v3 | 0.000 ± 0.000 (n=1) (too few) |" in text and "| **overall** | 0.000 ± 0.000 (n=10) |" in text
    large = dict(small, per_task={"reach-v3": {"base": rate(50)}})
    assert "A small run" not in render_markdown(tmp_path, large, []) and "too few" not in render_markdown(tmp_path, large, [])


def test_loop_stopped_by_until_resumes_without_it(tmp_path, monkeypatch):
    """`--until` says where one call stops, not which run the folder holds: the same loop goes on without it."""
    import worldloop.loop

    calls = []
    monkeypatch.setattr(worldloop.loop, "run_loop", lambda config, out, inputs, preset, overrides, stop_after=None: calls.append(stop_after))
    assert main(["loop", "--preset", "micro", "--out", str(tmp_path), "--until", "rollouts_base"]) == 0
    assert main(["loop", "--preset", "micro", "--out", str(tmp_path)]) == 0
    assert main(["loop", "--preset", "micro", "--out", str(tmp_path)]) == 0  # a finished loop rewrites its report
    assert calls == ["rollouts_base", None, None]
    assert main(["loop", "--preset", "micro", "--out", str(tmp_path), "--world-model", str(tmp_path)]) == 2  # another run: refused

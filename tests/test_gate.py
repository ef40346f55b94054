"""The fidelity gate's verdicts, and what the loop does with them: the tasks RL trains on, the skipped stages, RL's time."""

from __future__ import annotations

import json

import pytest

from worldloop.diagnostics.gate import gate_table, gate_verdicts
from worldloop.config import load_config
from worldloop.loop import STAGES_DIR, Inputs, gate_arguments, plan, rl_minutes, run_loop


def calibration(per_task: dict[str, tuple[float, float, float | None, float]], threshold: float = 0.9, calibrated: bool = True) -> dict:
    """A judge calibration's result (``calibrate_threshold``) with (real success, judged success, kappa, kappa SE) per task."""
    return {
        "threshold": threshold, "calibrated": calibrated,
        "real": {"per_task": {t: {"success_once": r, "stderr": 0.1, "episodes": 16} for t, (r, _, _, _) in per_task.items()}},
        "replayed_after": {"per_task": {t: {"success_once": j, "stderr": 0.1, "episodes": 16} for t, (_, j, _, _) in per_task.items()},
                           "per_task_kappa": {t: {"kappa": k, "kappa_stderr": se} for t, (_, _, k, se) in per_task.items()}},
    }  # fmt: skip


def test_a_task_passes_only_with_kappa_above_the_bar_and_above_chance():
    result = gate_verdicts(calibration({
        "door-open-v3": (0.5, 0.45, 0.81, 0.10),  # tracks
        "drawer-open-v3": (0.4, 0.7, 0.35, 0.12),  # above chance, below the bar
        "reach-v3": (1.0, 1.0, None, 0.0),  # every real episode succeeded: kappa undefined
        "window-open-v3": (0.3, 0.3, 0.62, 0.40),  # above the bar but within 2 SE of chance
        "drawer-close-v3": (1.0, 0.7, 0.0, 0.37),  # every real episode succeeded, some replays failed: still undefined
    }), min_kappa=0.6, significance_se=2.0)  # fmt: skip
    assert result["passed"] == ["door-open-v3"]
    why = {task: row["why_not"] for task, row in result["tasks"].items()}
    assert "below 0.6" in why["drawer-open-v3"] and "all 16 real episodes succeeded" in why["reach-v3"]
    assert "not 2 SE above chance" in why["window-open-v3"] and why["door-open-v3"] == ""
    assert "all 16 real episodes succeeded" in why["drawer-close-v3"] and result["tasks"]["drawer-close-v3"]["kappa"] is None
    table = gate_table(result)
    assert "| door-open-v3 | 16 | 0.50 ± 0.10 | 0.45 ± 0.10 | 0.81 ± 0.10 | - | yes |" in table  # no replay scores: no AUROC
    assert "| reach-v3 | 16 | 1.00 ± 0.10 | 1.00 ± 0.10 | undefined | - | no: kappa undefined" in table
    # not enforced: every task passes, and the table says the gate only measured
    loose = gate_verdicts(calibration({"reach-v3": (1.0, 1.0, None, 0.0)}), min_kappa=None, significance_se=2.0)
    assert loose["passed"] == ["reach-v3"] and "not enforced" in gate_table(loose)


def test_auroc_says_whether_any_threshold_reads_a_tasks_replays_and_analyse_rebuilds_the_gate(tmp_path, capsys):
    from worldloop.cli import main

    result = calibration({"door-open-v3": (0.5, 0.5, 0.0, 0.2), "window-open-v3": (0.5, 0.5, 0.0, 0.2), "reach-v3": (0.0, 0.0, None, 0.0)})
    result["per_episode"] = {  # door: successes' replays score higher (AUROC 1); window: lower, 1 tie (AUROC 0.125)
        "score": [0.9, 0.8, 0.1, 0.2] + [0.1, 0.3, 0.3, 0.9] + [0.5, 0.6],
        "real": "1100" + "1100" + "00",
        "task": ["door-open-v3"] * 4 + ["window-open-v3"] * 4 + ["reach-v3"] * 2,
    }
    (tmp_path / "judge_calibration.json").write_text(json.dumps(result))
    (tmp_path / "gate.json").write_text(json.dumps(gate_verdicts(calibration({"door-open-v3": (0.5, 0.5, 0.0, 0.2)}), 0.6, 2.0)))
    assert main(["analyse", str(tmp_path)]) == 0  # a committed gate folder: gate.json and gate.md from the replays' scores
    rows = json.loads((tmp_path / "gate.json").read_text())["tasks"]
    assert rows["door-open-v3"]["auroc"] == 1.0 and rows["window-open-v3"]["auroc"] == 0.125 and rows["reach-v3"]["auroc"] is None
    assert "| 0.00 ± 0.20 | 1.00 | no: kappa 0.00 ± 0.20 is below 0.6 |" in (tmp_path / "gate.md").read_text()
    assert "gate.md and gate.json rebuilt" in capsys.readouterr().out


def write_gate(folder, passed: list[str], threshold: float = 0.93, calibrated: bool = True) -> None:
    """gate.json as `worldloop gate` writes it: the ``passed`` tasks track (kappa 0.8), reach-v3 does not (0.1) unless passed."""
    tasks = {task: (0.5, 0.5, 0.8, 0.1) for task in passed} | ({} if "reach-v3" in passed else {"reach-v3": (0.5, 0.5, 0.1, 0.1)})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gate.json").write_text(json.dumps(gate_verdicts(calibration(tasks, threshold, calibrated), 0.6, 2.0)))


def test_rl_stages_train_on_the_tasks_that_passed_at_the_gates_threshold(tmp_path):
    write_gate(tmp_path, ["door-open-v3", "drawer-open-v3"])
    config = load_config("micro", ["loop.gate_min_kappa=0.6", "rl.judge_threshold=null"])
    assert gate_arguments(config, tmp_path) == (["--tasks", "door-open-v3,drawer-open-v3"], ["rl.judge_threshold=0.93"])
    # rl.judge_threshold=replay chooses again, on the RL stage's own starting policy; a gate that kept its threshold says none
    assert gate_arguments(load_config("micro", ["loop.gate_min_kappa=0.6", "rl.judge_threshold=replay"]), tmp_path)[1] == []
    write_gate(tmp_path, ["door-open-v3"], calibrated=False)
    assert gate_arguments(config, tmp_path) == (["--tasks", "door-open-v3"], [])
    # not enforced: RL keeps its own tasks
    assert gate_arguments(load_config("micro", ["rl.judge_threshold=null"]), tmp_path)[0] == []
    write_gate(tmp_path, [])
    assert gate_arguments(config, tmp_path) is None


def test_no_task_through_the_gate_skips_rl_and_the_report_says_why(tmp_path):
    config = load_config("micro", ["loop.gate_min_kappa=0.6"])
    stages = [s.name for s in plan(config, tmp_path, Inputs())[0]]
    gated = [s.name for s in plan(config, tmp_path, Inputs())[0] if s.gated]
    assert stages.index("gate") < stages.index("rl1") and gated[0] == "rl1" and gated[-1] == "eval_rl2"
    judge = next(s.argv for s in plan(config, tmp_path, Inputs())[0] if s.name == "judge")
    assert judge[judge.index("--world-model") + 1] == str(tmp_path / "wm_base")  # an enforced gate: the judge learns the replays
    assert "--world-model" not in next(s.argv for s in plan(load_config("micro"), tmp_path, Inputs())[0] if s.name == "judge")
    calls = []

    def verb(argv):
        calls.append(argv[0])
        if argv[0] == "gate":
            write_gate(tmp_path / "gate", [])
        return 0

    report = run_loop(config, tmp_path, Inputs(), "micro", [], verb=verb)
    assert "rl" not in calls and calls[-1] == "kir"
    for name in gated:
        assert json.loads((tmp_path / STAGES_DIR / f"{name}.json").read_text())["skipped"] == "no task passed the fidelity gate"
    skipped = next(line for line in report.read_text().splitlines() if line.startswith("Skipped (no task passed the fidelity gate): "))
    assert sorted(skipped.split(": ")[1].rstrip(".").split(", ")) == sorted(gated)


def test_rl_gets_what_the_time_budget_left_and_until_stops_with_a_report(tmp_path):
    config = load_config("micro", ["loop.time_budget_min=20"])
    stages = plan(config, tmp_path, Inputs())[0]
    rl1 = [s.name for s in stages].index("rl1")
    # 8 minutes spent; after rl1: eval_rl1, rollouts_evo, wm_evo, rl2, eval_rl2: 4 one-minute stages, 2 RL stages
    assert rl_minutes(config, stages[rl1:], {"a": 300.0, "b": 180.0}) == pytest.approx((12 - 4) / 2)
    assert rl_minutes(load_config("micro", ["loop.time_budget_min=20", "rl.time_limit_min=3"]), stages[rl1:], {"a": 480.0}) == 3
    assert rl_minutes(config, stages[rl1:], {"a": 1500.0}) == 0.5  # spent: half a minute
    argvs = []

    def verb(argv):
        argvs.append(argv)
        if argv[0] == "gate":
            write_gate(tmp_path / "gate", ["reach-v3"])
        return 0

    report = run_loop(config, tmp_path, Inputs(), "micro", [], verb=verb, stop_after="rl1")
    assert argvs[-1][0] == "rl" and any(a.startswith("rl.time_limit_min=") for a in argvs[-1]) and report.is_file()
    # an enforced gate names the RL stages' tasks, and only theirs: the evaluation after RL covers every task
    (tmp_path / STAGES_DIR / "rl1.json").unlink()
    argvs.clear()
    run_loop(load_config("micro", ["loop.gate_min_kappa=0.6"]), tmp_path, Inputs(), "micro", [], verb=verb, stop_after="eval_rl1")
    assert [a[0] for a in argvs] == ["rl", "eval"]
    assert argvs[0][argvs[0].index("--tasks") + 1] == "reach-v3" and "--tasks" not in argvs[1]
    with pytest.raises(ValueError, match="--until nope: not a stage"):
        run_loop(config, tmp_path, Inputs(), "micro", [], verb=verb, stop_after="nope")

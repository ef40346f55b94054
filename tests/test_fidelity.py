"""`worldloop fidelity`: the loop's data and VAE once, then train-wm / eval-wm / judge / gate per budget of minutes, and
tables that say what the stages' files say (the stages themselves are the loop's verbs, tested on their own)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worldloop.cli import main
from worldloop.config import load_config
from worldloop.fidelity import fidelity_table, plan_fidelity, run_fidelity

TASKS = {"reach-v3": 0.05, "door-open-v3": 0.5, "drawer-open-v3": 0.3}  # base success; reach lies outside 10-90 %


def fake_verb(calls: list[list[str]]):
    """Each verb writes what the tables read: the base evaluation, train-wm's results, eval-wm's metrics, the gate."""

    def verb(argv: list[str]) -> int:
        calls.append(argv)
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        budget = float(out.name.split("_")[-1].removesuffix("min")) if "min" in out.name else 0.0
        if argv[0] == "eval":
            (out / "results.json").write_text(json.dumps({"per_task": {t: {"success_once": s} for t, s in TASKS.items()}}))
        elif argv[0] == "train-vae":
            (out / "metrics.json").write_text(json.dumps({"held_out": {"psnr": 39.5}}))
        elif argv[0] == "train-wm":
            (out / "results.json").write_text(json.dumps({"steps": int(100 * budget), "train_seconds_this_run": 60 * budget}))
        elif argv[0] == "eval-wm":
            horizons = {h: {"psnr": 25 + budget, "copy_last_frame_psnr": 24, "psnr_margin_stderr": 0.3, "episodes": 4, "action_delta_psnr": 0.1 * budget,
                            "vae_psnr": 30.0} for h in ("8", "32")}  # fmt: skip
            (out / "metrics.json").write_text(json.dumps({"horizons": horizons}))
        elif argv[0] == "gate":
            kappa = min(1.0, 0.2 * budget)
            tasks = {t: {"kappa": None if t == "reach-v3" else kappa, "kappa_stderr": None if t == "reach-v3" else 0.1,
                         "auroc": None if t == "reach-v3" else 0.5 + budget / 10} for t in TASKS}  # fmt: skip
            (out / "gate.json").write_text(json.dumps({"tasks": tasks, "passed": [t for t in TASKS if t != "reach-v3" and kappa >= 0.6]}))
        return 0

    return verb


def test_fidelity_trains_each_budget_on_the_shared_data_and_tabulates_it(tmp_path):
    config = load_config("micro", ["loop.gate_min_kappa=0.6"])
    run = tmp_path / "run"
    names = [s.name for s in plan_fidelity(config, run, [2, 5])]
    assert names[-9:] == ["vae", "wm_2min", "eval_wm_2min", "judge_2min", "gate_2min", "wm_5min", "eval_wm_5min", "judge_5min", "gate_5min"]
    assert "rl1" not in names and "wm_base" not in names
    calls: list[list[str]] = []
    results = run_fidelity(config, run, [2, 5], "micro", [], verb=fake_verb(calls))
    trains = [argv for argv in calls if argv[0] == "train-wm"]
    assert [argv[argv.index("--out") + 1] for argv in trains] == [str(run / "wm_2min"), str(run / "wm_5min")]
    assert "world_model.time_limit_s=120" in trains[0] and "world_model.time_limit_s=300" in trains[1]  # a schedule per budget
    judges = [argv for argv in calls if argv[0] == "train-reward"]
    assert all(argv[argv.index("--world-model") + 1] == str(run / f"wm_{m}min") for argv, m in zip(judges, (2, 5)))  # learns its replays
    gates = [argv for argv in calls if argv[0] == "gate"]
    assert [argv[argv.index("--judge") + 1] for argv in gates] == [str(run / "judge_2min"), str(run / "judge_5min")]

    assert results["tasks_between"] == ["door-open-v3", "drawer-open-v3"]  # reach's 0.05 says nothing about kappa
    two, five = results["budgets"]
    assert two["horizons"]["8"]["margin"] == pytest.approx(3.0) and five["horizons"]["32"]["margin"] == pytest.approx(6.0)
    assert two["passed"] == [] and five["passed"] == ["door-open-v3", "drawer-open-v3"]
    table = (run / "fidelity.md").read_text()
    assert "| 2 | 200 | +3.00 ± 0.30 | +3.00 ± 0.30 | - | - | 0.20 | 30.00 |" in table
    assert "| 5 | +1.00 ± 0.10 (1.00) | +1.00 ± 0.10 (1.00) | 2 of 2 |" in table and "| 2 | +0.40 ± 0.10 (0.70) |" in table and "door-open-v3 (0.50)" in table
    assert "held-out PSNR 39.50 dB" in table.splitlines()[0]
    assert (run / "fidelity.png").is_file() and json.loads((run / "fidelity.json").read_text()) == json.loads(json.dumps(results))

    calls.clear()  # a rerun: every stage is done, the tables come again from the files
    assert run_fidelity(config, run, [2, 5], "micro", [], verb=fake_verb(calls)) == results and calls == []
    assert fidelity_table(results) == table


def test_fidelity_refuses_repeated_or_empty_budgets(tmp_path, capsys):
    assert main(["fidelity", "--preset", "micro", "--out", str(tmp_path / "r"), "--minutes", "2", "2"]) != 0
    assert "--minutes" in capsys.readouterr().err


def test_analyse_sets_a_recipes_training_runs_side_by_side_with_their_spread(tmp_path, capsys):
    """Two eval-wm folders of one recipe: each run's margin over copy-last-frame, the mean and the spread, per horizon
    both runs reached; one run alone is refused."""
    from worldloop.worldmodel.evaluate import recipe_runs

    def metrics(folder, margins):
        horizons = {h: {"psnr": 30.0 + m, "copy_last_frame_psnr": 30.0, "psnr_margin_stderr": 0.5, "episodes": 20} for h, m in margins.items()}
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "metrics.json").write_text(json.dumps({"horizons": horizons}))
        return str(tmp_path / folder)

    a, b = metrics("a", {"8": 4.0, "32": 8.0, "128": 9.0}), metrics("b", {"8": 3.0, "32": 6.5})
    assert main(["analyse", a, b]) == 0
    out = capsys.readouterr().out
    assert "| 8 | +4.00 ± 0.50 (20) | +3.00 ± 0.50 (20) | +3.50 | 1.00 |" in out
    assert "| 32 | +8.00 ± 0.50 (20) | +6.50 ± 0.50 (20) | +7.25 | 1.50 |" in out and "| 128 |" not in out
    with pytest.raises(ValueError, match="two or more training runs"):
        recipe_runs({a: json.loads((tmp_path / "a" / "metrics.json").read_text())})

"""The fidelity gate's verdicts, and what the loop does with them: the tasks RL trains on, the skipped stages, RL's time."""

from __future__ import annotations

import json

import pytest

from worldloop.diagnostics.gate import (GateEpisodes, GateRule, bootstrap_auroc, bootstrap_kappa, compare_rules, episode_scores, gate_table,
                                        gate_verdicts, ranking, replays_by_chunk, split)
from worldloop.diagnostics.gate import write_gate as write_gate_folder
from worldloop.config import ConfigError, load_config
from worldloop.loop import STAGES_DIR, Inputs, gate_arguments, plan, rl_minutes, run_loop


def episodes_of(per_task: dict[str, tuple[str, list[float], list[float]]]) -> GateEpisodes:
    """Gate episodes: per task (the simulator's verdicts '1100...', each episode's replay score, its real-frame score),
    every episode 3 chunks long with its score at the middle chunk."""
    gate = GateEpisodes([], [], [], [])
    for task, (real, replay, frames) in per_task.items():
        for verdict, r, f in zip(real, replay, frames):
            gate.task.append(task)
            gate.real.append(verdict == "1")
            gate.replay.append([0.0, r, 0.0])
            gate.frames.append([0.0, f, 0.0])
    return gate


def tracking(n: int, seed: int = 0) -> tuple[str, list[float], list[float]]:
    """A task the judge reads right on n episodes: successes score 0.9, failures 0.1 (one of each kind in every pair)."""
    real = "".join("1" if (i // 2) % 2 == 0 else "0" for i in range(n))
    return real, [0.9 if c == "1" else 0.1 for c in real], [0.9 if c == "1" else 0.1 for c in real]


def test_calibration_and_evaluation_episodes_never_overlap_and_the_threshold_sees_only_calibration():
    tasks = ["door"] * 5 + ["drawer"] * 4 + ["door"]
    halves = split(tasks)
    assert halves == ["calibration", "evaluation"] * 2 + ["calibration"] + ["calibration", "evaluation"] * 2 + ["evaluation"]
    for task in ("door", "drawer"):  # both halves hold every task
        assert {h for t, h in zip(tasks, halves) if t == task} == {"calibration", "evaluation"}
    gate = episodes_of({"door-open-v3": tracking(48)})
    rule = GateRule(success_chunks=1, min_kappa=0.6)
    before = gate_verdicts(gate, rule, fallback_threshold=0.5)
    assert before["episodes"] == {"calibration": 24, "evaluation": 24} and before["tasks"]["door-open-v3"]["episodes"] == 24
    # scrambling every evaluation episode's scores changes no threshold, only the verdicts measured on them
    evaluation = [i for i, h in enumerate(split(gate.task)) if h == "evaluation"]
    for i in evaluation:
        gate.replay[i] = [0.0, 0.95 if not gate.real[i] else 0.05, 0.0]
    after = gate_verdicts(gate, rule, fallback_threshold=0.5)
    assert after["threshold"] == before["threshold"] == 0.9
    assert before["tasks"]["door-open-v3"]["kappa"] == 1.0 and after["tasks"]["door-open-v3"]["kappa"] == -1.0


def test_a_planted_single_frame_false_positive_does_not_fool_the_episode_rule():
    """Every failure's replay has one chunk the judge calls a sure success (0.99) among low ones; every success holds
    0.8 over 3 chunks. Any one verdict (success_chunks 1) calls every episode a success at any threshold the successes
    pass; 2 consecutive verdicts read every episode right."""
    gate = GateEpisodes([], [], [], [])
    for i in range(48):
        success = (i // 2) % 2 == 0
        chunks = [0.1, 0.8, 0.8, 0.8, 0.1] if success else [0.1, 0.2, 0.99, 0.2, 0.1]
        gate.task.append("door-open-v3"), gate.real.append(success), gate.replay.append(chunks), gate.frames.append(chunks)
    assert list(episode_scores(gate.replay[:4], 2)) == [0.8, 0.8, 0.2, 0.2] and list(episode_scores(gate.replay[2:3], 1)) == [0.99]
    fooled = gate_verdicts(gate, GateRule(success_chunks=1), fallback_threshold=0.5)
    assert fooled["passed"] == [] and fooled["tasks"]["door-open-v3"]["auroc"] == 0.0  # every failure outscores every success
    robust = gate_verdicts(gate, GateRule(success_chunks=2), fallback_threshold=0.5)
    row = robust["tasks"]["door-open-v3"]
    assert robust["passed"] == ["door-open-v3"] and row["kappa"] == 1.0 and tuple(row["kappa_interval"]) == (1.0, 1.0)
    assert robust["real_frames"]["found"] == robust["real_frames"]["successes"] == 12 and robust["real_frames"]["false_successes"] == 0
    compared = {(r["success_chunks"], r["per_task"]): r for r in compare_rules(gate, GateRule(success_chunks=2), 0.5)}
    assert compared[(2, False)]["chosen"] and compared[(2, False)]["passed"] == 1 and compared[(1, False)]["passed"] == 0


def test_the_bootstrap_interval_matches_a_hand_computed_case():
    """Real 1, 0, 1 and judged 1, 0, 0: the 27 equally likely resamples, by how often each episode is drawn (a, b, c:
    the agreed success, the agreed failure, the miss). Each composition's kappa by hand:
    (3,0,0), (0,3,0): undefined (both verdicts constant and equal), left out;  (0,0,3): real all 1, judged all 0: 0;
    (2,1,0), (1,2,0): perfect, 1;  (2,0,1): real 1,1,1 judged 1,1,0: chance = q = 2/3, agreement 2/3: 0;
    (1,0,2): chance 1/3 = agreement: 0;  (0,2,1), (0,1,2): no judged success, agreement = chance: 0;
    (1,1,1): agreement 2/3, p = 2/3, q = 1/3, chance = 2/9 + 2/9 = 4/9: kappa (6/9 - 4/9) / (5/9) = 0.4.
    Multiplicities (multinomial, of 27): 1,1 left out; the rest: (0,0,3) 1; (2,1,0) 3; (1,2,0) 3; (2,0,1) 3; (1,0,2) 3;
    (0,2,1) 3; (0,1,2) 3; (1,1,1) 6; so of 25 defined: 0 x 13, 0.4 x 6, 1 x 6. Lower 2.5 % quantile: 0; upper 97.5 %:
    1 (the 25 * 0.975 = 24.4th value)."""
    assert bootstrap_kappa([1, 0, 1], [1, 0, 0], resamples=None) == pytest.approx((0.0, 1.0))
    # an 80 % interval: the quantiles at 0.1 (CDF 13/25 at 0) and 0.9 (CDF 19/25 at 0.4, 25/25 at 1)
    assert bootstrap_kappa([1, 0, 1], [1, 0, 0], resamples=None, level=0.8) == pytest.approx((0.0, 1.0))
    # a 20 % interval: the quantiles at 0.4 (0) and 0.6 (0.4: more than 13/25 lie at or below it)
    assert bootstrap_kappa([1, 0, 1], [1, 0, 0], resamples=None, level=0.2) == pytest.approx((0.0, 0.4))
    assert bootstrap_kappa([1, 1], [1, 1], resamples=None) is None  # every resample undefined
    low, high = bootstrap_kappa([1, 0] * 12, [1, 0] * 12)  # perfect agreement: every defined resample has kappa 1
    assert (low, high) == (1.0, 1.0)
    # the random bootstrap approximates the exact one
    real, judged = [1, 0, 1, 1, 0, 0], [1, 0, 0, 1, 1, 0]
    exact, sampled = bootstrap_kappa(real, judged, resamples=None), bootstrap_kappa(real, judged, resamples=20000, seed=1)
    assert exact == pytest.approx(sampled, abs=0.1)


def test_a_task_passes_only_with_kappa_above_the_bar_and_an_interval_clear_of_the_floor():
    gate = episodes_of({
        "door-open-v3": tracking(48),  # tracks: kappa 1
        "reach-v3": ("1" * 48, [0.9] * 48, [0.9] * 48),  # every real episode succeeded: kappa undefined
        # above the bar on 6 evaluation episodes with one false success (kappa 0.67), but its interval reaches far lower
        "window-open-v3": ("110011001100", [0.9, 0.9, 0.1, 0.1] * 2 + [0.9, 0.9, 0.1, 0.9], [0.5] * 12),
        # a judge no better than chance: the calibration half cannot tell successes from failures, nor the evaluation half
        "drawer-open-v3": ("1100" * 12, [0.9, 0.1] * 24, [0.5] * 48),
    })  # fmt: skip
    result = gate_verdicts(gate, GateRule(success_chunks=1, per_task=True, min_kappa=0.6, min_lower=0.3), fallback_threshold=0.5)
    why = {task: row["why_not"] for task, row in result["tasks"].items()}
    assert result["passed"] == ["door-open-v3"] and why["door-open-v3"] == ""
    assert "kappa undefined: all 24 evaluation episodes succeeded" in why["reach-v3"] and result["tasks"]["reach-v3"]["kappa"] is None
    assert "lower bound" in why["window-open-v3"] and result["tasks"]["window-open-v3"]["kappa"] == pytest.approx(2 / 3)
    assert "below 0.6" in why["drawer-open-v3"]
    table = gate_table(result)
    assert "| door-open-v3 | 24 | 0.50 ± 0.10 | 0.50 ± 0.10 | 1.00 ± 0.00 | [1.00, 1.00] | 1.00 | 1.00 | yes |" in table
    assert "| reach-v3 | 24 | 1.00 ± 0.00 | 1.00 ± 0.00 | undefined | - | - | undefined | no: kappa undefined" in table
    assert "Thresholds chosen on 78 calibration episodes; every number below from the other 78." in table
    assert "Judged on replays less real success, on the tasks meeting the bar (1 of 1 within 0.10): door-open-v3 +0.00." in table
    # not enforced: every task passes, and the table says the gate only measured, each task against the default bar
    loose = gate_verdicts(gate, GateRule(per_task=True, min_kappa=None), fallback_threshold=0.5)
    assert loose["passed"] == list(result["tasks"]) and [t for t, row in loose["tasks"].items() if row["meets_bar"]] == ["door-open-v3"]
    table = gate_table(loose)
    assert "not enforced (loop.gate_min_kappa: null): RL trains on every task, and each is measured against kappa >= 0.6" in table
    assert "| door-open-v3 | 24 |" in table and table.split("| door-open-v3 |")[1].split("\n")[0].endswith("| yes, not enforced; it meets the bar |")
    assert "| undefined | yes, not enforced; below the bar: kappa undefined: all 24 evaluation episodes succeeded |" in table


def test_the_ranking_interval_brackets_the_auroc_and_is_exact_where_the_order_is():
    assert bootstrap_auroc([0.9, 0.8, 0.2, 0.1], [1, 1, 0, 0]) == (1.0, 1.0)  # every resample with both classes ranks right
    assert bootstrap_auroc([0.1, 0.2, 0.8, 0.9], [1, 1, 0, 0]) == (0.0, 0.0)
    assert bootstrap_auroc([0.5, 0.5], [1, 0]) == (0.5, 0.5) and bootstrap_auroc([0.3, 0.4], [1, 1]) is None
    scores, real = [0.9, 0.7, 0.6, 0.4, 0.3, 0.2, 0.8, 0.1], [1, 1, 0, 1, 0, 0, 0, 1]
    low, high = bootstrap_auroc(scores, real)
    assert 0.0 <= low < 0.5625 < high <= 1.0  # 9 of the 16 success-failure pairs ranked right
    # per task, on the evaluation half, replays beside real frames: the replays of door-open rank at chance
    real_verdicts, _, _ = tracking(16)
    gate = episodes_of({"door-open-v3": (real_verdicts, [0.5] * 16, [0.9 if c == "1" else 0.1 for c in real_verdicts])})
    row = ranking(gate, gate_verdicts(gate, GateRule(), 0.5))["door-open-v3"]
    assert row["replays_auroc"] == 0.5 and row["replays_auroc_interval"] == (0.5, 0.5)
    assert row["real_frames_auroc"] == 1.0 and row["real_frames_auroc_interval"] == (1.0, 1.0)


def test_thresholds_chosen_on_the_real_frames_are_the_judges_own_read_on_replays():
    """Real frames score successes 0.9 and failures 0.1; the replays, blurrier, 0.7 and 0.3. Chosen on the replays,
    the threshold reads both right; chosen on the real frames it is 0.9 (the highest within an SE of the best), which
    reads the real frames right and no replay as a success."""
    real, _, _ = tracking(48)
    gate = episodes_of({"door-open-v3": (real, [0.7 if c == "1" else 0.3 for c in real], [0.9 if c == "1" else 0.1 for c in real])})
    on_replays = gate_verdicts(gate, GateRule(success_chunks=1), fallback_threshold=0.5)
    on_frames = gate_verdicts(gate, GateRule(success_chunks=1, calibrate_on="real_frames"), fallback_threshold=0.5)
    assert on_replays["threshold"] == 0.7 and on_replays["replays"]["kappa"] == on_replays["real_frames"]["kappa"] == 1.0
    assert on_frames["threshold"] == 0.9 and on_frames["real_frames"]["kappa"] == 1.0 and on_frames["tasks"]["door-open-v3"]["judged"] == 0.0
    assert on_frames["threshold_chosen_by"] == "max kappa on 24 calibration episodes' real frames"
    compared = compare_rules(gate, GateRule(success_chunks=1), 0.5)
    rows = {(r["success_chunks"], r["per_task"], r["calibrate_on"]): r for r in compared}
    assert rows[(1, False, "replays")]["chosen"] and rows[(2, False, "real_frames")]["real_frames_kappa"] == 0.0  # 2 in a row: no streak in 3 chunks
    with pytest.raises(ValueError, match="replays or real_frames"):
        GateRule(calibrate_on="frames")


def test_the_chunk_where_replays_part_from_the_real_frames_is_found(tmp_path):
    """Successes' frames and replays pass from chunk 2 on (a success of 3 chunks ends there); failures' real frames never
    pass, but their replays pass from chunk 4 on: replays and real frames agree through chunk 4 (2 consecutive verdicts
    make a success) and part at chunk 5, where every evaluation failure is a replay-only success."""
    gate = GateEpisodes([], [], [], [])
    for i in range(16):
        success, short = i % 4 in (0, 1), i % 8 == 1
        frames = [0.1, 0.9, 0.9] if short else [0.1, 0.9, 0.9, 0.9, 0.9] if success else [0.1] * 5
        replay = frames if success else [0.1, 0.1, 0.1, 0.9, 0.9]
        gate.task.append("drawer-open-v3"), gate.real.append(success), gate.replay.append(replay), gate.frames.append(frames)
    result = gate_verdicts(gate, GateRule(success_chunks=2), fallback_threshold=0.5)
    rows = {row["chunk"]: row for row in replays_by_chunk(gate, result)}
    assert sorted(rows) == [1, 2, 3, 4, 5] and all(row["episodes"] == 8 for row in rows.values())
    assert [rows[c]["running"] for c in (3, 4)] == [8, 6]  # the two short successes of the evaluation half ended at chunk 3
    assert rows[2]["judged_on_frames"] == 0.0 and rows[3]["judged_on_frames"] == rows[5]["judged_on_frames"] == 0.5  # kept after their end
    assert all(rows[c]["agreeing"] == 1.0 and rows[c]["replay_only"] == 0 for c in (1, 2, 3, 4))
    assert rows[5]["agreeing"] == 0.5 and rows[5]["replay_only"] == rows[5]["replay_only_real_failures"] == 4 and rows[5]["frames_only"] == 0
    written = write_gate_folder(tmp_path, gate, GateRule(success_chunks=2), 0.5, "runs/mw/judge")
    assert written["replays_by_chunk"] == list(rows.values())
    assert "| 5 | 6 / 8 | 0.50 | 1.00 | 0.50 | 4 (4) | 0 |" in gate_table(written)


def test_analyse_rebuilds_a_committed_gate_folder_from_its_episodes(tmp_path, capsys):
    from worldloop.cli import main

    gate = episodes_of({"door-open-v3": tracking(16), "reach-v3": ("0" * 16, [0.2] * 16, [0.2] * 16)})
    written = write_gate_folder(tmp_path, gate, GateRule(min_kappa=0.6), 0.5, "runs/mw/judge")
    (tmp_path / "gate.md").unlink()
    assert main(["analyse", str(tmp_path)]) == 0
    rebuilt = json.loads((tmp_path / "gate.json").read_text())
    assert rebuilt == json.loads(json.dumps(written)) and rebuilt["passed"] == ["door-open-v3"]
    assert "Episode rules on the same split" in (tmp_path / "gate.md").read_text()
    assert "gate.md and gate.json rebuilt" in capsys.readouterr().out


def test_judges_compare_on_the_same_episodes_paired_by_episode(tmp_path, capsys):
    from worldloop.cli import main

    real, right, _ = tracking(16)
    # the second judge's replays: wrong on 4 evaluation episodes (odd positions are the evaluation half), flipped
    wrong = [1.0 - r if i in (1, 3, 5, 7) else r for i, r in enumerate(right)]
    for name, replay in (("first", right), ("second", wrong)):
        write_gate_folder(tmp_path / name, episodes_of({"door-open-v3": (real, replay, right)}), GateRule(min_kappa=0.6), 0.5, name)
    assert main(["analyse", str(tmp_path / "first"), str(tmp_path / "second")]) == 0
    result = json.loads((tmp_path / "first" / "judges_compared.json").read_text())
    first, second = result["gates"]
    assert first["agreeing"] == 8 and (first["right_where_first_wrong"], first["wrong_where_first_right"]) == (0, 0) and first["sign_test_p"] is None
    assert second["agreeing"] == 4 and (second["right_where_first_wrong"], second["wrong_where_first_right"]) == (0, 4)
    assert second["sign_test_p"] == pytest.approx(2 * 0.5**4)  # two-sided exact: 4 of 4 discordant episodes one way
    assert "| 4 / 8 | 0 | 4 | 0.125 |" in capsys.readouterr().out
    # other real episodes: refused
    write_gate_folder(tmp_path / "other", episodes_of({"reach-v3": (real, right, right)}), GateRule(min_kappa=0.6), 0.5, "other")
    assert main(["analyse", str(tmp_path / "first"), str(tmp_path / "other")]) == 2
    assert "hold other real episodes" in capsys.readouterr().err


def write_gate(folder, passed: list[str], threshold: float = 0.5) -> None:
    """gate.json as `worldloop gate` writes it: the ``passed`` tasks track, reach-v3 does not unless passed."""
    per_task = {task: tracking(16) for task in passed}
    if "reach-v3" not in passed:
        per_task["reach-v3"] = ("10" * 8, [0.5] * 16, [0.5] * 16)
    folder.mkdir(parents=True, exist_ok=True)
    write_gate_folder(folder, episodes_of(per_task), GateRule(min_kappa=0.6, min_lower=0.3), threshold, "runs/judge")


def test_rl_stages_judge_as_the_gate_certified_on_the_tasks_it_passed(tmp_path):
    import argparse

    from worldloop.commands.rl import certified_by_gate

    write_gate(tmp_path, ["door-open-v3", "drawer-open-v3"])
    config = load_config("micro", ["loop.gate_min_kappa=0.6", "rl.judge_threshold=replay", "rl.success_chunks=1"])
    assert gate_arguments(config, tmp_path) == (["--gate", str(tmp_path)], [])
    gate = json.loads((tmp_path / "gate.json").read_text())
    gate["rule"]["success_chunks"], gate["task_thresholds"] = 2, {"door-open-v3": 0.77}
    (tmp_path / "gate.json").write_text(json.dumps(gate))
    args = argparse.Namespace(gate=str(tmp_path), judge="runs/judge", tasks=None)
    certified, own = certified_by_gate(args, config)
    # the gate's threshold, rule and tasks; no recalibration of RL's own
    assert certified.rl.judge_threshold == gate["threshold"] and certified.rl.success_chunks == 2 and own == {"door-open-v3": 0.77}
    assert args.tasks == "door-open-v3,drawer-open-v3"
    with pytest.raises(ConfigError, match="certified the judge runs/judge, not --judge other"):
        certified_by_gate(argparse.Namespace(gate=str(tmp_path), judge="other", tasks=None), config)
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
    # the gate speaks to the RL stages, and only to them: the evaluation after RL covers every task
    (tmp_path / STAGES_DIR / "rl1.json").unlink()
    argvs.clear()
    run_loop(load_config("micro", ["loop.gate_min_kappa=0.6"]), tmp_path, Inputs(), "micro", [], verb=verb, stop_after="eval_rl1")
    assert [a[0] for a in argvs] == ["rl", "eval"]
    assert argvs[0][argvs[0].index("--gate") + 1] == str(tmp_path / "gate") and "--gate" not in argvs[1] and "--tasks" not in argvs[1]
    with pytest.raises(ValueError, match="--until nope: not a stage"):
        run_loop(config, tmp_path, Inputs(), "micro", [], verb=verb, stop_after="nope")

"""Experiments (arms x seeds on shared base artifacts) and their analysis: the exact tests against hand-computed cases,
the orchestration with a stand-in for the verbs, and a rewarded arm against its shuffled control on the toy world."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from _rl_fixtures import ToyPolicy
from test_gate import write_gate
from test_rl_train import TASK, config, imagined

from worldloop.analysis import analyse, endpoint_analysis, write_analysis
from worldloop.cli import OVERRIDE, build_parser, main
from worldloop.config import load_config
from worldloop.envs.toy import ToyEnv
from worldloop.experiment import ARMS, gpu_slots, real_episode_budget, run_experiment
from worldloop.loop import Inputs
from worldloop.diagnostics.monitor import train_watched
from worldloop.diagnostics.reality import RealityCheck
from worldloop.rl.configuration import RLChecksConfig, RLDiagnosticsConfig
from worldloop.rl.evaluate import EVAL_SEED_OFFSET, evaluation_seeds
from worldloop.utils.stats import holm, mean_with_stderr, normal_p, paired_test, permutation_p, sign_flip_p, sign_test_p


def test_exact_tests_by_hand():
    # the sign test: 1 gained, 6 lost: 2 P(X <= 1), X ~ Bin(7, 1/2) = 2 (1 + 7) / 128
    assert sign_test_p(1, 6) == pytest.approx(0.125) and sign_test_p(6, 1) == pytest.approx(0.125)
    assert sign_test_p(0, 5) == pytest.approx(2 / 32) and sign_test_p(9, 2) == pytest.approx(2 * (1 + 11 + 55) / 2048)
    assert sign_test_p(0, 0) == 1.0 and sign_test_p(3, 3) == 1.0
    assert normal_p(1.959964) == pytest.approx(0.05, abs=1e-6)
    # paired: 4 episodes, 3 gained (0 -> 1), none lost: +0.75, SE sqrt(0.25 / 4) = 0.25, z = 3
    change = paired_test([0, 0, 0, 1], [1, 1, 1, 1])
    assert (change["difference"], change["stderr"], change["z"], change["p_exact"]) == pytest.approx((0.75, 0.25, 3.0, 0.25))
    assert paired_test([1, 0], [1, 0])["z"] is None  # no episode flipped: no z, p = 1
    # across seeds: mean 0.2, s^2 = 0.02, SE sqrt(0.02 / 2) = 0.1; one seed has no SE
    assert mean_with_stderr([0.1, 0.3]) == pytest.approx((0.2, 0.1)) and mean_with_stderr([0.4]) == (0.4, None)
    # sign flips over seeds: [1, 2, 3] only the two all-same-sign assignments reach |sum| 6
    assert sign_flip_p([1, 2, 3]) == pytest.approx(2 / 8)
    # [1, -2, 3, 4]: |10 - 2 s| >= 6 for subset sums s <= 2 or >= 8 of {1, 2, 3, 4}: 0, 1, 2 and 8, 9, 10: 6 of 16
    assert sign_flip_p([1, -2, 3, 4]) == pytest.approx(6 / 16)
    # two groups of 3: only the observed split and its mirror reach |2 - 5|
    assert permutation_p([1, 2, 3], [4, 5, 6]) == pytest.approx(2 / 20)
    # [0, 0, 1] against [1, 1, 1]: splits with k ones in the first group: |2k - 4| / 3 >= 2/3 for k = 1 (4 splits) and 3 (4)
    assert permutation_p([0, 0, 1], [1, 1, 1]) == pytest.approx(8 / 20)
    # Holm: sorted 0.01, 0.03, 0.04 of m = 3 -> 0.03, max(0.03, 0.06), max(0.06, 0.04); an untested task stays None
    assert holm([0.01, 0.04, 0.03, None]) == pytest.approx([0.03, 0.06, 0.06, None])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_exact_tests_agree_with_scipy():
    stats = pytest.importorskip("scipy.stats")
    for gained, lost in ((0, 7), (2, 9), (5, 5), (12, 3)):
        assert sign_test_p(gained, lost) == pytest.approx(stats.binomtest(gained, gained + lost, 0.5).pvalue)
    mean = lambda x, axis=-1: x.mean(axis=axis)  # noqa: E731
    values = [0.1, -0.05, 0.2, 0.15, 0.3]
    assert sign_flip_p(values) == pytest.approx(stats.permutation_test((values,), mean, permutation_type="samples", n_resamples=10**6).pvalue)
    first, second = [0.1, 0.25, 0.3, 0.2], [0.0, -0.1, 0.05, 0.2]
    difference = lambda x, y, axis=-1: x.mean(axis=axis) - y.mean(axis=axis)  # noqa: E731
    assert permutation_p(first, second) == pytest.approx(stats.permutation_test((first, second), difference, n_resamples=10**6).pvalue)


def test_the_real_arm_spends_the_full_arms_real_trajectories():
    # PACE: (3 base + 2 evolved: rl.refine.episodes_per_task) rollouts x 2 tasks, and 3 refinement rounds x 2 episodes
    # x 1 trained task in each of 2 RL stages
    full = load_config("micro", ["rl.refine.every=1", "rl.iterations=3", "rl.refine.episodes_per_task=2"])
    assert real_episode_budget(full, tasks=2, trained_tasks=1) == 10 + 12
    no_pace = load_config("micro", ["rl.refine.every=1", "rl.iterations=3", "rl.refine.episodes_per_task=2", "loop.pace=false"])
    assert real_episode_budget(no_pace, tasks=2, trained_tasks=1) == 6 + 6
    assert real_episode_budget(load_config("micro"), tasks=2, trained_tasks=2) == 8  # no refinement rounds


OUTCOMES = {"base": "0000", "full": "1101", "shuffled": "0100", "real_grpo": "1000"}
"""What the stand-in evaluation says each arm's final policy does on each task's 4 episodes."""


def fake_verb(calls: list, tasks: list[str], episodes: int, seed_offset: int, arm_seed_offset: int | None = None):
    """A stand-in for the worldloop verbs (in the working directory): evaluations write results.json with per-episode
    verdicts (the arms' from ``arm_seed_offset``'s initial states, when given), the gate passes every task, RL checks twice."""

    def verb(argv: list[str]) -> int:
        calls.append(argv)
        out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
        if argv[0] == "gate":
            write_gate(out, tasks)
        if argv[0] == "eval":
            arm = "base" if out.parent.name == "base" else out.parent.parent.name  # exp/base/eval_base, exp/arms/ARM/seedK/eval_rl2
            shift = int(next(a for a in argv if a.startswith("seed=")).split("=")[1]) if arm != "base" else 0
            verdict = OUTCOMES[arm][shift:] + OUTCOMES[arm][:shift]  # the seeds differ a little
            rate = {"success_once": verdict.count("1") / episodes, "stderr": 0.0}  # enough for the loop's report of the base
            per_task = {task: rate | {"per_episode": verdict, "episodes": episodes} for task in tasks}
            offset = seed_offset if arm == "base" or arm_seed_offset is None else arm_seed_offset
            out.mkdir(parents=True, exist_ok=True)
            (out / "results.json").write_text(json.dumps(rate | {"seeds": evaluation_seeds(tasks, episodes, offset), "episodes_per_task": episodes,
                                                                 "episodes": episodes * len(tasks), "per_task": per_task}))  # fmt: skip
        if argv[0] == "rl":
            out.mkdir(parents=True, exist_ok=True)
            checks = [{"iteration": i, "real": {"success_once": r, "episodes": 2}, "imagined": {"success_once": m}} for i, r, m in ((0, 0.0, 0.0), (2, 0.5, 1.0))]
            (out / "results.json").write_text(json.dumps({"evaluations": checks}))
        return 0

    return verb


def test_experiment_runs_the_base_once_every_arm_and_seed_resumes_and_analyses(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the stand-in writes under relative paths
    overrides = ["loop.eval_episodes_per_task=4", "rl.iterations=2", "loop.gate_min_kappa=0.6"]
    config = load_config("micro", overrides)
    tasks, calls = list(config.sim.tasks), []
    verb = fake_verb(calls, tasks, 4, EVAL_SEED_OFFSET)
    arms = ["full", "shuffled", "real_grpo"]
    run_experiment(config, "exp", Inputs(), "micro", overrides, arms, seeds=2, verb=verb, parallel=2, through_vae=True)

    assert [argv[0] for argv in calls].count("sft") == 1 and [argv[0] for argv in calls].count("gate") == 1  # the base, once
    rl = [argv for argv in calls if argv[0] == "rl"]
    assert len(rl) == 2 * 2 + 2 * 2 + 2  # full and shuffled: rl1 and rl2; real_grpo: rl1 only; x 2 seeds
    for argv in rl:
        assert ("seed=0" in argv) != ("seed=1" in argv)
        assert argv[argv.index("--judge") + 1] == "exp/base/judge" and "--gate" in argv  # the base's judge, as the gate certified it
        assert ("rl.diagnostics.shuffled_scores=true" in argv) == ("/shuffled/" in argv[argv.index("--out") + 1])
    real = [argv for argv in rl if "/real_grpo/" in argv[argv.index("--out") + 1]]
    budget = real_episode_budget(config, 2, 2)  # 8 real trajectories, 4 per iteration
    assert all(argv[1:3] == ["--env", "real"] and f"rl.iterations={budget // 4}" in argv and "--keyframes" not in argv for argv in real)
    assert json.loads((tmp_path / "exp" / "experiment.json").read_text())["real_episode_budget"]["episodes"] == budget == 8
    assert not any("--tasks" in argv or "--gate" in argv for argv in calls if argv[0] != "rl")  # evaluations keep the base evaluation's tasks
    parser = build_parser()  # every stage's command line is one the real CLI accepts
    for argv in calls:
        rest = parser.parse_known_args(argv)[1]
        assert all(OVERRIDE.fullmatch(a) for a in rest), (argv, rest)
    assert (tmp_path / "exp" / "arms" / "shuffled" / "seed1" / "stages" / "eval_rl2.json").is_file()

    vae_evals = [argv for argv in calls if argv[0] == "eval" and "--world-model" in argv]  # the secondary endpoint: base and 3 arms x 2 seeds
    assert len(vae_evals) == 7 and all(argv[argv.index("--world-model") + 1] == "exp/base/vae" for argv in vae_evals)

    calls.clear()  # a rerun resumes: nothing left to do
    run_experiment(config, "exp", Inputs(), "micro", overrides, arms, seeds=2, verb=verb, through_vae=True)
    assert calls == []

    verdicts = json.loads((tmp_path / "exp" / "verdicts.json").read_text())
    assert verdicts["base"]["real"] == {task: "0000" for task in tasks} and verdicts["arms"]["full"]["1"]["real"][tasks[0]] == "1011"
    assert main(["analyse", "exp"]) == 0
    result = json.loads((tmp_path / "exp" / "analysis.json").read_text())
    primary = result["endpoints"]["real"]
    # full: 3 of 4 episodes gained on each task in both seeds: +0.75, no spread across seeds
    assert primary["per_arm"]["full"]["change"] == pytest.approx(0.75) and primary["per_arm"]["full"]["stderr"] == pytest.approx(0.0)
    seed = primary["per_seed"]["full"]["0"]["overall"]
    assert (seed["gained"], seed["lost"], seed["p_exact"]) == (6, 0, pytest.approx(2 / 64))
    assert primary["versus_full"]["shuffled"]["difference"] == pytest.approx(0.25 - 0.75)
    assert primary["versus_full"]["shuffled"]["p_exact"] == pytest.approx(2 / 6)  # 2 seeds per arm: C(4, 2) = 6 splits
    assert result["imagined_vs_real"]["full"]["imagined"]["change"] == pytest.approx(1.0)
    text = (tmp_path / "exp" / "analysis.md").read_text()
    assert "| shuffled - full | 2, 2 | -0.500 |" in text and "## Primary endpoint" in text and "## Secondary endpoint" in text
    assert result["endpoints"]["through_vae"]["per_arm"]["full"]["change"] == pytest.approx(0.75)
    assert "| full | 2 | rl2 @ 2 | 0.000 -> 0.500 | +0.500 ± 0.000 |" in text  # RL's own checks, read where the arm ended
    # a committed folder (verdicts.json alone) gives the same analysis
    committed = tmp_path / "committed"
    committed.mkdir()
    (committed / "verdicts.json").write_text((tmp_path / "exp" / "verdicts.json").read_text())
    write_analysis(committed)
    assert json.loads((committed / "analysis.json").read_text()) == result


def test_with_several_gpus_each_arm_and_seed_runs_on_its_own(tmp_path, monkeypatch):
    """Given 2 GPUs, the 2 arm x seed runs go side by side, each run's stages seeing one GPU (CUDA_VISIBLE_DEVICES), the
    two runs different ones; the base stages keep every GPU. One GPU or none: no placement."""
    monkeypatch.chdir(tmp_path)
    overrides = ["loop.eval_episodes_per_task=4", "rl.iterations=2"]
    config = load_config("micro", overrides)
    calls: list = []
    stand_in = fake_verb(calls, list(config.sim.tasks), 4, EVAL_SEED_OFFSET)
    placed: dict[str, set] = {}

    def verb(argv: list[str], env: dict[str, str] | None = None) -> int:
        out = argv[argv.index("--out") + 1] if "--out" in argv else ""
        run = "/".join(Path(out).parts[:4]) if "/arms/" in out else "base"  # exp/arms/ARM/seedK
        placed.setdefault(run, set()).add((env or {}).get("CUDA_VISIBLE_DEVICES"))
        return stand_in(argv)

    run_experiment(config, "exp", Inputs(), "micro", overrides, ["full", "shuffled"], seeds=1, verb=verb, gpus=["0", "1"])
    assert placed.pop("base") == {None}
    assert sorted(placed) == ["exp/arms/full/seed0", "exp/arms/shuffled/seed0"]
    assert sorted(gpu for gpus in placed.values() for gpu in gpus) == ["0", "1"]  # one GPU per run, a different one each
    assert gpu_slots(3, ["0", "1"]) == ["0", "1", "0"] and gpu_slots(2, ["0"]) == [None, None] and gpu_slots(1, []) == [None]


def test_an_experiment_refuses_unknown_arms_and_evaluations_from_other_initial_states(tmp_path, monkeypatch, capsys):
    assert main(["experiment", "--preset", "micro", "--out", str(tmp_path / "x"), "--arms", "full,nope"]) == 2
    assert f"--arms: unknown arm(s) nope; the arms: {', '.join(ARMS)}" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    overrides = ["loop.eval_episodes_per_task=4"]
    config = load_config("micro", overrides)
    tasks = list(config.sim.tasks)
    verb = fake_verb([], tasks, 4, EVAL_SEED_OFFSET, arm_seed_offset=EVAL_SEED_OFFSET + 1)  # the arms' on other initial states
    with pytest.raises(ValueError, match="did not start from the base evaluation's initial states"):
        run_experiment(config, "exp", Inputs(), "micro", overrides, ["full"], 1, verb=verb)
    assert main(["analyse", str(tmp_path / "nothing")]) == 2 and "not an experiment folder" in capsys.readouterr().err


def test_a_rewarded_arm_beats_its_shuffled_control_on_the_toy_world_across_seeds(tmp_path):
    """RL in the toy world's imagination, rewarded and shuffled, three seeds each from one base policy; the analysis of their
    real per-episode verdicts (the same initial states as the base's) finds the rewarded arm above the control in every seed."""
    episodes = 96
    torch.manual_seed(0)
    base_policy = ToyPolicy()
    arms = {"full": {}, "shuffled": {}}
    base = None
    for arm, control in (("full", False), ("shuffled", True)):
        for seed in range(3):
            policy = ToyPolicy()
            policy.load_state_dict(base_policy.state_dict())
            torch.manual_seed(seed)
            check = RealityCheck(ToyEnv(episodes), [TASK], episodes, imagined_env=imagined(episodes, 1))
            rl = config(iterations=20, num_groups=8, checks=RLChecksConfig(every=0), diagnostics=RLDiagnosticsConfig(shuffled_scores=control))
            results = train_watched(policy, imagined(rl.num_groups * rl.group_size, rl.group_size), rl, tmp_path / f"{arm}{seed}", seed=seed,
                                    reality_check=check, console=False, progress_bar=False)  # fmt: skip
            first, last = results["evaluations"][0]["per_episode"]["real"], results["evaluations"][-1]["per_episode"]["real"]
            base = base or {TASK: first}  # the base policy's verdicts, from the first run's check before training
            arms[arm][str(seed)] = {TASK: last}
    block = endpoint_analysis(base, arms)
    full, shuffled = block["per_arm"]["full"], block["per_arm"]["shuffled"]
    assert all(full["per_seed"][s] > shuffled["per_seed"][s] for s in full["per_seed"]), (full, shuffled)
    versus = block["versus_full"]["shuffled"]
    assert versus["difference"] < -3 * versus["stderr"] and versus["p_exact"] == pytest.approx(2 / 20), versus  # the smallest p of 3 seeds
    assert full["change"] > 3 * full["stderr"] and math.isfinite(shuffled["change"])
    assert all(row["overall"]["p_exact"] < 0.01 for row in block["per_seed"]["full"].values())  # each rewarded seed, paired
    assert analyse({"tasks": [TASK], "episodes_per_task": episodes, "base": {"real": base},
                    "arms": {a: {s: {"real": v} for s, v in seeds.items()} for a, seeds in arms.items()}})["endpoints"]["real"] == block  # fmt: skip

"""Data parallelism on CPU with gloo: 2 processes train like 1 on the same global batch, resume, and only rank 0 writes."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import os
import socket
import tempfile

import pytest
import torch
from safetensors.torch import load_file

from worldloop.utils import distributed

CPU = torch.device("cpu")


def run_ranks(function, world_size: int, *args):
    """``function(*args)`` in ``world_size`` forked processes joined by gloo, as torchrun would start them; their
    return values in rank order."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as results:
        torch.multiprocessing.start_processes(_rank_main, args=(world_size, port, results, function, args), nprocs=world_size, join=True,
                                              start_method="fork")  # the children start with what this process imported
        return [torch.load(Path(results) / f"{rank}.pt", weights_only=False) for rank in range(world_size)]


def _rank_main(rank: int, world_size: int, port: int, results: str, function, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    distributed.init("cpu")
    try:
        torch.save(function(*args), Path(results) / f"{rank}.pt")
    finally:
        distributed.close()


def _counting_writes(function, *args):
    """``function(*args)`` while counting the checkpoint files and TensorBoard writers this process makes."""
    from worldloop.utils import checkpoint

    counts = {"checkpoint_files": 0, "summary_writers": 0}
    real_save, real_writer = checkpoint.save_file, distributed.summary_writer

    def save_file(*a, **k):
        counts["checkpoint_files"] += 1
        return real_save(*a, **k)

    def summary_writer(*a, **k):
        writer = real_writer(*a, **k)
        counts["summary_writers"] += not isinstance(writer, distributed._Silent)
        return writer

    checkpoint.save_file, distributed.summary_writer = save_file, summary_writer
    try:
        return function(*args), counts
    finally:
        checkpoint.save_file, distributed.summary_writer = real_save, real_writer


# ------------------------------------------------------------------------------------------------- world model


def _world_model_step(out: Path):
    from _worldmodel_fixtures import square_episodes, tiny_vae
    from worldloop.worldmodel.configuration import WorldModelConfig
    from worldloop.worldmodel.train import train_world_model

    config = WorldModelConfig(steps=1, batch_size=4, lr=1e-2, checkpoint_every=1000, sampling_steps=2,
                              clip_stride=4)  # fmt: skip
    _, counts = _counting_writes(train_world_model, config, square_episodes(3, seed=1, length=16), tiny_vae(), out, CPU)
    return counts


def test_world_model_step_on_two_ranks_matches_one_process(tmp_path):
    """One optimizer step on a global batch of 4 clips, 2 per gloo rank, gives the weights of one process's step on the
    same 4 clips (same noise, same dropped actions); rank 0 alone writes the checkpoint, TensorBoard and the model."""
    one = _world_model_step(tmp_path / "one")
    two = run_ranks(_world_model_step, 2, tmp_path / "two")
    assert one["checkpoint_files"] == 2 and [c["checkpoint_files"] for c in two] == [2, 0]  # dit and ema
    assert [c["summary_writers"] for c in two] == [1, 0]
    assert len(list((tmp_path / "two" / "tb").iterdir())) == 1
    assert (tmp_path / "two" / "results.json").is_file()
    first = load_file(tmp_path / "one" / "checkpoints" / "step_000000001" / "dit.safetensors")
    second = load_file(tmp_path / "two" / "checkpoints" / "step_000000001" / "dit.safetensors")
    for name, weight in first.items():
        torch.testing.assert_close(second[name], weight, rtol=1e-4, atol=1e-5, msg=name)
    # the step moved the weights far beyond that tolerance, so the comparison can fail: after the first step the EMA
    # holds 0.9 of it (decay 1/10), so the step is 10 times the distance between the weights and their EMA
    ema = load_file(tmp_path / "one" / "checkpoints" / "step_000000001" / "ema.safetensors")
    assert max(10 * float((first[name] - ema[name]).abs().max()) for name in first) > 5e-4


# ------------------------------------------------------------------------------------------------ policy SFT


def _sft(out: Path, stop_after: int | None):
    """SFT of the tiny VLA for 4 steps; with ``stop_after``, stopped there first and then resumed to the end."""
    from _policy_fixtures import CLOSE, IMAGE, OPEN, synthetic_episodes, tiny_config
    from worldloop.policies.sft import fit_policy

    config = tiny_config("sft.steps=4", "sft.batch_size=8")
    train, held = synthetic_episodes(4, length=6), synthetic_episodes(2, seed=1, length=6)
    if stop_after is not None:
        assert fit_policy(config, train, held, out, [OPEN, CLOSE], IMAGE, 4, stop_after=stop_after) == {"stopped_at": stop_after}
    results, counts = _counting_writes(fit_policy, config, train, held, out, [OPEN, CLOSE], IMAGE, 4)
    return results, counts


def test_sft_on_two_ranks_resumes_and_matches_one_process(tmp_path):
    """SFT over 2 gloo ranks (4 samples each of the global 8, the same shift draws), stopped after 2 steps and
    resumed by both ranks, ends with the weights of 4 straight steps in one process; rank 0 alone writes."""
    one, _ = _sft(tmp_path / "one", None)
    (two, counts), (two_rank1, counts_rank1) = run_ranks(_sft, 2, tmp_path / "two", 2)
    assert counts["checkpoint_files"] == 2 and counts_rank1["checkpoint_files"] == 0  # steps 3 and 4: every quarter of the 4
    assert [counts["summary_writers"], counts_rank1["summary_writers"]] == [1, 0]
    assert len(list((tmp_path / "two" / "tb").iterdir())) == 2  # the first run's events and the resumed run's
    timing = {"seconds", "seconds_per_step"}
    assert two["processes"] == 2 and {k: v for k, v in two_rank1.items() if k not in timing} == {k: v for k, v in two.items() if k not in timing}
    assert two["final_train_loss"] == pytest.approx(one["final_train_loss"], rel=1e-4)
    assert two["held_out_loss"] == pytest.approx(one["held_out_loss"], rel=1e-4)
    first, second = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    changed = load_file(tmp_path / "two" / "checkpoints" / "step_000000003" / "model.safetensors")
    for name, weight in first.items():  # atol 1e-4: the attention's key bias, which the softmax ignores, has only rounding
        torch.testing.assert_close(second[name], weight, rtol=1e-4, atol=1e-4, msg=name)  # as gradient, which Adam scales up
    # step 4 (an AdamW step of lr 0.003) moved the weights far beyond that tolerance, so the comparison can fail
    assert max(float((first[name].float() - changed[name].float()).abs().max()) for name in first) > 1e-3


# -------------------------------------------------------------------------------------------------------- RL


def _rl(out: Path):
    """2 GRPO iterations in the toy world with 4 groups of 4 over however many ranks run; what each rank started its
    environments from, its groups' scores and advantages, and its final weights."""
    from _rl_fixtures import ToyPolicy
    from worldloop.envs.toy import ToyEnv
    from worldloop.rl import trainer
    from worldloop.rl.configuration import RLConfig

    rl = RLConfig(iterations=2, group_size=4, num_groups=4, max_steps=16, lr=3e-3, update_epochs=2, num_minibatches=3, checkpoint_every=1)
    torch.manual_seed(0)
    policy, env = ToyPolicy(), ToyEnv(rl.num_groups // distributed.world_size() * rl.group_size)
    seen = {"seeds": [], "scores": [], "advantages": []}
    real_reset, real_advantages = env.reset, trainer.grpo_advantages

    def reset(tasks, seeds):
        seen["seeds"].append(list(seeds))
        return real_reset(tasks, seeds)

    def grpo_advantages(scores, group_size):
        advantages = real_advantages(scores, group_size)
        seen["scores"].append(scores.clone())
        seen["advantages"].append(advantages.clone())
        return advantages

    env.reset, trainer.grpo_advantages = reset, grpo_advantages
    try:
        results, counts = _counting_writes(trainer.train, policy, env, rl, out, 3, ["reach-top-right"], None, None, False)
    finally:
        trainer.grpo_advantages = real_advantages
    return seen, {k: v.clone() for k, v in policy.state_dict().items()}, counts, results


def test_rl_on_two_ranks_keeps_groups_whole_and_the_weights_equal(tmp_path):
    """2 ranks run 2 whole groups each, the groups one process would run (same initial states); the advantages each
    rank computes are those one process computes from the same scores (a group never straddles ranks); the
    all-reduced updates leave both ranks with the same weights, which moved; rank 0 alone writes."""
    from _rl_fixtures import ToyPolicy
    from worldloop.rl.advantages import grpo_advantages

    one, _, _, _ = _rl(tmp_path / "one")
    (first, weights, counts, results), (second, weights_rank1, counts_rank1, results_rank1) = run_ranks(_rl, 2, tmp_path / "two")
    for iteration in range(2):
        assert first["seeds"][iteration] + second["seeds"][iteration] == one["seeds"][iteration]
        assert len(set(first["seeds"][iteration]) & set(second["seeds"][iteration])) == 0  # no group on both ranks
        scores = torch.cat([first["scores"][iteration], second["scores"][iteration]])
        together = torch.cat([first["advantages"][iteration], second["advantages"][iteration]])
        torch.testing.assert_close(together, grpo_advantages(scores, 4))
    for name, weight in weights.items():
        torch.testing.assert_close(weights_rank1[name], weight, rtol=0, atol=1e-6, msg=name)
    torch.manual_seed(0)
    start = ToyPolicy().state_dict()
    assert max(float((weights[name] - start[name]).abs().max()) for name in start) > 1e-3
    assert counts["checkpoint_files"] == 2 and counts_rank1["checkpoint_files"] == 0  # a checkpoint per iteration
    assert results_rank1["history"] == results["history"] and len(results["history"]) == 2
    assert (tmp_path / "two" / "results.json").is_file() and len(list((tmp_path / "two" / "tb").iterdir())) == 1


def _shared_checks():
    """Rank 0's checks choose the judge's thresholds and keep one task; every rank returns what it then judges with."""
    from types import SimpleNamespace

    from worldloop.diagnostics.reality import shared_checks

    judge = SimpleNamespace(threshold=0.5, task_thresholds={})
    ran = []

    def rank_0_checks():
        ran.append(distributed.rank())
        judge.threshold, judge.task_thresholds = 0.9, {"open the door": 0.7}  # as calibrate_threshold applies its choice
        return "check", "calibration", ["door-open-v3"]

    check, calibration, kept = shared_checks(rank_0_checks, judge, ["door-open-v3", "reach-v3"])
    return ran, check, kept, judge.threshold, judge.task_thresholds


def test_rank_0_calibrates_the_judge_and_every_rank_judges_at_its_thresholds():
    """rl.judge_threshold=replay under torchrun: rank 0 alone runs the checks and the calibration; the other rank takes
    the thresholds it chose (per instruction too) and the tasks it kept, and has no check of its own."""
    first, second = run_ranks(_shared_checks, 2)
    assert first == ([0], "check", ["door-open-v3"], 0.9, {"open the door": 0.7})
    assert second == ([], None, ["door-open-v3"], 0.9, {"open the door": 0.7})


# ----------------------------------------------------------------------------------------------------- bench


RUNS: list = []  # (processes, global batch, steps) of every training run the bench timed, in this process


def _timed_run(config, clips, vae, steps, self_forcing, device):
    """Stands in for one world-model training run of the bench: 50 ms per step, whatever the batch."""
    import time

    RUNS.append((distributed.world_size(), config.world_model.batch_size, steps))
    time.sleep(0.05 * steps)


def _bench(out: Path):
    from worldloop.cli import main

    code = main(["bench", "wm-train", "--steps", "2", "--out", str(out)])
    return code, RUNS


def test_bench_wm_train_on_two_ranks_reports_one_process_against_two(tmp_path, monkeypatch):
    """`torchrun --nproc-per-node 2 -m worldloop bench wm-train`: per setting, rank 0 alone at the preset's batch (as one
    process), then both ranks with that batch each, and the scaling efficiency of the two; rank 0 alone writes the
    report. (The training runs themselves stand in here: the tests above train for real on 2 ranks.)"""
    import json

    from worldloop.config import load_config
    from worldloop.worldmodel import bench_train

    monkeypatch.setattr(bench_train, "train_wm", _timed_run)
    (code, runs), (code_rank1, runs_rank1) = run_ranks(_bench, 2, tmp_path / "bench.txt")
    batch = load_config("tiny-cpu", []).world_model.batch_size
    assert code == code_rank1 == 0
    assert {run for run in runs if run[0] == 1} == {(1, batch, 2), (1, batch, 1)}  # rank 0 alone: one process's run
    assert {run for run in runs_rank1} == {run for run in runs if run[0] == 2} == {(2, 2 * batch, 2), (2, 2 * batch, 1)}
    rows = json.loads((tmp_path / "bench.json").read_text())
    assert [(r["processes"], r["batch"]) for r in rows] == [(1, batch), (2, 2 * batch)] * 2
    for one, two in (rows[:2], rows[2:]):
        assert one["scaling_efficiency"] == 1.0 and two["clips_per_s_per_process"] == pytest.approx(two["clips_per_s"] / 2)
        assert two["scaling_efficiency"] == pytest.approx(two["clips_per_s"] / (2 * one["clips_per_s"]))
        assert 0.7 < two["scaling_efficiency"] < 1.3  # both take 50 ms a step: twice the clips in the same time
    assert "scaling efficiency" in (tmp_path / "bench.txt").read_text()


# ------------------------------------------------------------------------------------------------- the CLI


def _verb_in_ranks(out: Path, overrides: list[str]):
    """A verb that writes a run folder, run by the CLI as torchrun would start it: who ran it, what each rank returned
    or raised; and what a verb that trains in one process only says under torchrun."""
    import types

    from worldloop.cli import build_parser, main, run_command
    from worldloop.commands import train_vae
    from worldloop.config import ConfigError, load_config

    ran = []
    verb = types.SimpleNamespace(RUN=train_vae.RUN, DISTRIBUTED=True, run=lambda args, config: ran.append(distributed.rank()) or 0)
    args = build_parser().parse_args(["train-vae", "--dataset", "d", "--out", str(out)])
    args._module, args.overrides = verb, overrides
    try:
        outcome = run_command(args, load_config("tiny-cpu", overrides))
    except Exception as error:
        outcome = f"{type(error).__name__}: {error}"
    distributed.init("cpu")  # the verb left the process group at its end: join it again for the next one
    try:
        refused = run_command(build_parser().parse_args(["config"]), load_config("tiny-cpu", []))
    except ConfigError as error:
        refused = str(error)
    return outcome, ran, refused


def test_the_cli_claims_the_run_folder_on_rank_0_and_every_rank_runs_the_verb(tmp_path):
    """Rank 0 holds the run folder's claim and tells the others: both run the verb once; rerun, the finished run does
    nothing on either; a folder that holds another run refuses on every rank with rank 0's reason. A verb that
    trains in one process only refuses to start under torchrun."""
    first = run_ranks(_verb_in_ranks, 2, tmp_path / "vae", [])
    assert [(outcome, ran) for outcome, ran, _ in first] == [(0, [0]), (0, [1])]
    assert "runs as one process; torchrun started 2" in first[0][2]
    again = run_ranks(_verb_in_ranks, 2, tmp_path / "vae", [])
    assert [(outcome, ran) for outcome, ran, _ in again] == [(0, []), (0, [])]  # finished: nothing to do
    other = run_ranks(_verb_in_ranks, 2, tmp_path / "vae", ["vae.steps=7"])
    assert [ran for _, ran, _ in other] == [[], []]
    assert other[0][0].startswith("RunRefused") and other[1][0].startswith("RunError: rank 0 could not claim")

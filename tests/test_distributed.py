"""Data parallelism on CPU with gloo: 2 processes train like 1 on the same global batch, resume, and only rank 0 writes."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import json
import os
import socket
import tempfile
import time

import pytest
import torch

from worldloop.utils import distributed

CPU = torch.device("cpu")


RANKS_TIMEOUT_S = 300
"""How long the ranks of one :func:`run_ranks` may take: a rank left waiting in a collective fails the test, not CI."""


def run_ranks(function, world_size: int, *args):
    """``function(*args)`` in ``world_size`` forked processes joined by gloo, as torchrun would start them; their
    return values in rank order."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as results:
        ranks = torch.multiprocessing.start_processes(_rank_main, args=(world_size, port, results, function, args), nprocs=world_size,
                                                      join=False, start_method="fork")  # the children start with what this process imported
        deadline = time.monotonic() + RANKS_TIMEOUT_S
        while not ranks.join(timeout=1):
            if time.monotonic() > deadline:
                for process in ranks.processes:
                    process.kill()
                pytest.fail(f"{function.__name__} on {world_size} ranks did not finish in {RANKS_TIMEOUT_S} s (a rank waits for one that left)")
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


def _recording_gradients(function, *args):
    """``function(*args)`` while recording, at every optimizer step, the gradients the ranks averaged (in parameter
    order; one process records its own): the quantity data parallelism promises to reproduce. The weights after an
    Adam step are not: a step moves every weight by about lr whatever its gradient's size, so an element whose
    gradient nearly cancels turns the rounding difference between one mean of 4 and two means of 2 into a move of
    order lr."""
    steps = []
    real = distributed.average_gradients

    def average_gradients(parameters):
        parameters = [p for p in parameters if p.requires_grad]
        real(parameters)
        steps.append([torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in parameters])

    distributed.average_gradients = average_gradients
    try:
        return function(*args), steps
    finally:
        distributed.average_gradients = real


def assert_same_gradients(steps, reference, rtol: float) -> None:
    """The averaged gradients of each step equal the reference's, each tensor within ``rtol`` of its own largest
    element (the rounding of a mean scales with the gradient); and they are not all zero, so the check can fail."""
    assert len(steps) == len(reference) > 0
    for step, (grads, expected) in enumerate(zip(steps, reference)):
        assert len(grads) == len(expected)
        for index, (grad, want) in enumerate(zip(grads, expected)):
            scale = float(want.abs().max())
            torch.testing.assert_close(grad, want, rtol=rtol, atol=rtol * scale + 1e-12, msg=f"step {step}, parameter {index}")
    assert max(float(g.abs().max()) for grads in reference for g in grads) > 1e-3


# ------------------------------------------------------------------------------------------------- world model


def _world_model_step(out: Path):
    from _worldmodel_fixtures import square_episodes, tiny_vae
    from worldloop.worldmodel.configuration import WorldModelConfig
    from worldloop.worldmodel.train_dit import train_world_model

    config = WorldModelConfig(steps=1, batch_size=4, lr=1e-2, checkpoint_every=1000, sampling_steps=2,
                              clip_stride=4)  # fmt: skip
    (_, counts), gradients = _recording_gradients(_counting_writes, train_world_model, config,
                                                  square_episodes(3, seed=1, length=16), tiny_vae(), out, CPU)
    return counts, gradients


def test_world_model_step_on_two_ranks_matches_one_process(tmp_path):
    """One optimizer step on a global batch of 4 clips, 2 per gloo rank, averages to the gradient of one process's
    step on the same 4 clips (same noise, same dropped actions), and both ranks step alike; rank 0 alone writes the
    checkpoint, TensorBoard and the model."""
    one, one_gradients = _world_model_step(tmp_path / "one")
    (counts, gradients), (counts_rank1, gradients_rank1) = run_ranks(_world_model_step, 2, tmp_path / "two")
    assert one["checkpoint_files"] == 2 and [counts["checkpoint_files"], counts_rank1["checkpoint_files"]] == [2, 0]  # dit, ema
    assert [counts["summary_writers"], counts_rank1["summary_writers"]] == [1, 0]
    assert len(list((tmp_path / "two" / "tb").iterdir())) == 1
    assert (tmp_path / "two" / "results.json").is_file()
    assert_same_gradients(gradients, one_gradients, rtol=1e-4)
    for rank0, rank1 in zip(gradients[0], gradients_rank1[0]):  # one all-reduce: the ranks hold the same bits
        assert torch.equal(rank0, rank1)


# ------------------------------------------------------------------------------------------------ policy SFT


def _sft(out: Path, stop_after: int | None):
    """SFT of the tiny VLA for 4 steps; with ``stop_after``, stopped there first and then resumed to the end."""
    from _policy_fixtures import CLOSE, IMAGE, OPEN, synthetic_episodes, tiny_config
    from worldloop.policies.sft import fit_policy

    config = tiny_config("sft.steps=4", "sft.batch_size=8")
    train, held = synthetic_episodes(4, length=6), synthetic_episodes(2, seed=1, length=6)
    if stop_after is not None:
        assert fit_policy(config, train, held, out, [OPEN, CLOSE], IMAGE, 4, stop_after=stop_after) == {"stopped_at": stop_after}
    (results, counts), gradients = _recording_gradients(_counting_writes, fit_policy, config, train, held, out, [OPEN, CLOSE], IMAGE, 4)
    return results, counts, gradients


def test_sft_on_two_ranks_resumes_and_matches_one_process(tmp_path):
    """SFT over 2 gloo ranks (4 samples each of the global 8, the same shift draws), stopped after 2 steps and
    resumed by both ranks, takes the steps 3 and 4 of 4 straight steps in one process: the same averaged gradients
    (so the same weights to the rounding) and the same losses; rank 0 alone writes."""
    one, _, one_gradients = _sft(tmp_path / "one", None)
    (two, counts, gradients), (two_rank1, counts_rank1, _) = run_ranks(_sft, 2, tmp_path / "two", 2)
    assert counts["checkpoint_files"] == 2 and counts_rank1["checkpoint_files"] == 0  # steps 3 and 4: every quarter of the 4
    assert [counts["summary_writers"], counts_rank1["summary_writers"]] == [1, 0]
    assert len(list((tmp_path / "two" / "tb").iterdir())) == 2  # the first run's events and the resumed run's
    timing = {"seconds", "seconds_per_step"}
    assert two["processes"] == 2 and {k: v for k, v in two_rank1.items() if k not in timing} == {k: v for k, v in two.items() if k not in timing}
    assert two["final_train_loss"] == pytest.approx(one["final_train_loss"], rel=1e-4)
    assert two["held_out_loss"] == pytest.approx(one["held_out_loss"], rel=1e-4)
    # the resumed steps see the weights and Adam moments of steps 1-2 (step 4's gradient depends on step 3's update);
    # rtol 1e-3, not 1e-4: an element whose gradient is only rounding (the attention's key bias, which the softmax
    # ignores) moves by about lr in steps 1-2 whichever way its rounding falls, and that reaches the later gradients
    assert_same_gradients(gradients, one_gradients[2:], rtol=1e-3)


def _oft_sft(out: Path, checkpoint: Path, dataset: Path):
    """3 SFT steps of the tiny OpenVLA-OFT checkpoint (LoRA and heads) on a global batch of 4."""
    from worldloop.config import load_config
    from worldloop.policies.openvla_oft.sft import finetune_openvla_oft

    config = load_config("micro", ["sft.steps=3", "sft.batch_size=4", "sft.lr=0.001"])
    (results, counts), gradients = _recording_gradients(_counting_writes, finetune_openvla_oft, config,
                                                        f"openvla-oft:{checkpoint}", dataset, out)
    return results, counts, gradients


def test_openvla_oft_sft_on_two_ranks_matches_one_process(tmp_path, tiny_dataset):
    """OpenVLA-OFT's SFT over 2 gloo ranks (2 samples each of the global 4, the same shift draws) averages, step by
    step, to the gradients of one process (LoRA and heads); rank 0 alone writes the model and TensorBoard."""
    from _oft_fixtures import write_tiny_checkpoint

    checkpoint = write_tiny_checkpoint(tmp_path / "openvla-7b-oft-tiny")
    one, _, one_gradients = _oft_sft(tmp_path / "one", checkpoint, tiny_dataset)
    (two, counts, gradients), (two_rank1, counts_rank1, _) = run_ranks(_oft_sft, 2, tmp_path / "two", checkpoint, tiny_dataset)
    assert [counts["summary_writers"], counts_rank1["summary_writers"]] == [1, 0]
    assert two["processes"] == 2 and two_rank1["final_train_loss"] == two["final_train_loss"]
    assert two["final_train_loss"] == pytest.approx(one["final_train_loss"], rel=1e-4)
    assert (tmp_path / "two" / "sft_results.json").is_file()
    assert_same_gradients(gradients, one_gradients, rtol=1e-3)  # steps 2-3 see weights that Adam moved (see the SFT test)


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


def _rl_checks_and_one_iteration(out: Path, overrides: list[str]):
    """rl's checks (rl_checks: the judge's replay calibration with rl.train_tasks=tracked, then the reality check) in
    the toy world, real and imagined, over however many ranks run; then one GRPO iteration watched by the monitor,
    which checks before and after it. What each rank's calibration and checks found and what the run kept."""
    from _rl_fixtures import ToyPolicy
    from test_rl_env import make_pool

    from worldloop.config import load_config
    from worldloop.diagnostics import reality
    from worldloop.diagnostics.monitor import train_watched
    from worldloop.envs.imagined import ImaginedEnv
    from worldloop.envs.toy import ToyEnv, ToyJudge, ToyWorldModel

    def toy_imagined(config, world_model, judge, dataset, keyframes, num_envs, group_size, max_steps, device, kir_ratio=None):
        return ImaginedEnv(world_model, judge, make_pool(32, 3), num_envs, group_size, max_steps, kir_ratio=kir_ratio or 0.0)

    made = []

    def toy_env(config, num_envs, tasks):
        made.append(num_envs)
        return ToyEnv(num_envs, tasks=tasks)

    tasks = ["reach-top-right", "reach-bottom-left"]
    real_functions = reality.make_env, reality.imagined_env, reality.eval_seed
    reality.make_env, reality.imagined_env = toy_env, toy_imagined  # the toy world, and its tasks' seeds, in place of Meta-World's
    reality.eval_seed = lambda task, episode: 1000 * tasks.index(task) + episode
    try:
        config = load_config("tiny-cpu", ["rl.checks.episodes_per_task=24", "rl.judge_threshold=replay", "rl.train_tasks=tracked", "eval.greedy=true", "eval.videos_per_task=2",
                                          "rl.diagnostics.imagined_actions_in_reality=true",
                                          "rl.checks.tasks=[]", "rl.iterations=1", "rl.checks.every=1", "rl.num_groups=2", "rl.group_size=4", "rl.max_steps=16", *overrides])  # fmt: skip
        torch.manual_seed(0)
        policy, judge, closers = ToyPolicy(), ToyJudge(threshold=1e-3), []
        check, calibration, kept = reality.rl_checks(config, policy, ToyWorldModel(), judge, None, "cpu", closers, tasks, out)
        env = ImaginedEnv(ToyWorldModel(), judge, make_pool(32, 3), distributed.share(2, "rl.num_groups") * 4, 4, 16, kir_ratio=0.0)
        results = train_watched(policy, env, config.rl, out, reality_check=check, tasks=[0], console=False)
    finally:
        reality.make_env, reality.imagined_env, reality.eval_seed = real_functions
        for opened in closers:
            opened.close()
    calibrated = json.loads((out / "judge_calibration.json").read_text()) if (out / "judge_calibration.json").is_file() else None
    evaluations = [{k: v for k, v in e.items() if k != "seconds"} for e in (results or {}).get("evaluations", [])]
    return {"calibrated": calibrated, "threshold": judge.threshold, "kept": kept, "envs": made, "evaluations": evaluations,
            "labelled": calibration.labelled, "seeds": [check.seeds[i] for i in check.mine]}  # fmt: skip


def test_rl_checks_on_two_ranks_find_what_one_process_finds(tmp_path):
    """rl.judge_threshold=replay and the reality checks under torchrun: each rank runs half of every check's episodes
    (half the simulator envs, every other episode), and every rank ends with what one process finds: the same
    calibrated threshold, per-episode replay scores and kept tasks, and at the first check the same verdicts, episode
    by episode, and summaries (greedy policy). The monitor on each rank sees every episode at each check; rank 0 alone
    writes the calibration, its episodes (all of them) and the videos."""
    import json

    one = _rl_checks_and_one_iteration(tmp_path / "one", [])
    first, second = run_ranks(_rl_checks_and_one_iteration, 2, tmp_path / "two", [])
    # the calibration's simulator envs (2 tasks x 24 episodes), then the check's on the one task tracked (rl.train_tasks=tracked)
    assert one["envs"] == [48, 24] and first["envs"] == second["envs"] == [24, 12]
    assert first["seeds"] + second["seeds"] != one["seeds"] and sorted(first["seeds"] + second["seeds"]) == sorted(one["seeds"])
    assert first["seeds"] == one["seeds"][0::2] and second["seeds"] == one["seeds"][1::2]  # dealt in turn
    calibrated = one["calibrated"]
    assert calibrated["calibrated"] and 0 < calibrated["real"]["success_once"] < 1, calibrated  # successes and failures to choose on
    scores = [result["calibrated"]["per_episode"].pop("score") for result in (one, first)]
    assert scores[1] == pytest.approx(scores[0], rel=1e-5, abs=1e-12)  # the same replays, in batches of another size
    assert first["calibrated"] == {**calibrated, "seconds": first["calibrated"]["seconds"]}  # each episode's verdict included
    assert second["calibrated"] is not None  # the file rank 0 wrote, read after the run
    assert one["threshold"] == first["threshold"] == second["threshold"] == calibrated["threshold"] != 1e-3
    assert one["kept"] == first["kept"] == second["kept"] == ["reach-top-right"]  # the other task's replays all fail: no kappa
    saved = torch.load(tmp_path / "two" / "judge_calibration_episodes.pt", weights_only=True)
    alone = torch.load(tmp_path / "one" / "judge_calibration_episodes.pt", weights_only=True)
    assert torch.equal(saved["frames"], alone["frames"]) and saved["instructions"] == alone["instructions"]
    assert torch.equal(saved["success_once"], alone["success_once"])
    assert len(saved["instructions"]) == 48 and torch.equal(first["labelled"].success_once, alone["success_once"][0::2])  # each rank keeps its own
    # the first check, before any training: every verdict and summary as one process's
    for rank in (first, second):
        assert rank["evaluations"][0] == one["evaluations"][0]
    start = one["evaluations"][0]
    assert set(start["per_episode"]) == {"real", "imagined", "judged_real", "replayed", "imagined_actions_in_reality"}
    assert 0 < start["real"]["success_once"] < 1 and start["tracking"] and start["imagined_actions_in_reality"]["versus_closed_loop"]
    # after the iteration (each rank sampled its own rollouts): both ranks hold the same check of all the episodes
    assert len(first["evaluations"]) == 2 and first["evaluations"] == second["evaluations"]
    assert len(first["evaluations"][1]["per_episode"]["real"]) == 24
    written = sorted(path.name for path in (tmp_path / "two" / "videos").iterdir())  # rank 0's: of episodes 0, 2, 4, ...
    assert written == [f"iteration_{i:04d}_reach-top-right_{n:02d}.mp4" for i in (0, 1) for n in (0, 2)]
    assert json.loads((tmp_path / "two" / "evaluations.json").read_text())["evaluations"][0]["per_episode"] == start["per_episode"]
    # rerun, the finished run takes its calibration back: each rank its threshold and its own share of the saved episodes
    for before, again in zip((first, second), run_ranks(_rl_checks_and_one_iteration, 2, tmp_path / "two", [])):
        assert again["threshold"] == before["threshold"] and again["evaluations"] == before["evaluations"]
        chunks = before["labelled"].actions.shape[1]  # the saved episodes are padded to the longest rank's
        assert torch.equal(again["labelled"].first.frames, before["labelled"].first.frames)
        assert torch.equal(again["labelled"].actions[:, :chunks], before["labelled"].actions)
        assert torch.equal(again["labelled"].success_once, before["labelled"].success_once)


def _refining_rl(out: Path):
    """One GRPO iteration in the toy world followed by a refinement round of a tiny world model, over however many ranks
    run, with rl.judge_threshold=replay's calibration chosen again after the round. Each rank's world-model DiT before
    and after, the calibrated threshold, the judge's threshold after the round, and the results."""
    from _rl_fixtures import ToyPolicy
    from _worldmodel_fixtures import square_episodes, tiny_vae
    from test_rl_env import make_pool

    from worldloop.diagnostics.monitor import train_watched
    from worldloop.diagnostics.reality import RealityCheck
    from worldloop.envs.imagined import ImaginedEnv
    from worldloop.envs.toy import ToyEnv, ToyJudge, ToyWorldModel
    from worldloop.rl.configuration import RLConfig, RLRefineConfig
    from worldloop.rl.refine import WorldModelRefiner
    from worldloop.worldmodel.configuration import WorldModelConfig
    from worldloop.worldmodel.rollout import WorldModel

    clips, task, main = WorldModelConfig(batch_size=4, clip_stride=4, sampling_steps=1), "reach-top-right", distributed.is_main()
    torch.manual_seed(1)
    world_model = WorldModel.build(clips, tiny_vae(), 32, 2, device="cpu")
    before = [p.detach().clone() for p in world_model.dit.parameters()]
    rl = RLConfig(iterations=1, group_size=4, num_groups=2, max_steps=16, lr=3e-3, checkpoint_every=1,
                  refine=RLRefineConfig(every=1, episodes_per_task=4, steps=3))  # fmt: skip
    refiner = WorldModelRefiner(world_model, ToyEnv(4, max_steps=32) if main else None, [task], square_episodes(2, seed=1, length=24) if main else (),
                                rl, clips, out, seed=0, lr=1e-3, ema_decay=0.5)  # rank 0 alone collects and learns  # fmt: skip
    judge, here = ToyJudge(threshold=1e-3), len(distributed.dealt(32))
    calibration = RealityCheck(ToyEnv(here), [task], 32, imagined_env=ImaginedEnv(ToyWorldModel(), judge, make_pool(32, 3), here, 1, max_steps=16, kir_ratio=0.0),
                               seeds=[5000 + e for e in range(32)])  # fmt: skip
    torch.manual_seed(0)
    policy = ToyPolicy()
    calibrated = calibration.calibrate_judge(policy, 1.0)["threshold"]
    judge.threshold, refiner.judge_check = 1e-3, calibration  # the round chooses it again
    env = ImaginedEnv(ToyWorldModel(), ToyJudge(), make_pool(32, 3), distributed.share(rl.num_groups, "rl.num_groups") * 4, 4, max_steps=16, kir_ratio=0.3)
    results = train_watched(policy, env, rl, out, seed=3, refiner=refiner, console=False)
    return before, [p.detach().clone() for p in world_model.dit.parameters()], calibrated, judge.threshold, results


def test_a_refinement_round_on_two_ranks_leaves_every_rank_in_the_same_refined_world_model(tmp_path):
    """rl.refine.every under torchrun: rank 0 collects the real rollouts and fine-tunes the world model; every rank's
    imagined environment then holds its refined weights, and every rank's judge the threshold chosen again on all the
    calibration's episodes (each rank replaying its own); rank 0 alone writes the refined model."""
    (before, after, calibrated, threshold, results), (before_1, after_1, calibrated_1, threshold_1, results_1) = run_ranks(_refining_rl, 2, tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(before, before_1))
    assert all(torch.equal(a, b) for a, b in zip(after, after_1))  # the same refined world model on both ranks
    assert max(float((a - b).abs().max()) for a, b in zip(after, before)) > 1e-4  # which the round changed
    assert calibrated == calibrated_1 != 1e-3 and threshold == threshold_1 == calibrated  # the toy judge's world is unchanged: the same choice
    assert results_1["history"] == results["history"] and "world_model/refine_loss" in results["history"][0]
    assert results["history"][0]["world_model/judge_threshold"] == threshold
    assert (tmp_path / "world_model").is_dir() and len(list((tmp_path / "refine").glob("round_*.safetensors"))) == 1


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
    try:  # refused before it joins a process group (the verb above left its own at its end)
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

"""``worldloop rl``: post-train a policy with masked GRPO (or PPO) in imagination or in the real simulator."""

from __future__ import annotations

import argparse

from worldloop.config import Config, ConfigError
from worldloop.utils.runfolder import RunSpec

HELP = """Post-train a policy with RL (masked GRPO by default, rl.algorithm=ppo for PPO) into --out RUN.

--env imagined (default): episodes run in --world-model, judged by --judge (a classifier folder
or topreward:PATH), starting from the first frames of --dataset and, for a fraction rl.kir_ratio
of the groups, from the KIR keyframes in --keyframes (written by `worldloop kir`).
--env real: GRPO straight in the real simulator (the baseline that spends real trajectories).
Every rl.eval_every iterations the policy is evaluated in the real simulator on rl.eval_tasks and,
from the same initial states, in imagination (the imagination-reality gap), and the gap is traced: the
judge on the real episodes' frames, and the world model replaying their actions open loop. RUN holds config.yaml,
tb/ (TensorBoard), checkpoints/ (rerun to resume), results.json, results.md, curves.png, policy/ (final)
and videos/ (real | replay of its actions in the world model | imagined, from the same initial state at each evaluation).
With rl.refine_every > 0 the world model also learns, every that many iterations, from the policy's own real
rollouts (rl.refine_episodes_per_task per task; OUT/refine keeps their clips, OUT/world_model the refined model).
Example: worldloop rl --policy runs/sft --world-model runs/wm --judge runs/rw --dataset runs/data \\
         --keyframes runs/data/keyframes --out runs/rl rl.iterations=50"""

RUN = RunSpec(("seed", "sim", "eval", "reward", "world_model", "rl"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", required=True, help="policy folder to start from (e.g. an SFT policy)")
    parser.add_argument("--out", required=True, help="run folder (resumed when it holds a checkpoint)")
    parser.add_argument("--env", choices=("imagined", "real"), default="imagined", help="where the training episodes run")
    parser.add_argument("--world-model", default=None, help="world model folder (--env imagined)")
    parser.add_argument("--judge", default=None, help="reward judge: a classifier folder or topreward:PATH (--env imagined)")
    parser.add_argument("--dataset", default=None, help="dataset whose episodes' first frames start imagined episodes")
    parser.add_argument("--keyframes", default=None, help="KIR keyframe folder (needed when rl.kir_ratio > 0)")
    parser.add_argument("--tasks", default=None, help="comma-separated simulator task names to train on (default: the dataset's, or sim.tasks/suite)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace, config: Config) -> int:
    rl = config.rl
    if args.env == "imagined":
        missing = [flag for flag, value in (("--world-model", args.world_model), ("--judge", args.judge), ("--dataset", args.dataset)) if not value]
        if missing:
            raise ConfigError(f"--env imagined needs {', '.join(missing)}")
        if rl.kir_ratio > 0 and not args.keyframes:
            raise ConfigError(f"rl.kir_ratio={rl.kir_ratio} but no --keyframes: pass a folder from `worldloop kir`, or set rl.kir_ratio=0")
    elif rl.refine_every > 0:
        raise ConfigError(f"rl.refine_every={rl.refine_every} refines the world model of --env imagined; --env real has none to refine")
    elif rl.train_tasks == "tracked":
        raise ConfigError("rl.train_tasks=tracked keeps the tasks that imagination tracks; --env real trains in the simulator itself")
    elif args.keyframes or args.dataset:
        raise ConfigError("--keyframes and --dataset have no use with --env real (the simulator starts from its own initial states); "
                          "--world-model and --judge, when given, measure the imagination-reality gap")
    if rl.drop_imagined_only and not (args.world_model and args.judge and rl.eval_episodes_per_task > 0):
        raise ConfigError("rl.drop_imagined_only=true compares real and imagined success at each reality check: it needs --world-model, "
                          f"--judge and rl.eval_episodes_per_task > 0 (got {rl.eval_episodes_per_task})")  # fmt: skip
    if rl.eval_imagined_actions_in_reality and not (args.world_model and args.judge and rl.eval_episodes_per_task > 0):
        raise ConfigError("rl.eval_imagined_actions_in_reality=true replays the imagined episodes' actions in the simulator: it needs "
                          f"--world-model, --judge and rl.eval_episodes_per_task > 0 (got {rl.eval_episodes_per_task})")  # fmt: skip
    if rl.eval_imagination_repeat and not (args.world_model and args.judge and rl.eval_episodes_per_task > 0):
        raise ConfigError("rl.eval_imagination_repeat=true replays the imagined episodes' actions in imagination: it needs "
                          f"--world-model, --judge and rl.eval_episodes_per_task > 0 (got {rl.eval_episodes_per_task})")  # fmt: skip
    if rl.reality_through_codec and not args.world_model:
        raise ConfigError("rl.reality_through_codec=true shows the policy the simulator through the world model's VAE: it needs --world-model")
    if rl.judge_threshold == "replay" and not (args.world_model and args.judge and rl.eval_episodes_per_task > 0):
        raise ConfigError("rl.judge_threshold=replay replays real episodes in the world model: it needs --world-model, --judge and "
                          f"rl.eval_episodes_per_task > 0 (got {rl.eval_episodes_per_task})")  # fmt: skip

    from pathlib import Path

    import torch

    from worldloop.commands.shared import load_world_model
    from worldloop.config import save_config
    from worldloop.policies import EXPERT, load_policy
    from worldloop.rl.trainer import train
    from worldloop.utils.device import resolve_device

    torch.manual_seed(config.seed)
    device = resolve_device(config.device)
    policy = load_policy(args.policy, device)
    if policy == EXPERT:
        raise ConfigError("--policy expert cannot be trained; give a policy folder")
    if rl.algorithm == "ppo":
        policy = with_value_head(policy)
    save_config(config, args.out)

    closers = []
    try:
        world_model = judge = dataset = None
        if args.world_model:
            world_model = load_world_model(args.world_model, config, args.overrides, device)
        if args.judge:
            judge = load_rl_judge(args.judge, device, config)
        if args.dataset:
            from worldloop.data.dataset import TrajectoryDataset

            dataset = TrajectoryDataset(args.dataset)

        if args.env == "imagined":
            from worldloop.commands.kir import sim_tasks

            env = imagined_env(config, world_model, judge, dataset, args.keyframes, rl.num_groups * rl.group_size, rl.group_size, rl.max_steps, device)
            chosen = args.tasks.split(",") if args.tasks else None
            instructions = env.task_names if chosen is None else [instruction_of(task) for task in chosen]
            tasks = list(instructions)
            train_sim_tasks = chosen or sim_tasks(instructions)
        else:
            from worldloop.sims import make_env
            from worldloop.sims.tasks import resolve_tasks

            train_sim_tasks = args.tasks.split(",") if args.tasks else resolve_tasks(config.sim)
            env = through_codec(make_env(config, rl.num_groups * rl.group_size, tasks=train_sim_tasks), world_model, config)
            tasks = list(train_sim_tasks)
        closers.append(env)

        check = calibration = None
        if rl.eval_episodes_per_task > 0:
            eval_tasks = list(rl.eval_tasks) or list(train_sim_tasks)
            if rl.judge_threshold == "replay":
                # initial states apart from the evaluations', so that those stay out of sample
                calibration = reality_check(config, eval_tasks, world_model, judge, dataset, device, closers, first_episode=rl.eval_episodes_per_task)
                calibrated = calibrate_threshold(calibration, policy, judge, rl, Path(args.out) / "judge_calibration.json")
                if rl.train_tasks == "tracked":
                    train_sim_tasks = tracked_tasks(calibrated, train_sim_tasks, rl.judge_threshold_significance_se)
                    tasks = [instruction_of(task) for task in train_sim_tasks]
                    eval_tasks = list(rl.eval_tasks) or list(train_sim_tasks)
            check = reality_check(config, eval_tasks, world_model, judge, dataset, device, closers, shared=calibration, keyframes=args.keyframes,
                                  video_dir=Path(args.out) / "videos", videos_per_task=rl.eval_videos_per_task)  # fmt: skip
            if calibration is not None and check.real_env is not calibration.real_env:
                closers.remove(calibration.real_env)  # its episodes are taken; a refined model's recalibration only replays them
                calibration.real_env.close()

        refiner = None
        if args.env == "imagined" and rl.refine_every > 0:
            refiner = world_model_refiner(config, world_model, dataset, train_sim_tasks, args.out)
            if calibration is not None and calibration.labelled is not None:
                refiner.judge_check = calibration  # rl.judge_threshold=replay: chosen again in each refined world model
            elif calibration is not None:
                print("rl: the judge's calibration episodes were not saved (a run begun before they were): its threshold stays as "
                      "calibrated through the refinement rounds")  # fmt: skip
            closers.append(refiner.real_env)
        results = train(policy, env, rl, args.out, seed=config.seed, tasks=tasks, reality_check=check, refiner=refiner,
                        progress_bar=not args.no_progress, training_task_of=instruction_of if args.env == "imagined" else None)  # fmt: skip
    finally:
        for env in closers:
            env.close()

    from worldloop.rl.trainer import results_table

    print(results_table(results["evaluations"], results["history"]), end="")
    print(f"final policy: {args.out}/policy; curves: tensorboard --logdir {args.out}/tb")
    return 0


def reality_check(config: Config, tasks: list[str], world_model, judge, dataset, device, closers: list, first_episode: int = 0,
                  shared=None, keyframes: str | None = None, **videos):  # fmt: skip
    """rl's reality check: rl.eval_episodes_per_task real episodes per task of ``tasks`` from the eval verb's
    initial states (episode numbers from ``first_episode`` on) and, with a world model and judge, the same in
    imagination, and with ``keyframes`` (a KIR folder) in imagination from those keyframes too. Its environments
    are ``shared``'s (a check on the same tasks) or new ones, added to ``closers``."""
    from worldloop.policies.evaluate import eval_seed
    from worldloop.rl.rollout import RealityCheck
    from worldloop.sims import make_env

    per_task = config.rl.eval_episodes_per_task
    count = len(tasks) * per_task
    if shared is not None and shared.task_of_episode == [task for task in tasks for _ in range(per_task)]:
        real_env, gap_env = shared.real_env, shared.imagined_env
    else:
        real_env = through_codec(make_env(config, count, tasks=tasks), world_model, config)
        closers.append(real_env)
        gap_env = None
        if world_model is not None and judge is not None:
            horizon = -(-config.sim.max_steps // world_model.chunk_size) * world_model.chunk_size
            gap_env = imagined_env(config, world_model, judge, dataset, None, count, 1, horizon, device, kir_ratio=0.0)
    keyframe_env = None
    if keyframes and gap_env is not None:
        keyframe_env = imagined_env(config, world_model, judge, dataset, keyframes, count, 1, gap_env.max_steps, device, kir_ratio=1.0)
    seeds = [eval_seed(task, first_episode + e, config.eval.seed_offset) for task in tasks for e in range(per_task)]
    return RealityCheck(real_env, tasks, per_task, gap_env, seeds, config.eval.temperature, config.eval.greedy, keyframe_env=keyframe_env,
                        imagined_actions_in_reality=config.rl.eval_imagined_actions_in_reality,
                        imagination_repeat=config.rl.eval_imagination_repeat, **videos)  # fmt: skip


def through_codec(env, world_model, config: Config):
    """``env`` as the policy sees it: with rl.reality_through_codec, its frames through ``world_model``'s VAE."""
    if not config.rl.reality_through_codec:
        return env
    if world_model.image_size != config.sim.image_size:  # its VAE would still run, on frames it never learned
        env.close()
        raise ConfigError(f"rl.reality_through_codec: the world model works at {world_model.image_size}x{world_model.image_size}, the simulator "
                          f"renders {config.sim.image_size}x{config.sim.image_size} (sim.image_size)")  # fmt: skip
    from worldloop.envs.codec import CodecObservations

    return CodecObservations(env, world_model.vae)


def load_rl_judge(spec: str, device, config: Config):
    """The judge of ``spec``, deciding success at rl.judge_threshold when that is set."""
    from worldloop.rewards.protocol import load_judge

    judge = load_judge(spec, device, config.reward)
    if isinstance(config.rl.judge_threshold, float):
        print(f"judge {spec}: threshold {config.rl.judge_threshold} (rl.judge_threshold) in place of its own {judge.threshold:.3f}")
        judge.threshold = config.rl.judge_threshold
    return judge


def calibrate_threshold(calibration, policy, judge, rl, path) -> dict:
    """rl.judge_threshold=replay: the judge's threshold from ``policy``'s real episodes replayed in the
    world model (RealityCheck.calibrate_judge), saved to ``path``, and the episodes beside it (PATH's stem +
    _episodes.pt, for rl.refine_every's recalibrations); a resumed run reads both back instead. Returns the
    calibration (what ``path`` holds)."""
    import time

    from worldloop.rewards.calibrate import plot_kappa_by_threshold
    from worldloop.rl.rollout import LabelledEpisodes, apply_calibration
    from worldloop.utils.io import atomic_write_json, read_json
    from worldloop.utils.stats import format_kappa

    episodes = path.with_name(f"{path.stem}_episodes.pt")
    if path.is_file():
        result = read_json(path)
        apply_calibration(judge, result)
        print(f"judge threshold {judge.threshold:.3f}{own_thresholds(result)}, calibrated before training ({path})")
        if calibration is not None and episodes.is_file():
            calibration.labelled = LabelledEpisodes.load(episodes)
        return result
    began = time.perf_counter()
    result = calibration.calibrate_judge(policy, rl.judge_threshold_tolerance_se, rl.judge_threshold_significance_se,
                                         rl.judge_threshold_per_task)  # fmt: skip
    result["seconds"] = time.perf_counter() - began  # its cost: one real evaluation and one replay
    calibration.labelled.save(episodes)
    atomic_write_json(path, result)
    replays = result["per_episode"]
    plot_kappa_by_threshold(replays["score"], [c == "1" for c in replays["real"]], replays["task"],
                            {"before": result["previous"], "chosen": result["threshold"]}, path.with_suffix(".png"),
                            "the base policy's real episodes replayed in the world model", task_marks=result["task_thresholds"])  # fmt: skip

    def kappa(verdicts: dict) -> str:
        return "undefined" if verdicts["kappa"] is None else format_kappa(verdicts["kappa"], verdicts["kappa_stderr"])

    before, after = result["replayed_before"], result["replayed_after"]
    if result["calibrated"]:
        print(f"judge threshold {result['previous']:.3f} -> {result['threshold']:.3f}, chosen on the base policy's real episodes replayed "
              f"in the world model (n={result['real']['episodes']}, real success {result['real']['success_once']:.3f}): judged "
              f"{before['success_once']:.3f} -> {after['success_once']:.3f}, kappa {kappa(before)} -> {kappa(after)}{own_thresholds(result)}, "
              f"in {result['seconds']:.0f} s ({path})")  # fmt: skip
    else:
        print(f"judge threshold {result['previous']:.3f} kept: {result['kept_because']} on the base policy's {result['real']['episodes']} "
              f"real episodes replayed in the world model (real success {result['real']['success_once']:.3f}; judged "
              f"{before['success_once']:.3f}, kappa {kappa(before)}), in {result['seconds']:.0f} s ({path})")  # fmt: skip
    if after["kappa"] is None or after["kappa"] < 2 * after["kappa_stderr"]:
        # the thirteenth H200 session with rl.success_chunks=2: kappa 0.06 ± 0.07; the sixteenth's: <= 0 at every threshold
        print(f"rl: WARNING at the judge's threshold the replays' verdicts agree with the simulator's no better than chance "
              f"(kappa {kappa(after)}): this judge cannot tell the starting policy's successes from its failures in "
              "this world model, so RL's reward will be noise. Check the replays (`calibrate-reward --world-model` on the "
              "policy's rollouts), a lower rl.success_chunks, or other tasks")  # fmt: skip
    return result


def own_thresholds(calibration: dict) -> str:
    """'; per task: door-open-v3 0.912, ...' for rl.judge_threshold_per_task's calibration, '' otherwise."""
    own = calibration.get("task_thresholds") or {}
    listed = ", ".join(f"{task} {'as for all' if threshold is None else f'{threshold:.3f}'}" for task, threshold in own.items())
    return f"; per task: {listed}" if listed else ""


def tracked_tasks(calibration: dict, candidates: list[str], significance_se: float) -> list[str]:
    """rl.train_tasks=tracked: the ``candidates`` whose replays in ``calibration`` (calibrate_threshold's) agree with
    the simulator within the task more than ``significance_se`` standard errors beyond chance at its threshold."""
    from worldloop.utils.stats import format_kappa, kappa_above_chance

    per_task = calibration["replayed_after"]["per_task_kappa"]

    def tracked(task: str) -> bool:
        return task in per_task and kappa_above_chance(per_task[task]["kappa"], per_task[task]["kappa_stderr"], significance_se)

    def described(task: str) -> str:
        if task not in per_task:
            return f"{task} not calibrated (not in rl.eval_tasks)"
        kappa = per_task[task]["kappa"]
        return f"{task} " + ("undefined" if kappa is None else format_kappa(kappa, per_task[task]["kappa_stderr"]))

    chosen = [task for task in candidates if tracked(task)]
    kappas = ", ".join(described(task) for task in candidates)
    if not chosen:
        raise ConfigError(f"rl.train_tasks=tracked: no task's replays agree with the simulator more than {significance_se:g} SE beyond chance "
                          f"(kappa within each task: {kappas}), so RL's reward would be noise on all of them; try other tasks, "
                          "a better world model or judge, or rl.train_tasks=all")  # fmt: skip
    print(f"rl: training on {', '.join(chosen)} of {', '.join(candidates)}, the tasks whose replays the judge tracks (kappa: {kappas})")
    return chosen


def world_model_refiner(config: Config, world_model, dataset, tasks: list[str], out: str):
    """rl.refine_every: the world model learns from the policy's real rollouts on ``tasks`` during RL, and keeps
    the dataset's training episodes of those tasks (the world model's split) in view."""
    from worldloop.data.dataset import split_episodes
    from worldloop.rl.refine import MAX_DATASET_EPISODES_PER_TASK, WorldModelRefiner
    from worldloop.sims import make_env

    train_indices, _ = split_episodes(dataset, held_out_fraction=config.world_model.held_out_fraction, seed=config.seed)
    wanted = {instruction_of(task): MAX_DATASET_EPISODES_PER_TASK for task in tasks}
    task_of, chosen = dataset.task_indices, []
    for index in train_indices:
        instruction = dataset.tasks[task_of[index]]
        if wanted.get(instruction, 0) > 0:
            wanted[instruction] -= 1
            chosen.append(index)
    real_env = make_env(config, len(tasks) * config.rl.refine_episodes_per_task, tasks=tasks)
    return WorldModelRefiner(world_model, real_env, tasks, dataset.episodes(chosen), config.rl, config.world_model, out,
                             seed=config.seed, seed_offset=config.eval.seed_offset)  # fmt: skip


def imagined_env(config: Config, world_model, judge, dataset, keyframes: str | None, num_envs: int, group_size: int, max_steps: int, device, kir_ratio: float | None = None):
    """The imagined environment over the dataset's first frames (+ keyframes); without either it can only ``reset_to``."""
    import torch

    from worldloop.envs.imagined import ImaginedEnv, InitialStates, initial_states_from_dataset, initial_states_from_keyframes

    if world_model is None or judge is None:
        raise ConfigError("the imagined environment needs --world-model and --judge")
    pools = [InitialStates.from_first_frames(torch.zeros(0, world_model.image_size, world_model.image_size, 3, dtype=torch.uint8), [])]
    if dataset is not None:
        if dataset.image_size != world_model.image_size:
            raise ConfigError(f"--dataset has {dataset.image_size}x{dataset.image_size} frames but the world model renders {world_model.image_size}x{world_model.image_size}")
        pools.append(initial_states_from_dataset(dataset))
    if keyframes:
        pools.append(initial_states_from_keyframes(keyframes))
    ratio = config.rl.kir_ratio if kir_ratio is None else kir_ratio
    return ImaginedEnv(world_model, judge, InitialStates.concat(*pools), num_envs, group_size, max_steps, config.rl.reward_scale, ratio, device,
                       success_chunks=config.rl.success_chunks)  # fmt: skip


def instruction_of(task: str) -> str:
    from worldloop.sims.tasks import INSTRUCTIONS

    if task not in INSTRUCTIONS:
        raise ConfigError(f"--tasks: unknown simulator task '{task}'")
    return INSTRUCTIONS[task]


def with_value_head(policy):
    """PPO needs values: a CompactVLA without a value head gets a fresh one (the rest of its weights kept)."""
    import dataclasses

    from worldloop.policies.modeling_vla import CompactVLA

    if not isinstance(policy, CompactVLA) or policy.value_head is not None:
        return policy
    config = dataclasses.replace(policy.config, value_head=True)
    new = CompactVLA(config, policy.action_dim, policy.image_size, policy.tokenizer, policy.instructions, policy.text_dim, load_vision_weights=False)
    missing, unexpected = new.load_state_dict(policy.state_dict(), strict=False)
    if unexpected or any(not name.startswith("value_") for name in missing):
        raise ValueError(f"cannot add a value head to this policy: missing {missing}, unexpected {unexpected}")
    print("rl: the policy has no value head; PPO starts one from scratch")
    return new.to(policy.device)

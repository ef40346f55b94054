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
DISTRIBUTED = True  # data-parallel under torchrun (worldloop.utils.distributed)


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
    check_arguments(args, config.rl)
    from pathlib import Path

    import torch

    from worldloop.commands.kir import sim_tasks
    from worldloop.commands.shared import load_world_model
    from worldloop.config import save_config
    from worldloop.data.dataset import TrajectoryDataset
    from worldloop.diagnostics.monitor import train_watched
    from worldloop.diagnostics.reality import calibrate_threshold, imagined_env, instruction_of, load_rl_judge, reality_check, through_codec, tracked_tasks
    from worldloop.policies import EXPERT, load_policy
    from worldloop.policies.modeling_vla import with_value_head
    from worldloop.rl.refine import world_model_refiner
    from worldloop.rl.summary import results_table
    from worldloop.sims import make_env
    from worldloop.sims.tasks import resolve_tasks
    from worldloop.utils import distributed
    from worldloop.utils.device import resolve_device

    rl, imagined = config.rl, args.env == "imagined"
    torch.manual_seed(config.seed)
    device = resolve_device(config.device)
    policy = load_policy(args.policy, device)
    if policy == EXPERT:
        raise ConfigError("--policy expert cannot be trained; give a policy folder")
    policy = with_value_head(policy) if rl.algorithm == "ppo" else policy
    main, num_envs = distributed.is_main(), distributed.share(rl.num_groups, "rl.num_groups") * rl.group_size  # this rank's envs
    if main:
        save_config(config, args.out)
    closers = []
    try:
        world_model = load_world_model(args.world_model, config, args.overrides, device) if args.world_model else None
        judge = load_rl_judge(args.judge, device, config) if args.judge else None
        dataset = TrajectoryDataset(args.dataset) if args.dataset else None
        if imagined:
            env = imagined_env(config, world_model, judge, dataset, args.keyframes, num_envs, rl.group_size, rl.max_steps, device)
            chosen = args.tasks.split(",") if args.tasks else None
            tasks = env.task_names if chosen is None else [instruction_of(task) for task in chosen]
            train_sim_tasks = chosen or sim_tasks(tasks)
        else:
            train_sim_tasks = args.tasks.split(",") if args.tasks else resolve_tasks(config.sim)
            env = through_codec(make_env(config, num_envs, tasks=train_sim_tasks), world_model, config)
            tasks = list(train_sim_tasks)
        closers.append(env)

        check = calibration = None
        if rl.eval_episodes_per_task > 0 and main:  # rank 0 alone runs the reality checks
            eval_tasks = list(rl.eval_tasks) or list(train_sim_tasks)
            if rl.judge_threshold == "replay":  # on initial states apart from the evaluations', which stay out of sample
                calibration = reality_check(config, eval_tasks, world_model, judge, dataset, device, closers, first_episode=rl.eval_episodes_per_task)
                calibrated = calibrate_threshold(calibration, policy, judge, rl, Path(args.out) / "judge_calibration.json", config.reward.calibrate)
                if rl.train_tasks == "tracked":
                    train_sim_tasks = tracked_tasks(calibrated, train_sim_tasks, config.reward.calibrate.threshold_significance_se)
                    tasks = [instruction_of(task) for task in train_sim_tasks]
                    eval_tasks = list(rl.eval_tasks) or list(train_sim_tasks)
            check = reality_check(config, eval_tasks, world_model, judge, dataset, device, closers, shared=calibration, keyframes=args.keyframes,
                                  video_dir=Path(args.out) / "videos", videos_per_task=config.eval.videos_per_task)  # fmt: skip
            if calibration is not None and check.real_env is not calibration.real_env:
                closers.remove(calibration.real_env)  # its episodes are taken; a refined model's recalibration only replays them
                calibration.real_env.close()

        refiner = None
        if imagined and rl.refine_every > 0:
            refiner = world_model_refiner(config, world_model, dataset, train_sim_tasks, args.out)
            closers.append(refiner.real_env)
            if calibration is not None and calibration.labelled is not None:
                refiner.judge_check = calibration  # rl.judge_threshold=replay: chosen again in each refined world model
            elif calibration is not None:
                print("rl: the judge's calibration episodes were not saved (a run begun before they were): its threshold stays as "
                      "calibrated through the refinement rounds")  # fmt: skip
        results = train_watched(policy, env, rl, args.out, seed=config.seed, tasks=tasks, reality_check=check, refiner=refiner,
                                progress_bar=not args.no_progress, training_task_of=instruction_of if imagined else None)  # fmt: skip
    finally:
        for env in closers:
            env.close()
    if not main:
        return 0
    print(results_table(results["evaluations"], results["history"]), end="")
    print(f"final policy: {args.out}/policy; curves: tensorboard --logdir {args.out}/tb")
    return 0


def check_arguments(args: argparse.Namespace, rl) -> None:
    """A clear error, before anything loads, for flags and rl.* settings that cannot go together."""
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
    from worldloop.utils import distributed

    if distributed.launched() and rl.judge_threshold == "replay" and rl.eval_episodes_per_task > 0:
        raise ConfigError("rl.judge_threshold=replay calibrates the judge in one process: run it without torchrun, or give a threshold")
    if distributed.launched() and rl.refine_every > 0:
        raise ConfigError(f"rl.refine_every={rl.refine_every} refines the world model in one process: run it without torchrun, or set rl.refine_every=0")
    checks = args.world_model and args.judge and rl.eval_episodes_per_task > 0
    needs = f"--world-model, --judge and rl.eval_episodes_per_task > 0 (got {rl.eval_episodes_per_task})"
    for on, does in ((rl.diagnostics.drop_imagined_only, "rl.diagnostics.drop_imagined_only=true compares real and imagined success at each reality check"),
                     (rl.diagnostics.imagined_actions_in_reality, "rl.diagnostics.imagined_actions_in_reality=true replays the imagined episodes' actions in the simulator"),
                     (rl.diagnostics.imagination_repeat, "rl.diagnostics.imagination_repeat=true replays the imagined episodes' actions in imagination"),
                     (rl.judge_threshold == "replay", "rl.judge_threshold=replay replays real episodes in the world model")):  # fmt: skip
        if on and not checks:
            raise ConfigError(f"{does}: it needs {needs}")
    if rl.diagnostics.reality_through_codec and not args.world_model:
        raise ConfigError("rl.diagnostics.reality_through_codec=true shows the policy the simulator through the world model's VAE: it needs --world-model")

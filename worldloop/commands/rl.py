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

    from worldloop.commands.shared import load_world_model
    from worldloop.config import save_config
    from worldloop.data.dataset import TrajectoryDataset
    from worldloop.diagnostics.monitor import train_watched
    from worldloop.diagnostics.reality import instruction_of, load_rl_judge, rl_checks, shared_checks, training_env
    from worldloop.policies import EXPERT, load_policy
    from worldloop.policies.modeling_vla import with_value_head
    from worldloop.rl.refine import world_model_refiner
    from worldloop.rl.summary import results_table
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
        chosen = args.tasks.split(",") if args.tasks else None
        env, tasks, sim_tasks = training_env(config, imagined, world_model, judge, dataset, args.keyframes, chosen, device, num_envs)
        closers.append(env)
        check, calibration, kept = shared_checks(  # under torchrun, rank 0 checks and calibrates; every rank judges alike
            lambda: rl_checks(config, policy, world_model, judge, dataset, device, closers, sim_tasks, Path(args.out), args.keyframes), judge, sim_tasks)
        if kept != sim_tasks:  # rl.train_tasks=tracked
            sim_tasks, tasks = kept, [instruction_of(task) for task in kept]
        refiner = None
        if imagined and rl.refine_every > 0:
            refiner = world_model_refiner(config, world_model, dataset, sim_tasks, args.out, calibration)
            closers.append(refiner.real_env)
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
    from worldloop.diagnostics.reality import check_diagnostics

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

    if distributed.launched() and rl.refine_every > 0:
        raise ConfigError(f"rl.refine_every={rl.refine_every} refines the world model in one process: run it without torchrun, or set rl.refine_every=0")
    check_diagnostics(rl, bool(args.world_model), bool(args.judge))

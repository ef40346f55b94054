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
Every rl.checks.every iterations the policy is evaluated in the real simulator on rl.checks.tasks and,
from the same initial states, in imagination (the imagination-reality gap), and the gap is traced: the
judge on the real episodes' frames, and the world model replaying their actions open loop. RUN holds config.yaml,
tb/ (TensorBoard), checkpoints/ (rerun to resume), results.json, results.md, curves.png, policy/ (final)
and videos/ (real | replay of its actions in the world model | imagined, from the same initial state at each evaluation).
With rl.refine.every > 0 the world model also learns, every that many iterations, from the policy's own real
rollouts (rl.refine.episodes_per_task per task; OUT/refine keeps their clips, OUT/world_model the refined model).
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
    parser.add_argument("--gate", default=None, help="a fidelity gate's folder (`worldloop gate --out GATE`): judge as it certified (its threshold(s) "
                        "and rl.success_chunks) and, without --tasks, train on the tasks it passed")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace, config: Config) -> int:
    config, certified = certified_by_gate(args, config) if args.gate else (config, None)
    check_arguments(args, config.rl)
    import torch

    from worldloop.commands.shared import load_world_model
    from worldloop.config import save_config
    from worldloop.diagnostics.monitor import Diagnostics
    from worldloop.policies import EXPERT, load_policy
    from worldloop.rl.app import run_rl
    from worldloop.rl.summary import results_table
    from worldloop.utils import distributed
    from worldloop.utils.device import resolve_device

    torch.manual_seed(config.seed)
    device = resolve_device(config.device)
    policy = load_policy(args.policy, device)
    if policy == EXPERT:
        raise ConfigError("--policy expert cannot be trained; give a policy folder")
    if distributed.is_main():
        save_config(config, args.out)
    world_model = load_world_model(args.world_model, config, args.overrides, device) if args.world_model else None
    results = run_rl(config, policy, args.out, args.env == "imagined", world_model, args.judge, args.dataset, args.keyframes,
                     args.tasks.split(",") if args.tasks else None, progress_bar=not args.no_progress, device=device,
                     judge_task_thresholds=certified, watch=Diagnostics())  # fmt: skip
    if results is None:  # not the main rank
        return 0
    print(results_table(results["evaluations"], results["history"]), end="")
    print(f"final policy: {args.out}/policy; curves: tensorboard --logdir {args.out}/tb")
    return 0


def certified_by_gate(args: argparse.Namespace, config: Config) -> tuple[Config, dict[str, float]]:
    """``--gate GATE``: the config with the judge's threshold and episode rule the gate certified on its held-out
    episodes (rl.judge_threshold, rl.success_chunks; no recalibration of its own), ``args.tasks`` set to the tasks it
    passed when none are given, and the per-task thresholds it chose (simulator task -> threshold)."""
    import dataclasses
    from pathlib import Path

    from worldloop.utils.io import read_json

    path = Path(args.gate) / "gate.json"
    if not path.is_file():
        raise ConfigError(f"--gate {args.gate}: no gate.json there; give the folder `worldloop gate --out` wrote")
    gate = read_json(path)
    if "rule" not in gate:
        raise ConfigError(f"--gate {args.gate}: its gate.json predates held-out gates (no rule recorded); run `worldloop gate` again")
    if args.judge and Path(gate["judge"]).resolve() != Path(args.judge).resolve() and gate["judge"] != args.judge:
        raise ConfigError(f"--gate {args.gate} certified the judge {gate['judge']}, not --judge {args.judge}: RL must judge as the gate did")
    if not args.tasks and gate["min_kappa"] is not None:
        if not gate["passed"]:
            raise ConfigError(f"--gate {args.gate}: no task passed it ({args.gate}/gate.md), so RL's reward would be noise on every task")
        args.tasks = ",".join(gate["passed"])
    rl = dataclasses.replace(config.rl, judge_threshold=float(gate["threshold"]), success_chunks=int(gate["rule"]["success_chunks"]),
                             train_tasks="all")  # fmt: skip
    return dataclasses.replace(config, rl=rl), {task: float(t) for task, t in gate["task_thresholds"].items()}


def check_arguments(args: argparse.Namespace, rl) -> None:
    """A clear error, before anything loads, for flags and rl.* settings that cannot go together."""
    from worldloop.diagnostics.reality import check_diagnostics

    if args.env == "imagined":
        missing = [flag for flag, value in (("--world-model", args.world_model), ("--judge", args.judge), ("--dataset", args.dataset)) if not value]
        if missing:
            raise ConfigError(f"--env imagined needs {', '.join(missing)}")
        if rl.kir_ratio > 0 and not args.keyframes:
            raise ConfigError(f"rl.kir_ratio={rl.kir_ratio} but no --keyframes: pass a folder from `worldloop kir`, or set rl.kir_ratio=0")
    elif rl.refine.every > 0:
        raise ConfigError(f"rl.refine.every={rl.refine.every} refines the world model of --env imagined; --env real has none to refine")
    elif rl.train_tasks == "tracked":
        raise ConfigError("rl.train_tasks=tracked keeps the tasks that imagination tracks; --env real trains in the simulator itself")
    elif args.keyframes or args.dataset:
        raise ConfigError("--keyframes and --dataset have no use with --env real (the simulator starts from its own initial states); "
                          "--world-model and --judge, when given, measure the imagination-reality gap")
    check_diagnostics(rl, bool(args.world_model), bool(args.judge))

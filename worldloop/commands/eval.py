"""``worldloop eval``: success_once of a policy (or the scripted expert) in the real simulator."""

from __future__ import annotations

import argparse

from worldloop.config import Config
from worldloop.utils.runfolder import RunSpec

HELP = "Evaluate a policy folder (or 'expert') in the real simulator: success_once per task with standard errors, videos."

RUN = RunSpec(("seed", "sim", "eval"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", required=True, help="model folder, or 'expert' for the scripted experts")
    parser.add_argument("--out", required=True, help="folder for results.json, results.md, videos/ and config.yaml")
    parser.add_argument("--suite", default=None, help="task suite (default: sim.suite), e.g. mt10 or libero_spatial (10 tasks x 50 initial "
                        "states with --episodes-per-task 50); clears sim.tasks and picks the suite's simulator")
    parser.add_argument("--tasks", default=None, help="comma-separated task names instead of a suite")
    parser.add_argument("--episodes-per-task", type=int, default=None, help="episodes per task (default: eval.episodes_per_task)")
    parser.add_argument("--num-envs", type=int, default=None, help="environments stepped together (default: eval.num_envs)")
    parser.add_argument("--greedy", action="store_true", help="take the most likely action tokens")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature of the action tokens (default 1; ignored when greedy)")
    parser.add_argument("--world-model", default=None, help="world-model (or VAE) folder: the policy sees the simulator's frames encoded and decoded "
                        "by its VAE, as it sees imagined ones; success is still the simulator's")
    parser.add_argument("--against", default=None, help="another evaluation's results.json (same tasks and episodes, e.g. the base policy's): "
                        "the change from it, paired episode by episode, is printed and saved as paired_change")


def run(args: argparse.Namespace, config: Config) -> int:
    import json
    from pathlib import Path

    from worldloop.config import save_config
    from worldloop.policies import load_policy
    from worldloop.rl.evaluate import evaluate_policy, evaluation_seeds, paired_eval_change, results_table
    from worldloop.sims.configuration import use_suite
    from worldloop.sims.tasks import resolve_tasks
    from worldloop.utils.device import resolve_device
    from worldloop.utils.io import atomic_write_json
    from worldloop.utils.stats import format_paired

    if args.suite is not None:
        use_suite(config.sim, args.suite)
    if args.tasks:
        config.sim.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if args.episodes_per_task is not None:
        config.eval.episodes_per_task = args.episodes_per_task
    if args.num_envs is not None:
        config.eval.num_envs = args.num_envs
    if args.greedy:
        config.eval.greedy = True
    config.sim.validate()
    config.eval.validate()
    before = None
    if args.against is not None:  # read before minutes of simulation, not after
        try:
            before = json.loads(Path(args.against).read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"--against {args.against}: not an evaluation's results.json ({error})") from error
        seeds = evaluation_seeds(resolve_tasks(config.sim), config.eval.episodes_per_task)
        if not isinstance(before, dict) or before.get("seeds") != seeds:
            raise ValueError(f"--against {args.against} did not start from the initial states this evaluation will: evaluate with "
                             "the same tasks and episodes per task")  # fmt: skip
    policy = load_policy(args.policy, resolve_device(config.device))
    save_config(config, args.out)
    tasks = resolve_tasks(config.sim)
    print(f"eval: {config.eval.episodes_per_task} episodes of each of {len(tasks)} tasks in the simulator ({config.sim.backend}); "
          f"results into {args.out}", flush=True)  # fmt: skip
    results = evaluate_policy(policy, config, out=args.out, world_model=args.world_model, temperature=args.temperature)
    print(results_table(results), end="")
    if before is not None:
        change = paired_eval_change(before, results)
        atomic_write_json(Path(args.out) / "results.json", results | {"paired_change": change | {"against": str(args.against)}})
        print(f"\nagainst {args.against} (the same initial states): overall {format_paired(change)}")
        for task, task_change in change["per_task"].items():
            print(f"  {task}: {format_paired(task_change)}")
    return 0

"""``worldloop eval``: success_once of a policy (or the scripted expert) in the real simulator."""

from __future__ import annotations

import argparse

from worldloop.config import Config

HELP = "Evaluate a policy folder (or 'expert') in the real simulator: success_once per task with standard errors, videos."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", required=True, help="model folder, or 'expert' for the scripted experts")
    parser.add_argument("--out", required=True, help="folder for results.json, results.md, videos/ and config.yaml")
    parser.add_argument("--suite", default=None, help="task suite (default: sim.suite); clears sim.tasks")
    parser.add_argument("--tasks", default=None, help="comma-separated task names instead of a suite")
    parser.add_argument("--episodes-per-task", type=int, default=None, help="episodes per task (default: eval.episodes_per_task)")
    parser.add_argument("--num-envs", type=int, default=None, help="environments stepped together (default: eval.num_envs)")
    parser.add_argument("--greedy", action="store_true", help="take the most likely action tokens")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: eval.temperature)")


def run(args: argparse.Namespace, config: Config) -> int:
    from worldloop.config import save_config
    from worldloop.policies import load_policy
    from worldloop.policies.evaluate import evaluate_policy, results_table
    from worldloop.utils.device import resolve_device

    if args.suite is not None:
        config.sim.suite, config.sim.tasks = args.suite, []
    if args.tasks:
        config.sim.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if args.episodes_per_task is not None:
        config.eval.episodes_per_task = args.episodes_per_task
    if args.num_envs is not None:
        config.eval.num_envs = args.num_envs
    if args.greedy:
        config.eval.greedy = True
    if args.temperature is not None:
        config.eval.temperature = args.temperature
    config.sim.validate()
    config.eval.validate()
    save_config(config, args.out)
    policy = load_policy(args.policy, resolve_device(config.device))
    results = evaluate_policy(policy, config, out=args.out)
    print(results_table(results), end="")
    return 0

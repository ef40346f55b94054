"""``worldloop collect``: record trajectories in the real simulator as a LeRobot v3.0 dataset."""

from __future__ import annotations

import argparse

from worldloop.config import Config, ConfigError
from worldloop.data.configuration import PLAN_DEFINING
from worldloop.utils.runfolder import RunSpec

HELP = """Collect trajectories in the real simulator into a LeRobot v3.0 dataset (--out DIR).

Runs the planned episodes (collect.episodes_per_task per task of sim.suite / sim.tasks, every
other one with the noisy expert) in parallel simulator workers. Every
finished episode is committed at once; rerunning the same command on the same DIR resumes.
Example: worldloop collect --out runs/c5 --episodes-per-task 5 sim.image_size=128"""

RUN = RunSpec(PLAN_DEFINING, not_defining=("episodes_per_task",), final=False)  # more episodes per task extend the same plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="dataset folder (created, or resumed when it exists)")
    parser.add_argument("--policy", default="expert", help="who acts: 'expert' (the simulator's scripted policies: Meta-World's, LIBERO-Spatial's) or a policy model folder (samples at eval.temperature, or eval.greedy)")
    parser.add_argument("--episodes-per-task", type=int, default=None, help="overrides collect.episodes_per_task")
    parser.add_argument("--first-episode", type=int, default=0, help="number the episodes of each task from N: initial states apart from those of "
                        "a dataset of N episodes per task collected with the same seed (default 0)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace, config: Config) -> int:
    if args.episodes_per_task is not None:
        if args.episodes_per_task < 1:
            raise ConfigError(f"--episodes-per-task must be >= 1, got {args.episodes_per_task}")
        config.collect.episodes_per_task = args.episodes_per_task

    from worldloop.data.collect import collect, format_summary

    driver = None
    if args.policy != "expert":
        from worldloop.data.collect import policy_driver
        from worldloop.policies import load_policy
        from worldloop.sims.tasks import instruction, resolve_tasks
        from worldloop.utils.device import resolve_device

        policy = load_policy(args.policy, resolve_device(config.device))
        policy.add_instructions([instruction(task) for task in resolve_tasks(config.sim)])  # before the simulator starts
        driver = policy_driver(policy, temperature=1.0, greedy=config.eval.greedy)
    summary = collect(config, args.out, driver=driver, policy_name=args.policy, progress=not args.no_progress,
                      first_episode=args.first_episode)
    run_info = summary["run"]
    print(format_summary(summary))
    print(
        f"{run_info['new_episodes']} new episodes in {run_info['wall_time_s']:.1f} s ({run_info['episodes_per_s']:.2f} ep/s), "
        f"{run_info['skipped_completed']} already there; dataset: {args.out}"
    )
    return 0

"""``worldloop kir``: extract KIR keyframes (task-critical start states for imagined rollouts)."""

from __future__ import annotations

import argparse

from worldloop.config import Config
from worldloop.utils.runfolder import RunSpec

HELP = """Extract keyframes for keyframe-initialised rollouts (KIR) into --out KF.

From the successful episodes of --dataset: the moments before gripper changes and contacts (up to
the first success). With --policy MODEL: also states of that policy's failed real-simulator
rollouts (--failure-episodes per task of sim.tasks, or of the dataset when unset). With
--failures: the failed episodes of --dataset itself, when it holds a policy's own rollouts (collect
--policy), give those keyframes without new rollouts. Each keyframe keeps its 4
preceding frames, the actions before it and its episode's first frame. Format: KF/index.json
(entries: episode, frame, reason, source, instruction) + KF/keyframes.npz (see worldloop.rl.kir).
Example: worldloop kir --dataset runs/demo/dataset --policy runs/demo/sft --out runs/demo/dataset/keyframes"""

RUN = RunSpec(("seed", "sim", "eval", "rl"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help="LeRobot v3.0 dataset folder")
    parser.add_argument("--policy", default=None, help="policy folder whose failed real rollouts give keyframes too")
    parser.add_argument("--failure-episodes", type=int, default=4, metavar="N",
                        help="with --policy: real rollouts of the policy per task whose failures give keyframes (default 4)")
    parser.add_argument("--failures", action="store_true", help="--dataset holds a policy's rollouts: its failed episodes give keyframes too")
    parser.add_argument("--out", required=True, help="keyframe folder to write (by convention DATASET/keyframes)")


def run(args: argparse.Namespace, config: Config) -> int:
    from worldloop.data.dataset import TrajectoryDataset
    from worldloop.rl.kir import FAILURE_STRIDE, LEAD_FRAMES, MAX_PER_EPISODE, dataset_keyframes, write_keyframes

    dataset = TrajectoryDataset(args.dataset)
    failure_stride = FAILURE_STRIDE if args.failures else None
    items = list(dataset_keyframes(dataset, LEAD_FRAMES, MAX_PER_EPISODE, failure_stride))
    if args.policy:
        items += failed_rollout_items(args.policy, dataset, config, args.failure_episodes)
    index = write_keyframes(args.out, items, args.dataset, dataset.image_size, dataset.action_dim)
    from worldloop.config import save_config

    save_config(config, args.out)
    counts = ", ".join(f"{reason}: {n}" for reason, n in index["counts"].items())
    print(f"{len(index['entries'])} keyframes ({counts}) from {dataset.num_episodes} episodes -> {args.out}")
    return 0


def failed_rollout_items(policy_path: str, dataset, config: Config, episodes: int) -> list:
    """Keyframes from the failures of ``episodes`` real rollouts per task of the policy at ``policy_path``."""
    from worldloop.policies import load_policy
    from worldloop.rl.evaluate import EVAL_SEED_OFFSET
    from worldloop.rl.kir import FAILURE_STRIDE, LEAD_FRAMES, MAX_PER_EPISODE, policy_failure_keyframes
    from worldloop.rl.rollout import check_compatible
    from worldloop.sims import make_env
    from worldloop.sims.tasks import sim_tasks
    from worldloop.utils.device import resolve_device

    tasks = list(config.sim.tasks) or sim_tasks(dataset.tasks)
    if episodes <= 0 or not tasks:
        return []
    policy = load_policy(policy_path, resolve_device(config.device))
    env = make_env(config, len(tasks) * episodes, tasks=tasks)
    try:
        check_compatible(policy, env, "simulator")
        # Seeds below the evaluation seeds and apart from collection's low seeds.
        seeds = [EVAL_SEED_OFFSET // 2 + 1000 * t + e for t in range(len(tasks)) for e in range(episodes)]
        return list(
            policy_failure_keyframes(policy, env, tasks, episodes, seeds, LEAD_FRAMES, FAILURE_STRIDE, MAX_PER_EPISODE, 1.0, config.eval.greedy)
        )
    finally:
        env.close()

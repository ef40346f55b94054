"""``worldloop calibrate-reward``: how far a judge can be trusted, on labelled real windows."""

from __future__ import annotations

import argparse

from worldloop.config import Config
from worldloop.utils.runfolder import RunSpec

HELP = (
    "Score labelled windows of real trajectories with a judge (a train-reward folder or topreward:PATH); "
    "writes AUROC, Value-Order Correlation, trigger rate, a suggested threshold to OUT/metrics.json "
    "and the success/failure score histogram to OUT/histogram.png. With --world-model, the same episodes "
    "are replayed open loop in the world model and the judge's verdicts on the imagined frames are "
    "compared with the simulator's labels (the agreement that RL in imagination relies on)."
)

RUN = RunSpec(("seed", "reward", "world_model"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--judge", required=True, help="classifier folder (train-reward OUT) or topreward:PATH (local Qwen3-VL folder)")
    parser.add_argument("--dataset", required=True, help="LeRobot v3 dataset folder with success labels")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument(
        "--split",
        choices=("all", "held_out"),
        default="all",
        help="held_out: only the episodes train-reward held out (same seed and split)",
    )
    parser.add_argument("--world-model", default=None, help="a train-wm folder: also judge these episodes replayed in it")
    parser.add_argument("--max-episodes", type=int, default=200, help="episodes read from the dataset, spread evenly over it")


def run(args: argparse.Namespace, config: Config) -> int:
    import numpy as np

    from worldloop.commands.shared import load_world_model
    from worldloop.config import save_config
    from worldloop.data.dataset import TrajectoryDataset, split_episodes
    from worldloop.rewards.calibrate import calibrate
    from worldloop.rewards.train import HELD_OUT_FRACTION
    from worldloop.rewards import load_judge
    from worldloop.utils.device import resolve_device

    dataset = TrajectoryDataset(args.dataset)
    if args.split == "held_out":
        indices = np.asarray(split_episodes(dataset, HELD_OUT_FRACTION, seed=config.seed)[1])
    else:
        indices = np.arange(dataset.num_episodes)
    if len(indices) == 0:
        raise ValueError(f"calibrate-reward: no episodes to score in {args.dataset} (split {args.split})")
    keep = min(len(indices), max(1, args.max_episodes))
    indices = indices[np.unique(np.linspace(0, len(indices) - 1, keep).round().astype(int))]
    device = resolve_device(config.device)
    world_model = None
    if args.world_model:
        world_model = load_world_model(args.world_model, config, args.overrides, device)
        if world_model.image_size != dataset.image_size:
            raise ValueError(f"--world-model renders {world_model.image_size}px frames, {args.dataset} holds {dataset.image_size}px")
    judge = load_judge(args.judge, device, config.reward)
    save_config(config, args.out)
    metrics = calibrate(judge, dataset.episodes([int(i) for i in indices]), args.out, args.judge, world_model, config.seed)
    at = metrics["at_threshold"]
    print(
        f"calibrate-reward: {metrics['windows']} windows ({metrics['success_windows']} success) from {metrics['episodes']} episodes; "
        f"AUROC {metrics['auroc']}, VOC {metrics['value_order_correlation']['mean']}, trigger rate {at['trigger_rate']} "
        f"at threshold {at['threshold']}, suggested {metrics['suggested_threshold']}; {args.out}/metrics.json"
    )
    if world_model is not None:
        imagined, episodes = metrics["world_model"]["imagined"], metrics["world_model"]["episodes"]
        print(
            f"calibrate-reward: on imagined frames AUROC {imagined['auroc']}, window verdicts agree with the real ones "
            f"{metrics['world_model']['window_verdict_agreement']:.3f}; episodes: success_once real {episodes['real_success_once']:.3f} "
            f"vs judged in imagination {episodes['imagined_judged_success_once']:.3f}, agreement {episodes['agreement']:.3f} "
            f"(chance {episodes['agreement_by_chance']:.3f}, kappa {_or_dash(episodes['kappa'])}), "
            f"{episodes['false_success']} false and {episodes['missed_success']} missed successes"
        )
    return 0


def _or_dash(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"

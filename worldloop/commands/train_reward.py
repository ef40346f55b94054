"""``worldloop train-reward``: train the ResNet-18 success classifier on a dataset's success labels."""

from __future__ import annotations

import argparse

from worldloop.config import Config

HELP = (
    "Train the ResNet-18 success classifier (reward.classifier.*) on a dataset's success labels; "
    "writes the judge to OUT/model, held-out AUROC/precision/recall to OUT/metrics.json, TensorBoard to OUT/tb. "
    "Rerun the same command to resume."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, nargs="+", help="LeRobot v3 dataset folder(s) (worldloop collect); together they need success-labelled frames")
    parser.add_argument("--out", required=True, help="run folder; OUT (or OUT/model) is a judge for load_judge / --judge")


def run(args: argparse.Namespace, config: Config) -> int:
    from worldloop.config import save_config
    from worldloop.data.dataset import TrajectoryDataset, split_episodes
    from worldloop.rewards.labels import labelled_frames
    from worldloop.rewards.train import train_classifier
    from worldloop.utils.device import resolve_device

    settings = config.reward.classifier
    datasets = [TrajectoryDataset(folder) for folder in args.dataset]
    splits = [split_episodes(dataset, settings.held_out_fraction, seed=config.seed) for dataset in datasets]
    held_out_ids = [i for _, held in splits for i in held]
    save_config(config, args.out)
    instructions = list(dict.fromkeys(task for dataset in datasets for task in dataset.tasks))

    def episodes(part: int):  # every dataset's train (0) or held-out (1) episodes, one after another
        return (episode for dataset, split in zip(datasets, splits) for episode in dataset.episodes(list(split[part])))

    train = labelled_frames(episodes(0), instructions, settings.max_frames)
    held_out = labelled_frames(episodes(1), instructions, settings.max_frames) if held_out_ids else None
    print(
        f"train-reward: {len(train)} training frames ({int(train.success.sum())} success), "
        f"{len(held_out) if held_out else 0} held-out frames from {len(held_out_ids)} episodes"
    )
    metrics = train_classifier(train, held_out, settings, args.out, resolve_device(config.device), seed=config.seed)
    report = metrics["held_out"] or metrics["train"]
    which = "held-out" if metrics["held_out"] else "train (no held-out episodes)"
    at = report["at_threshold"]
    print(
        f"train-reward: {which} AUROC {report['auroc']}, precision {at['precision']}, recall {at['recall']} "
        f"at threshold {at['threshold']}; judge saved to {args.out}/model"
    )
    return 0

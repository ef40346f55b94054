"""``worldloop train-reward``: train the ResNet-18 success classifier on a dataset's success labels."""

from __future__ import annotations

import argparse
from pathlib import Path

from worldloop.config import Config
from worldloop.utils.runfolder import RunSpec

HELP = (
    "Train the ResNet-18 success classifier (reward.classifier.*, trained as reward.training.* says) on a dataset's success labels; "
    "writes the judge to OUT/model, held-out AUROC/precision/recall to OUT/metrics.json, TensorBoard to OUT/tb. "
    "With --world-model, the world model's open-loop replays of the training episodes join the training frames "
    "with the simulator's labels (the judge then knows the frames it will judge in RL), and held-out replays are "
    "scored too (held_out_imagined). --replay names the datasets whose episodes are replayed (default: every --dataset): give "
    "it episodes the world model did not train on, for the world model replays its own training episodes better than the "
    "new episodes the gate and RL judge. Rerun the same command to resume."
)

RUN = RunSpec(("seed", "sim.chunk_size", "reward", "world_model", "rl.success_chunks"))
DISTRIBUTED = True  # data-parallel under torchrun (worldloop.utils.distributed)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, nargs="+", help="LeRobot v3 dataset folder(s) (worldloop collect); together they need success-labelled frames")
    parser.add_argument("--out", required=True, help="run folder; OUT (or OUT/model) is a judge for load_judge / --judge")
    parser.add_argument("--world-model", help="world-model folder (train-wm --out) at the datasets' resolution: train on its replays too")
    parser.add_argument("--replay", nargs="+", help="with --world-model: the --dataset folders whose episodes are replayed (default: all of them)")


def run(args: argparse.Namespace, config: Config) -> int:
    from itertools import chain

    from worldloop.commands.shared import load_world_model
    from worldloop.config import save_config
    from worldloop.data.dataset import TrajectoryDataset, split_episodes
    from worldloop.rewards.labels import LabelledFrames, labelled_frames, require_success_frames
    from worldloop.rewards.train import HELD_OUT_FRACTION, train_classifier
    from worldloop.utils import distributed
    from worldloop.utils.device import resolve_device

    settings = config.reward.training
    if args.replay and not args.world_model:
        raise ValueError("--replay names datasets to replay in --world-model; give --world-model too")
    replayed = replayed_datasets(args) if args.world_model else []
    datasets = [TrajectoryDataset(folder) for folder in args.dataset]
    splits = [split_episodes(dataset, HELD_OUT_FRACTION, seed=config.seed) for dataset in datasets]
    held_out_ids = [i for _, held in splits for i in held]
    if distributed.is_main():
        save_config(config, args.out)
    instructions = list(dict.fromkeys(task for dataset in datasets for task in dataset.tasks))

    def read(part: int, chosen: list[int]):  # the chosen datasets' train (0) or held-out (1) episodes, one after another
        return (episode for k in chosen for episode in datasets[k].episodes(list(splits[k][part])))

    device = resolve_device(config.device)
    others = [k for k in range(len(datasets)) if k not in replayed]
    kept = [list(read(part, replayed)) for part in (0, 1)]  # read once: their real frames and their replays both come from them
    train = labelled_frames(chain(read(0, others), kept[0]), instructions)
    held_out = labelled_frames(chain(read(1, others), kept[1]), instructions) if held_out_ids else None
    require_success_frames(train, held_out)  # before the world model's replays: they carry the same labels
    also_evaluate = {}
    if args.world_model:
        from worldloop.rewards.agreement import imagined_episodes
        world_model = load_world_model(args.world_model, config, args.overrides, device)
        for folder, dataset in zip(args.dataset, datasets):
            if dataset.image_size != world_model.image_size:
                raise ValueError(f"--world-model renders {world_model.image_size}px frames, {folder} holds {dataset.image_size}px")

        def imagined(part: int) -> LabelledFrames:  # the same episodes replayed open loop, with the real labels
            replays = imagined_episodes(world_model, kept[part], settings.batch_size, config.seed + part)
            return labelled_frames(replays, instructions)

        train = LabelledFrames.cat([train, imagined(0)])
        if kept[1]:
            also_evaluate["held_out_imagined"] = imagined(1)
    if distributed.is_main():
        print(
            f"train-reward: {len(train)} training frames ({int(train.success.sum())} success{imagined_share(args, replayed, datasets)}), "
            f"{len(held_out) if held_out else 0} held-out frames from {len(held_out_ids)} episodes"
        )
    threshold_on = "held_out_imagined" if "held_out_imagined" in also_evaluate else "held_out"
    metrics = train_classifier(train, held_out, config.reward, args.out, device, seed=config.seed, also_evaluate=also_evaluate,
                               threshold_on=threshold_on, verdict_every=config.sim.chunk_size,
                               success_chunks=config.rl.success_chunks)  # fmt: skip
    if not distributed.is_main():
        return 0
    report = metrics["held_out"] or metrics["train"]
    which = "held-out" if metrics["held_out"] else "train (no held-out episodes)"
    at = report["at_threshold"]
    print(
        f"train-reward: {which} AUROC {report['auroc']}, precision {at['precision']}, recall {at['recall']} "
        f"at threshold {at['threshold']} ({metrics['threshold_chosen_on']}); judge saved to {args.out}/model"
    )
    if "held_out_imagined" in metrics:
        at = metrics["held_out_imagined"]["at_threshold"]
        print(f"train-reward: on the world model's replays of the held-out episodes: AUROC {metrics['held_out_imagined']['auroc']}, "
              f"false-positive rate {at['false_positive_rate']}, recall {at['recall']}")  # fmt: skip
    for name in ("held_out", "held_out_imagined"):
        if metrics.get(name):
            print(f"train-reward: {name} {describe_episodes(metrics[name]['episodes'])}")
    return 0


def describe_episodes(e: dict) -> str:
    """One line on the episode-level verdicts of ``evaluate``'s 'episodes' entry."""
    from worldloop.utils.stats import format_kappa

    kappa = format_kappa(e["kappa"], e["kappa_stderr"]) if e["kappa"] is not None else "undefined"
    return (f"episodes judged once every {e['verdict_every']} frames (n={e['count']}): success_once real {e['real_success_once']:.3f} "
            f"vs judged {e['judged_success_once']:.3f}, {e['false_success']} false and {e['missed_success']} missed successes, "
            f"agreement {e['agreement']:.2f} (chance {e['chance']:.2f}, kappa {kappa})")  # fmt: skip


def replayed_datasets(args: argparse.Namespace) -> list[int]:
    """The positions in --dataset of the datasets whose episodes the world model replays: --replay's, else all."""
    if not args.replay:
        return list(range(len(args.dataset)))
    given = [Path(folder).resolve() for folder in args.dataset]
    missing = [folder for folder in args.replay if Path(folder).resolve() not in given]
    if missing:
        raise ValueError(f"--replay {' '.join(missing)}: not among --dataset; the replayed episodes' real frames are training frames too")
    wanted = {Path(folder).resolve() for folder in args.replay}
    return [k for k, folder in enumerate(given) if folder in wanted]


def imagined_share(args: argparse.Namespace, replayed: list[int], datasets: list) -> str:
    if not args.world_model:
        return ""
    if len(replayed) == len(datasets):
        return ", half imagined"
    return f", with the replays of {', '.join(args.dataset[k] for k in replayed)}"

"""``worldloop sft``: supervised fine-tuning of the compact VLA on a dataset's demonstrations."""

from __future__ import annotations

import argparse

from worldloop.config import Config
from worldloop.utils.runfolder import RunSpec

HELP = """Fine-tune the compact VLA on demonstrations (action-token cross-entropy); resumes from OUT's checkpoints.
With --policy openvla-oft:DIR, fine-tune that OpenVLA-OFT checkpoint instead (LoRA; L1 + token loss; OUT in the published layout)."""

RUN = RunSpec(("seed", "policy", "sft"))
DISTRIBUTED = True  # data-parallel under torchrun (worldloop.utils.distributed)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help="LeRobot v3 dataset folder (from `worldloop collect`)")
    parser.add_argument("--out", required=True, help="model folder to write (config.json, model.safetensors, norm_stats.json, tb/, checkpoints/)")
    parser.add_argument("--world-model", default=None, help="world-model (or VAE) folder: held-out token agreement on its VAE's reconstructions, "
                        "and sft.augment_codec of the training frames shown through it")
    parser.add_argument("--policy", default=None, help="an OpenVLA-OFT checkpoint to fine-tune (openvla-oft:DIR[@SUITE]) instead of a compact VLA from scratch")
    parser.add_argument("--episodes-per-task", type=int, default=0, help="training episodes per task, successful first (1 = one-trajectory SFT; default 0: all)")


def run(args: argparse.Namespace, config: Config) -> int:
    from worldloop.policies.sft import train_sft

    if args.episodes_per_task < 0:
        from worldloop.config import ConfigError

        raise ConfigError(f"--episodes-per-task must be >= 0 (0: every training episode), got {args.episodes_per_task}")
    from worldloop.utils import distributed

    if args.policy:
        from worldloop.config import ConfigError
        from worldloop.policies.openvla_oft.sft import finetune_openvla_oft

        if args.world_model:
            raise ConfigError("--world-model (codec augmentation and agreement) is for the compact VLA; sft --policy does not use it")
        results = finetune_openvla_oft(config, args.policy, args.dataset, args.out, args.episodes_per_task)
        if distributed.is_main():
            print(f"sft: {results['steps']} steps on {results['train_samples']} samples in {results['seconds']:.0f} s; "
                  f"train loss {results['final_train_loss']:.3f}; model in {args.out} (published OpenVLA-OFT layout)")
        return 0
    results = train_sft(config, args.dataset, args.out, args.episodes_per_task, world_model=args.world_model)
    if not distributed.is_main():
        return 0
    codec = results.get("held_out_codec_token_agreement")
    held_out = ("no held-out episodes" if results["held_out_loss"] is None else
                f"held-out loss {results['held_out_loss']:.3f}, held-out token accuracy {results['held_out_token_accuracy']:.3f}")  # fmt: skip
    print(
        f"sft: {results['steps']} steps on {results['train_samples']} samples in {results['seconds']:.0f} s; "
        f"train loss {results['final_train_loss']:.3f}, {held_out}"
        + (f", tokens kept through the world model's VAE {codec:.3f} ({results['held_out_codec_token_distance']:.2f} bins apart on average)" if codec is not None else "")
        + f"; model in {args.out}"
    )
    return 0

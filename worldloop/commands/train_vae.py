"""``worldloop train-vae``: train the video VAE on dataset frames (or import a local diffusers VAE)."""

from __future__ import annotations

import argparse

from worldloop.config import Config, save_config
from worldloop.utils.runfolder import RunSpec

HELP = """Train the world model's video VAE (diffusers AutoencoderKLWan, vae.size) from scratch on the
frames of --dataset, or on from vae.init (a local diffusers folder: an earlier --out, or the Wan2.2 VAE;
with vae.steps=0 it is taken as it is).
Writes a diffusers-format VAE folder to --out with metrics.json (held-out PSNR/SSIM), TensorBoard
logs in OUT/tb and checkpoints; rerunning the same command resumes.
Example: worldloop train-vae --dataset runs/data --out runs/vae vae.steps=2000"""

RUN = RunSpec(("seed", "vae"))
DISTRIBUTED = True  # data-parallel under torchrun (worldloop.utils.distributed)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help="LeRobot v3 dataset folder")
    parser.add_argument("--out", required=True, help="VAE folder to write")


def run(args: argparse.Namespace, config: Config) -> int:
    from worldloop.utils import distributed
    from worldloop.utils.device import resolve_device
    from worldloop.worldmodel.train_vae import train_vae
    from worldloop.worldmodel.training import load_split

    if distributed.is_main():
        save_config(config, args.out)
    train, held_out, _ = load_split(args.dataset, config.seed)
    metrics = train_vae(config.vae, train, held_out, args.out, resolve_device(config.device), config.seed)
    if distributed.is_main():
        print(f"train-vae: {describe(metrics)}; VAE in {args.out}, metrics in {args.out}/metrics.json")
    return 0


def describe(metrics: dict) -> str:
    """One line on train_vae's metrics: the training done and the reconstruction of held-out clips."""
    held = metrics.get("held_out") or {}
    speed = f" ({metrics['clips_per_s']:.1f} clips/s)" if metrics.get("clips_per_s") else ""
    trained = (f"{metrics['steps']} steps, {metrics['train_seconds_this_run']:.0f} s this run{speed}, "
               f"{metrics['parameters_millions']:.1f} M parameters") if metrics["steps"] else "vae.init taken as it is, no training"  # fmt: skip
    teacher = metrics.get("teacher")
    if teacher:
        trained += (f"; a decoder {metrics['decoder_base_dim']} wide ({metrics['decoder_parameters_millions']:.2f} M) distilled from "
                    f"{teacher['vae']}'s ({teacher['decoder_base_dim']} wide), {teacher['held_out_psnr_vs_teacher']['psnr']:.2f} dB "
                    f"against its own decode")  # fmt: skip
    if not held:
        return trained
    where = "training clips (the dataset has too few episodes to hold any out)" if metrics.get("held_out_is_train") else "held-out clips"
    return (f"{trained}; PSNR {held['psnr']:.2f} dB ({held['psnr_moving']:.2f} on moving pixels), SSIM {held['ssim']:.3f} "
            f"on {held['clips']} {where}")

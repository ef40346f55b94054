"""``worldloop train-wm``: train the action-conditioned video world model."""

from __future__ import annotations

import argparse

from worldloop.config import Config, save_config
from worldloop.utils.runfolder import RunSpec

HELP = """Train the action-conditioned DiT (world_model.size) on --dataset with the VAE in --vae.
Clips are encoded once (OUT/latents.safetensors), then rectified flow with context-noise
augmentation and static clips; EMA weights are saved to --out as a world-model folder
(config.json, model.safetensors, vae/). TensorBoard in OUT/tb; rerunning resumes exactly.
Example: worldloop train-wm --dataset runs/data --vae runs/vae --out runs/wm world_model.steps=4000"""

RUN = RunSpec(("seed", "world_model"))
DISTRIBUTED = True  # data-parallel under torchrun (worldloop.utils.distributed)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, nargs="+", help="LeRobot v3 dataset folder(s); several are trained on together")
    parser.add_argument("--vae", required=True, help="VAE folder written by `worldloop train-vae` (or any local diffusers AutoencoderKLWan)")
    parser.add_argument("--out", required=True, help="world-model folder to write")
    parser.add_argument("--init", default=None, help="world-model folder to start from (fine-tuning, e.g. PACE's WM Evo)")


def run(args: argparse.Namespace, config: Config) -> int:
    from pathlib import Path

    from worldloop.utils import distributed
    from worldloop.utils.device import resolve_device
    from worldloop.utils.io import read_json
    from worldloop.worldmodel.train_dit import steps_trained, train_world_model
    from worldloop.worldmodel.training import load_split
    from worldloop.worldmodel.rollout import WorldModel
    from worldloop.worldmodel.vae import check_frames, load_vae

    splits = [load_split(folder, config.seed) for folder in args.dataset]
    sizes = {folder: int(dataset.image_size) for folder, (_, _, dataset) in zip(args.dataset, splits)}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"the --dataset folders hold frames of different sizes ({', '.join(f'{f}: {s}px' for f, s in sizes.items())}); "
                         "a world model learns one")  # fmt: skip
    image_size = next(iter(sizes.values()))
    vae = load_vae(args.vae)
    check_frames(args.vae, vae, image_size, args.dataset[0])
    device = resolve_device(config.device)
    init = WorldModel.from_pretrained(args.init, device) if args.init else None
    if init is not None and int(init.image_size) != image_size:
        raise ValueError(f"--init {args.init} imagines {init.image_size}x{init.image_size} frames, the --dataset holds {image_size}x{image_size}")
    if distributed.is_main():
        save_config(config, args.out)
    train = [episode for episodes, _, _ in splits for episode in episodes]
    key = {"dataset": [str(Path(folder).resolve()) for folder in args.dataset], "vae": str(Path(args.vae).resolve()), "init": args.init}
    steps_before = steps_trained(args.init) if args.init else 0
    train_world_model(config.world_model, train, vae, args.out, device, config.seed, cache_key=key, init=init, steps_before=steps_before)
    if distributed.is_main():
        r = read_json(Path(args.out) / "results.json")
        total = f" ({r['steps_total']} in all)" if r.get("steps_total", r["steps"]) != r["steps"] else ""
        speed = f", {r['clips_per_s']:.1f} clips/s" if r.get("clips_per_s") else ""
        loss = "" if r.get("final_loss") is None else f", final loss {r['final_loss']:.4f}"
        outcome = f" ({r['outcome_clips']} near a first success, {r['outcome_draw_share']:.0%} of draws)" if r.get("outcome_clips") else ""
        print(f"train-wm: {r['steps']} steps{total} on {r['clips']} clips{outcome} in {r['train_seconds_this_run']:.0f} s{speed}, "
              f"{r['parameters_millions']:.1f} M parameters{loss}; world model in {args.out}, "
              f"results in {args.out}/results.json (eval-wm measures it)")  # fmt: skip
    return 0

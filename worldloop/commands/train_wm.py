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
    import json
    from pathlib import Path

    from worldloop.utils import distributed
    from worldloop.utils.device import resolve_device
    from worldloop.worldmodel.train import load_split, steps_trained, train_world_model
    from worldloop.worldmodel.rollout import WorldModel
    from worldloop.worldmodel.vae import load_vae

    if distributed.is_main():
        save_config(config, args.out)
    train = [episode for folder in args.dataset for episode in load_split(folder, config.seed)[0]]
    vae = load_vae(args.vae)
    key = {"dataset": [str(Path(folder).resolve()) for folder in args.dataset], "vae": str(Path(args.vae).resolve()), "init": args.init}
    device = resolve_device(config.device)
    init = WorldModel.from_pretrained(args.init, device) if args.init else None
    steps_before = steps_trained(args.init) if args.init else 0
    train_world_model(config.world_model, train, vae, args.out, device, config.seed, cache_key=key, init=init, steps_before=steps_before)
    if distributed.is_main():
        print(json.dumps(json.loads((Path(args.out) / "results.json").read_text()), indent=2))
    return 0

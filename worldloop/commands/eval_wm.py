"""``worldloop eval-wm``: open-loop quality of a world model on held-out real trajectories."""

from __future__ import annotations

import argparse

from worldloop.config import Config, save_config
from worldloop.utils.runfolder import RunSpec

HELP = """Replay the recorded actions of held-out episodes of --dataset open-loop in the world model,
from their real first frames, and compare with the real frames at world_model.eval_horizons:
PSNR and SSIM next to the copy-last-frame baseline (LPIPS/FID/FVD only with local weights),
rollout frames/s; per task and per episode too (metrics.json's per_task, per_episode: two models, or two
samplings of one, paired episode by episode with worldloop.worldmodel.evaluate.paired_change).
With --counterfactual, the simulator is driven by the same swapped actions from each episode's recorded
task and seed (a dataset from `worldloop collect`): does the model move the scene as the simulator does?
Writes OUT/metrics.json, real|generated mp4s and PNG strips.
Example: worldloop eval-wm --world-model runs/wm --dataset runs/data --out runs/wm-eval"""

RUN = RunSpec(("seed", "sim", "world_model"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-model", required=True, help="world-model folder (train-wm --out)")
    parser.add_argument("--dataset", required=True, help="LeRobot v3 dataset folder (its held-out split is used)")
    parser.add_argument("--out", required=True, help="folder for metrics.json and videos")
    parser.add_argument("--held-out-fraction", type=float, default=None,
                        help="share of each task's episodes to measure on (default: the split train-wm held out; "
                             "0.5 or 0.99 for a dataset the model never trained on)")
    parser.add_argument("--counterfactual", action="store_true",
                        help="also drive the simulator (sim.*) with the swapped actions from each episode's recorded task and seed: "
                             "does the model move the scene the way the simulator does? (metrics.json's counterfactual)")


def run(args: argparse.Namespace, config: Config) -> int:
    from worldloop.commands.shared import load_world_model
    from worldloop.utils.device import resolve_device
    from worldloop.worldmodel.evaluate import describe, evaluate_world_model
    from worldloop.worldmodel.training import load_split

    save_config(config, args.out)
    wm_config = config.world_model
    _, held_out, dataset = load_split(args.dataset, config.seed, args.held_out_fraction)
    model = load_world_model(args.world_model, config, args.overrides, resolve_device(config.device))
    metrics = evaluate_world_model(model, held_out[: wm_config.eval_episodes], wm_config.eval_horizons, args.out, fps=int(dataset.fps), seed=config.seed,
                                   sim_config=config.sim if args.counterfactual else None)
    for line in describe(metrics):
        print(f"eval-wm: {line}")
    print(f"eval-wm: metrics (per task and episode too) in {args.out}/metrics.json, real|generated mp4s and strips beside it")
    return 0

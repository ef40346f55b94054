"""``worldloop experiment``: declared arms x seeds of the closed loop, on base artifacts built once."""

from __future__ import annotations

import argparse

from worldloop.config import Config
from worldloop.experiment import ARMS, arms_help

HELP = f"""Run declared arms x seeds of the closed loop on shared base artifacts, so that a claim rests on seeds and controls:
RUN/base holds the loop's stages before RL (demos .. keyframes, the fidelity gate, the base policy's eval), built once
or brought (--dataset, --base-policy, --world-model, --judge); RUN/arms/<arm>/seed<k> each arm's stages from RL on, with
its config overrides and config seed = the preset's seed + k. Every evaluation starts from the same initial states, and
keeps its per-episode verdicts; RUN/verdicts.json gathers them. Each arm and seed resumes where it stopped.
The arms:
{arms_help()}
real_grpo trains for as many iterations as it takes to spend the real trajectories the full arm consumes (base rollouts,
evolved-policy rollouts and rl.refine.every's rounds; RUN/experiment.json says how many).
Then `worldloop analyse RUN` writes RUN/analysis.md and RUN/analysis.json.
Example: worldloop experiment --preset micro --out runs/exp --arms full,shuffled --seeds 4"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="experiment folder (resumed when it exists)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated arms (default: all: {','.join(ARMS)})")
    parser.add_argument("--seeds", type=int, default=4, help="seeds per arm (default: 4, the fewest at which the exact test of two arms "
                        "over seeds can reach p < 0.05)")
    parser.add_argument("--parallel", type=int, default=None, help="arm x seed runs side by side (default: one per GPU, each on its own, when "
                        "several are visible; else 1; more runs than GPUs share them in turn, one GPU where its memory allows)")
    parser.add_argument("--through-vae", action="store_true", help="also evaluate the base and every final policy observing the simulator "
                        "through the world model's VAE (the secondary endpoint)")
    parser.add_argument("--dataset", default=None, help="your own demonstration dataset (LeRobot v3) instead of collecting expert demos")
    parser.add_argument("--base-policy", default=None, help="your own base policy folder instead of SFT")
    parser.add_argument("--world-model", default=None, help="your own world-model folder instead of training WM Base")
    parser.add_argument("--judge", default=None, help="your own judge (classifier folder or topreward:PATH) instead of training one")


def run(args: argparse.Namespace, config: Config) -> int:
    from worldloop.experiment import run_experiment
    from worldloop.loop import Inputs

    inputs = Inputs(dataset=args.dataset, base_policy=args.base_policy, world_model=args.world_model, judge=args.judge)
    arms = [arm.strip() for arm in args.arms.split(",") if arm.strip()]
    run_experiment(config, args.out, inputs, args.preset, list(args.overrides), arms, args.seeds, parallel=args.parallel, through_vae=args.through_vae)
    return 0

"""``worldloop bench <target>``: measure the speed of one part of worldloop.

Each target is a function ``run(args, config) -> int`` named in :data:`TARGETS` as
"module:function"; it reads the common options below and prints a table. Add a target with one
line in TARGETS.
"""

from __future__ import annotations

import argparse
import importlib

from worldloop.config import Config

HELP = """Measure speed and print a table:
  sim     real-simulator steps/s with rendered frames at several sizes and worker counts
  data    dataset write and read (cold decode vs decoded cache) speed
  policy  compact-VLA act() and SFT step throughput
  wm      world-model step (5 DiT steps + decode of the new frames): frames/s and FLOP utilisation
  wm-train  world-model training: optimizer steps/s and clips/s, without and with self-forcing; under
            torchrun --nproc-per-node N, also one process against N and the scaling efficiency
  vae-train  VAE training: optimizer steps/s, clips/s, MFU and GPU-busy share; on a GPU eager and compiled
  reward  judge throughput: classifier and TOPReward windows/s
  vla     OpenVLA-OFT act() latency/throughput and GRPO update time and peak memory (--models tiny 7b)"""

TARGETS: dict[str, str] = {
    "sim": "worldloop.sims.bench:bench_sim",
    "wm": "worldloop.worldmodel.bench:bench_wm",
    "wm-train": "worldloop.worldmodel.bench_train:bench_wm_train",
    "vae-train": "worldloop.worldmodel.bench_train:bench_vae_train",
    "reward": "worldloop.rewards.bench:bench_reward_target",
    "data": "worldloop.data.bench:bench_data",
    "policy": "worldloop.policies.bench:bench_policy",
    "vla": "worldloop.rl.bench_openvla_oft:bench_vla",
}
"""Benchmark name -> "module:function" with signature ``function(args, config) -> int``."""

DISTRIBUTED = True  # bench wm-train measures data-parallel training under torchrun; the other targets refuse it
SCALING = ("wm-train",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", choices=sorted(TARGETS), help="what to measure")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256], help="image sizes to measure (default: 64 128 256)")
    parser.add_argument("--workers", type=int, nargs="+", default=None, help="worker-process counts to compare (default: 1 and sim.num_workers)")
    parser.add_argument("--steps", type=int, default=48, help="timed steps per environment at each setting (default: 48)")
    parser.add_argument("--envs-per-worker", type=int, default=2, help="environments per worker process (default: 2)")
    parser.add_argument("--models", nargs="+", default=["tiny"], choices=("tiny", "small", "wan2.2-5b", "7b"),
                        help="wm: world-model dimensions to measure (tiny, small, wan2.2-5b); vla: tiny or 7b (OpenVLA-OFT); random weights (default: tiny)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64], help="wm, vla: environments per step (default: 1 8 64)")
    parser.add_argument("--profile", action="store_true", help="wm: also profile each setting's step (torch.profiler: the GPU's busy share, kernels, the top operators, the copies by input shape)")
    parser.add_argument("--out", default=None, help="also write the table to this text file")


def run(args: argparse.Namespace, config: Config) -> int:
    from worldloop.config import ConfigError
    from worldloop.utils import distributed

    if distributed.active() and args.target not in SCALING:
        raise ConfigError(f"bench {args.target} runs as one process; under torchrun only {', '.join(SCALING)} measures scaling")
    module_name, function_name = TARGETS[args.target].split(":")
    return int(getattr(importlib.import_module(module_name), function_name)(args, config) or 0)

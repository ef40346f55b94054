"""``worldloop fidelity``: world-model fidelity against the DiT's training minutes, in one resumable command."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from worldloop.config import Config
from worldloop.utils.runfolder import RunSpec

HELP = """How much does a world model gain per GPU-minute? Builds the loop's data (expert demonstrations, the SFT base
policy, its evaluation and rollouts) and VAE once, then for each --minutes M trains the DiT for M minutes (its own
learning-rate schedule, world_model.time_limit_s), measures it with eval-wm (the PSNR margin over copy-last-frame at
8/32/64/128 frames, the action ΔPSNR, the VAE alone) and with the fidelity gate (the judge's kappa against the
simulator per task). Writes RUN/fidelity.md (the tables), fidelity.json and fidelity.png. Resumable like the loop:
a rerun skips finished stages and rebuilds the tables from the run's files.
Example: worldloop fidelity --preset metaworld-gpu --out runs/fid --minutes 2 5 10 20"""

RUN = RunSpec(tuple(f.name for f in dataclasses.fields(Config) if f.name not in ("preset", "device")))  # its stages read every section


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="run folder (resumed when it exists)")
    parser.add_argument("--minutes", type=float, nargs="+", default=[2, 5, 10, 20], help="DiT training budgets in minutes (default: 2 5 10 20)")


def run(args: argparse.Namespace, config: Config) -> int:
    from worldloop.fidelity import run_fidelity

    if any(m <= 0 for m in args.minutes) or len(set(args.minutes)) != len(args.minutes):
        raise ValueError(f"--minutes: distinct positive budgets, got {args.minutes}")
    run_fidelity(config, Path(args.out), sorted(args.minutes), args.preset, list(args.overrides))
    print((Path(args.out) / "fidelity.md").read_text(), end="")
    return 0

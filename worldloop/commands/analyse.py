"""``worldloop analyse``: an experiment's statistics, recomputed from its per-episode verdicts."""

from __future__ import annotations

import argparse

from worldloop.config import Config

HELP = """Analyse an experiment folder (`worldloop experiment --out RUN`, or a committed folder holding its verdicts.json) into
RUN/analysis.md and RUN/analysis.json. Primary endpoint: the final policies' real success on the simulator's own frames,
paired by initial state with the base policy's; secondary: through the world model's VAE (--through-vae). Per arm and
seed: the paired change, its normal z and the exact sign (McNemar) test; per arm: the mean change and its SE across seeds
with an exact sign-flip test over seeds; each arm against the full arm with an exact permutation test over seeds; per
task with Holm's correction across tasks; imagined against real success per arm.
Example: worldloop analyse runs/exp"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="experiment folder")


def run(args: argparse.Namespace, config: Config) -> int:
    from worldloop.analysis import write_analysis

    path = write_analysis(args.run)
    print(path.read_text(), end="")
    print(f"analysis: {path} and {path.with_suffix('.json')}")
    return 0

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
A fidelity gate's folder (`worldloop gate --out GATE`, it holds gate_episodes.json) gets its gate.json and gate.md
again from its episodes' verdicts: the split, the thresholds, every kappa and interval, the episode rules compared
(a gate folder of before 2026-12-06, with judge_calibration.json, from its replays' scores, as it was then).
Example: worldloop analyse runs/exp; worldloop analyse runs/mw/gate"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="experiment folder, or a fidelity gate's folder")


def run(args: argparse.Namespace, config: Config) -> int:
    from pathlib import Path

    from worldloop.analysis import write_analysis
    from worldloop.diagnostics.gate import rebuild_gate

    if (Path(args.run) / "gate_episodes.json").is_file() and (Path(args.run) / "gate.json").is_file():
        print(rebuild_gate(args.run))
        print(f"analyse: {Path(args.run) / 'gate.md'} and gate.json rebuilt from gate_episodes.json")
        return 0
    if (Path(args.run) / "judge_calibration.json").is_file() and (Path(args.run) / "gate.json").is_file():  # a gate of before 2026-12-06
        from worldloop.diagnostics.gate_in_sample import rebuild_gate as rebuild_in_sample_gate

        print(rebuild_in_sample_gate(args.run))
        print(f"analyse: {Path(args.run) / 'gate.md'} and gate.json rebuilt from judge_calibration.json (an in-sample gate of before 2026-12-06)")
        return 0
    path = write_analysis(args.run)
    print(path.read_text(), end="")
    print(f"analysis: {path} and {path.with_suffix('.json')}")
    return 0

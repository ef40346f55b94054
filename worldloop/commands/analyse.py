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
Gate folders of several judges on the same real episodes (`worldloop analyse GATE OTHER ...`) are compared with the
first, episode by episode: where one's replay verdict agrees with the simulator and the other's does not, with the exact
sign test.
Example: worldloop analyse runs/exp; worldloop analyse runs/mw/gate; worldloop analyse runs/mw/gate runs/mw/gate_seen"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="experiment folder, or a fidelity gate's folder")
    parser.add_argument("others", metavar="GATE", nargs="*", help="more gate folders of the same real episodes (other judges or rules): "
                        "compared with RUN, episode by episode; RUN/judges_compared.md and .json. Or more eval-wm folders of "
                        "the recipe's other training runs: the margins side by side with their spread")


def run(args: argparse.Namespace, config: Config) -> int:
    from pathlib import Path

    from worldloop.analysis import write_analysis
    from worldloop.diagnostics.gate import rebuild_gate

    if args.others and all(is_eval_wm(folder) for folder in [args.run, *args.others]):
        from worldloop.utils.io import read_json
        from worldloop.worldmodel.evaluate import recipe_runs, recipe_runs_table

        print(recipe_runs_table(recipe_runs({folder: read_json(Path(folder) / "metrics.json") for folder in [args.run, *args.others]})))
        return 0
    if args.others:
        from worldloop.diagnostics.gate import compare_judges, comparison_table
        from worldloop.utils.io import atomic_write_json, atomic_write_text

        result = compare_judges([args.run, *args.others])
        atomic_write_json(Path(args.run) / "judges_compared.json", result)
        atomic_write_text(Path(args.run) / "judges_compared.md", comparison_table(result) + "\n")
        print(comparison_table(result))
        return 0
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


def is_eval_wm(folder: str) -> bool:
    """Whether ``folder`` holds eval-wm's metrics.json (its horizons' margins over copy-last-frame)."""
    from pathlib import Path

    from worldloop.utils.io import read_json

    path = Path(folder) / "metrics.json"
    horizons = read_json(path).get("horizons") if path.is_file() else None
    return isinstance(horizons, dict) and bool(horizons) and all("copy_last_frame_psnr" in m for m in horizons.values())

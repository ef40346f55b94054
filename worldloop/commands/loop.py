"""``worldloop loop``: the whole closed loop (WoVR's PACE) as one resumable command."""

from __future__ import annotations

import argparse
import dataclasses

from worldloop.config import Config
from worldloop.utils.runfolder import RunSpec

HELP = """Take a base policy to a better one and show the evidence, in one command:
expert demos -> SFT base policy -> base rollouts -> VAE + world model -> judge -> fidelity gate
-> KIR keyframes -> RL stage 1 -> real eval -> evolved-policy rollouts -> world-model refinement -> RL stage 2
-> real eval -> RUN/report.md + RUN/results.json (+ PNG plots).
Each stage writes its folder under RUN and is skipped on a rerun once complete, so an interrupted
loop resumes where it stopped. loop.* sets how much real data each stage spends; bring your own
products with --dataset, --base-policy, --world-model or --judge. The fidelity gate (`worldloop gate`)
lets RL train only on the tasks whose replays in the world model the judge reads as the simulator does
(loop.gate_min_kappa); --time-budget MIN (loop.time_budget_min) gives RL what the stages before it left.
Example: worldloop loop --preset tiny-cpu --out runs/loop"""

# its stages read every section; --until only says where this call stops, and a loop is never "finished": a rerun skips
# the stages with markers and writes the report again (a run stopped by --until and then resumed without it was refused)
RUN = RunSpec(tuple(f.name for f in dataclasses.fields(Config) if f.name not in ("preset", "device")), not_defining=("until",), final=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="run folder (resumed when it exists)")
    parser.add_argument("--dataset", default=None, help="your own demonstration dataset (LeRobot v3) instead of collecting expert demos")
    parser.add_argument("--base-policy", default=None, help="your own base policy folder instead of SFT")
    parser.add_argument("--world-model", default=None, help="your own world-model folder instead of training WM Base")
    parser.add_argument("--judge", default=None, help="your own judge (classifier folder or topreward:PATH) instead of training one")
    parser.add_argument("--time-budget", type=float, default=None, metavar="MIN",
                        help="wall-clock minutes for the whole loop (sets loop.time_budget_min): RL gets what the stages before it left")
    parser.add_argument("--until", default=None, metavar="STAGE", help="stop after this stage (e.g. gate) and write the report so far")


def run(args: argparse.Namespace, config: Config) -> int:
    from worldloop.loop import Inputs, run_loop

    import dataclasses

    inputs = Inputs(dataset=args.dataset, base_policy=args.base_policy, world_model=args.world_model, judge=args.judge)
    overrides = list(args.overrides)
    if args.time_budget is not None:
        overrides.append(f"loop.time_budget_min={args.time_budget}")  # the stages' config.yaml says so too
        config = dataclasses.replace(config, loop=dataclasses.replace(config.loop, time_budget_min=args.time_budget))
        config.loop.validate()
    run_loop(config, args.out, inputs, args.preset, overrides, stop_after=args.until)
    return 0

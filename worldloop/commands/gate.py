"""``worldloop gate``: the fidelity gate. Does the world model, read by the judge, agree with the simulator, task by task?"""

from __future__ import annotations

import argparse
from pathlib import Path

from worldloop.config import Config
from worldloop.utils.runfolder import RunSpec

HELP = """The fidelity gate, run by `worldloop loop` before RL: on each task, loop.gate_episodes_per_task real
episodes of --policy (initial states apart from the evaluations'), their actions replayed open loop in
--world-model and judged by --judge. The judge's threshold is chosen on these replays (as rl.judge_threshold=replay
does), and each task's Cohen's kappa between the replays' verdicts and the simulator's says whether imagination
tracks reality there. A task passes when its kappa is at least loop.gate_min_kappa and more than
reward.calibrate.threshold_significance_se standard errors above chance; RL in the loop trains only on the tasks that pass.
OUT gets gate.json (every number, the passing tasks, why the others fail), gate.md (the table) and
judge_calibration.json/.png (the threshold's choice).
Example: worldloop gate --policy runs/mw/policy_base --world-model runs/mw/wm_base --judge runs/mw/judge \\
         --dataset runs/mw/rollouts_base --out runs/mw/gate"""

RUN = RunSpec(("seed", "sim", "eval", "reward", "world_model", "rl", "loop.gate_episodes_per_task", "loop.gate_min_kappa"))

FIRST_EPISODE = 1000
"""The gate's real episodes use the eval verb's initial states from this episode number on: apart from every
evaluation's (numbers 0 up) and from rl's own calibration's."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", required=True, help="the policy RL would start from (its real episodes are replayed)")
    parser.add_argument("--world-model", required=True, help="world model folder")
    parser.add_argument("--judge", required=True, help="a classifier folder or topreward:PATH")
    parser.add_argument("--dataset", required=True, help="a dataset of the world model's frame size (imagination's initial states)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--tasks", default=None, help="comma-separated simulator tasks (default: sim.tasks / sim.suite)")


def run(args: argparse.Namespace, config: Config) -> int:
    import dataclasses

    import torch

    from worldloop.commands.shared import load_world_model
    from worldloop.config import save_config
    from worldloop.data.dataset import TrajectoryDataset
    from worldloop.diagnostics.gate import gate_table, gate_verdicts
    from worldloop.diagnostics.reality import calibrate_threshold, load_rl_judge, reality_check
    from worldloop.policies import EXPERT, load_policy
    from worldloop.sims.tasks import check_task, resolve_tasks
    from worldloop.utils.device import resolve_device
    from worldloop.utils.io import atomic_write_json, atomic_write_text

    out = Path(args.out)
    tasks = [check_task(task) for task in args.tasks.split(",")] if args.tasks else resolve_tasks(config.sim)
    torch.manual_seed(config.seed)
    device = resolve_device(config.device)
    policy = load_policy(args.policy, device)
    if policy == EXPERT:
        raise ValueError("--policy expert: the gate replays the episodes of the policy RL starts from; give a policy folder")
    save_config(config, out)
    # the calibration of rl.judge_threshold=replay, on the gate's episodes
    gate_config = dataclasses.replace(config, rl=dataclasses.replace(config.rl, eval_episodes_per_task=config.loop.gate_episodes_per_task))
    world_model = load_world_model(args.world_model, config, args.overrides, device)
    judge = load_rl_judge(args.judge, device, config)
    closers: list = []
    try:
        check = reality_check(gate_config, tasks, world_model, judge, TrajectoryDataset(args.dataset), device, closers, first_episode=FIRST_EPISODE)
        calibration = calibrate_threshold(check, policy, judge, config.rl, out / "judge_calibration.json", config.reward.calibrate)
    finally:
        for env in closers:
            env.close()
    result = gate_verdicts(calibration, config.loop.gate_min_kappa, config.reward.calibrate.threshold_significance_se)
    table = gate_table(result)
    atomic_write_json(out / "gate.json", result)
    atomic_write_text(out / "gate.md", table + "\n")
    print(table)
    return 0

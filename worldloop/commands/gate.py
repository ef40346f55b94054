"""``worldloop gate``: the fidelity gate. Does the world model, read by the judge, agree with the simulator, task by task?"""

from __future__ import annotations

import argparse
from pathlib import Path

from worldloop.config import Config
from worldloop.utils.runfolder import RunSpec

HELP = """The fidelity gate, run by `worldloop loop` before RL: on each task, loop.gate_episodes_per_task real
episodes of --policy (initial states apart from the evaluations'), judged at every chunk's end on their real frames
and on their actions replayed open loop in --world-model. Each task's episodes are dealt alternately into a
calibration half, on which the judge's threshold is chosen (one for all tasks, or each its own with
reward.calibrate.threshold_per_task), and an evaluation half, on which alone every verdict is measured: an episode is a
success once rl.success_chunks consecutive verdicts pass, and a task passes when the Cohen's kappa of its replays'
verdicts against the simulator's is at least loop.gate_min_kappa and the lower bound of its bootstrap 95 % interval
lies above loop.gate_min_kappa_lower. RL in the loop trains on the passing tasks with exactly this judge, rule and
threshold (`worldloop rl --gate OUT`).
OUT gets gate_episodes.json (every episode's verdicts: `worldloop analyse OUT` rebuilds the rest from it), gate.json
(every number, the passing tasks, why the others fail, the other episode rules scored on the same split) and gate.md.
Example: worldloop gate --policy runs/mw/policy_base --world-model runs/mw/wm_base --judge runs/mw/judge \\
         --dataset runs/mw/rollouts_base --out runs/mw/gate"""

RUN = RunSpec(("seed", "sim", "eval", "reward", "world_model", "rl", "loop.gate_episodes_per_task", "loop.gate_min_kappa",
               "loop.gate_min_kappa_lower"))

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
    import torch

    from worldloop.commands.shared import load_world_model
    from worldloop.config import save_config
    from worldloop.data.dataset import TrajectoryDataset
    from worldloop.diagnostics.gate import gate_rule, gate_table, measure, write_gate
    from worldloop.policies import EXPERT, load_policy
    from worldloop.rl.envs import load_rl_judge
    from worldloop.sims.tasks import check_task, resolve_tasks
    from worldloop.utils.device import resolve_device

    out = Path(args.out)
    tasks = [check_task(task) for task in args.tasks.split(",")] if args.tasks else resolve_tasks(config.sim)
    torch.manual_seed(config.seed)
    device = resolve_device(config.device)
    policy = load_policy(args.policy, device)
    if policy == EXPERT:
        raise ValueError("--policy expert: the gate replays the episodes of the policy RL starts from; give a policy folder")
    if config.loop.gate_episodes_per_task < 2:
        raise ValueError(f"loop.gate_episodes_per_task={config.loop.gate_episodes_per_task}: the gate calibrates on half of each task's episodes "
                         "and measures on the other half; give at least 2 (48 or more for a kappa worth reading)")  # fmt: skip
    save_config(config, out)
    world_model = load_world_model(args.world_model, config, args.overrides, device)
    judge = load_rl_judge(args.judge, device, config)
    episodes = measure(config, tasks, policy, world_model, judge, TrajectoryDataset(args.dataset), device, FIRST_EPISODE)
    result = write_gate(out, episodes, gate_rule(config), judge.threshold, args.judge)
    print(gate_table(result))
    return 0

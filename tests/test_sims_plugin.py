"""A simulator of a user's own plugs in like Meta-World and LIBERO: registered with its task table, it is collected in,
evaluated in and trained in by the CLI, and its tasks, suites and instructions are its own."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pytest
import torch

from worldloop.cli import main
from worldloop.envs.protocol import REWARD_SCALE, EnvReset, EnvStep
from worldloop.sims.tasks import TaskTable
from worldloop.utils.io import read_json
from worldloop.utils.registry import SIMULATORS

GOALS = {"line-left": 0.0, "line-right": 1.0}


class LineTasks(TaskTable):
    """Two tasks on one line: bring the square to its left end, or to its right end."""

    name, suites = "line", {"line": ["line-left", "line-right"]}

    def instructions(self) -> dict[str, str]:
        return {"line-left": "bring the square to the left end", "line-right": "bring the square to the right end"}


class LineSim:
    """A square on a line: action 0 moves it by up to 0.1 per step; an episode succeeds when the square is within 0.1
    of its task's end. The frames show the square where it is, so a policy can see how far it has to go."""

    action_dim, state_dim, task_table = 4, 1, LineTasks()

    def __init__(self, sim_config, num_envs: int, tasks: Sequence[str] | None = None, render: bool = True):
        from worldloop.sims.tasks import resolve_tasks

        self.num_envs, self.chunk_size, self.image_size = num_envs, sim_config.chunk_size, sim_config.image_size
        self.max_steps, self.device = sim_config.max_steps or 32, torch.device("cpu")
        self.task_names = list(tasks) if tasks else resolve_tasks(sim_config)
        self.x, self.goal, self.steps = torch.zeros(num_envs), torch.zeros(num_envs), torch.zeros(num_envs, dtype=torch.int64)
        self.ended, self.succeeded = torch.zeros(num_envs, dtype=torch.bool), torch.zeros(num_envs, dtype=torch.bool)

    def frames(self) -> torch.Tensor:
        frames = torch.zeros(self.num_envs, self.image_size, self.image_size, 3, dtype=torch.uint8)
        column = (self.x * (self.image_size - 8)).long()
        for i, c in enumerate(column.tolist()):
            frames[i, 24:40, c : c + 8] = 255
        return frames

    def reset(self, task_ids, seeds, expert_plans=None) -> EnvReset:
        tasks = [self.task_names[t] if isinstance(t, int) else t for t in task_ids]
        self.goal = torch.tensor([GOALS[t] for t in tasks])
        self.x = torch.tensor([0.3 + 0.4 * np.random.default_rng(int(s)).random() for s in seeds], dtype=torch.float32)
        self.steps.zero_(), self.ended.zero_(), self.succeeded.zero_()
        instructions = [self.task_table.instruction(t) for t in tasks]
        return EnvReset(self.frames(), instructions, self.x[:, None].clone())

    def step(self, actions: torch.Tensor) -> EnvStep:
        frames, success, done, state = [], [], [], []
        before = self.succeeded.clone()
        for k in range(self.chunk_size):
            moving = ~self.ended
            self.x = torch.where(moving, (self.x + 0.1 * actions[:, k, 0].clamp(-1, 1)).clamp(0, 1), self.x)
            self.steps += moving.long()
            now = (self.x - self.goal).abs() < 0.1
            self.succeeded |= now & moving
            self.ended |= self.succeeded | (self.steps >= self.max_steps)
            frames.append(self.frames()), success.append(now), done.append(self.ended.clone()), state.append(self.x[:, None].clone())
        reward = REWARD_SCALE * (self.succeeded.float() - before.float())
        truncated = self.ended & ~self.succeeded & (self.steps >= self.max_steps)
        return EnvStep(torch.stack(frames, 1), torch.stack(success, 1), torch.stack(done, 1), reward, truncated, torch.stack(state, 1))

    def step_expert(self):
        actions = torch.zeros(self.num_envs, self.chunk_size, self.action_dim)
        actions[..., 0] = torch.sign(self.goal - self.x)[:, None]
        return self.step(actions), actions

    @property
    def elapsed_steps(self) -> torch.Tensor:
        return self.steps.clone()

    def close(self) -> None:
        pass


@pytest.fixture
def line_simulator(monkeypatch):
    monkeypatch.setattr(SIMULATORS, "_entries", dict(SIMULATORS._entries))  # the registration ends with the test
    SIMULATORS.register("line")(LineSim)
    return "line"


def test_a_users_simulator_supplies_its_tasks_and_runs_collect_eval_and_rl(line_simulator, tmp_path, capsys):
    from worldloop.config import load_config
    from worldloop.sims.tasks import check_task, instruction, resolve_tasks, sim_tasks
    from worldloop.rl.evaluate import eval_seed
    from _policy_fixtures import TINY
    from worldloop.policies.compact_vla.modeling import CompactVLA
    from worldloop.policies.tokenizer import ActionTokenizer

    sim = ["sim.backend=line", "sim.suite=line", "sim.max_steps=32", "sim.chunk_size=8", "sim.image_size=64"]
    config = load_config("tiny-cpu", sim)
    assert resolve_tasks(config.sim) == ["line-left", "line-right"] and check_task("line-left") == "line-left"
    assert instruction("line-right") == "bring the square to the right end"
    assert sim_tasks(["bring the square to the left end", "open the drawer"]) == ["line-left", "drawer-open-v3"]  # LIBERO not imported
    assert eval_seed("line-right", 3, 100) == 100 + 1000 + 3  # apart for every task and episode
    with pytest.raises(ValueError, match="unknown line task 'line-up'; did you mean line-left"):
        check_task("line-up", "line")
    with pytest.raises(Exception, match="suite='mt10' is not a suite of sim.backend='line'"):
        load_config("tiny-cpu", ["sim.backend=line"])

    # collect: the simulator's expert reaches both ends
    data = tmp_path / "demos"
    assert main(["collect", "--out", str(data), "--episodes-per-task", "2", "--no-progress", "--preset", "tiny-cpu", *sim]) == 0
    summary = read_json(data / "summary.json")
    assert summary["overall"]["episodes"] == 4 and summary["overall"]["success_rate"] == 1.0
    assert set(summary["tasks"]) == {"line-left", "line-right"}

    # eval: the expert, then a policy, on the eval verb's initial states of the simulator's tasks
    assert main(["eval", "--policy", "expert", "--out", str(tmp_path / "ev"), "--episodes-per-task", "2", "--preset", "tiny-cpu", *sim]) == 0
    assert read_json(tmp_path / "ev" / "results.json")["success_once"] == 1.0
    torch.manual_seed(0)
    policy = CompactVLA(load_config("tiny-cpu", [*TINY, *sim]).policy, LineSim.action_dim, 64, ActionTokenizer.fit(torch.rand(64, 4) * 2 - 1))
    policy.save_pretrained(tmp_path / "policy")  # its instructions are encoded when a verb meets them
    assert main(["eval", "--policy", str(tmp_path / "policy"), "--out", str(tmp_path / "ev-policy"), "--episodes-per-task", "1",
                 "--preset", "tiny-cpu", *TINY, *sim]) == 0  # fmt: skip
    results = read_json(tmp_path / "ev-policy" / "results.json")
    assert results["episodes"] == 2 and results["per_task"]["line-left"]["instruction"] == "bring the square to the left end"

    # rl in the simulator itself: one GRPO iteration with reality checks before and after (the preset's rl.checks.tasks
    # are Meta-World's: refused by name)
    out = tmp_path / "rl"
    rl = ["rl", "--policy", str(tmp_path / "policy"), "--env", "real", "--out", str(out), "--no-progress", "--preset", "tiny-cpu", *TINY, *sim,
          "rl.iterations=1", "rl.num_groups=2", "rl.group_size=2", "rl.max_steps=32", "rl.checks.episodes_per_task=1", "rl.update_epochs=1",
          "rl.num_minibatches=1"]  # fmt: skip
    assert main(rl) == 2 and "rl.checks.tasks: unknown line task 'drawer-close-v3'" in capsys.readouterr().err
    assert main([*rl, "rl.checks.tasks=[]"]) == 0
    trained = read_json(out / "results.json")
    assert trained["iterations"] == 1 and (out / "policy").is_dir()
    assert set(trained["evaluations"][-1]["real"]["per_task"]) == {"line-left", "line-right"}

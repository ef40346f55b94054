"""Meta-World as a :class:`worldloop.envs.protocol.VecEnv`: N episodes stepped in action chunks.

Environments are spread over ``sim.num_workers`` processes in contiguous blocks; each worker
steps a whole chunk of K actions for all its environments per message, so the cost of
inter-process communication is one round trip per chunk. With one worker (or one environment)
everything runs in this process.

    env = MetaWorldVecEnv(config.sim, num_envs=4)
    first = env.reset(task_ids=[0, 1, 2, 3], seeds=[0, 1, 2, 3])
    out = env.step(actions)          # (4, K, 4) float -> EnvStep with (4, K, H, W, 3) frames
    out, actions = env.step_expert() # the scripted experts act, closed loop, for one chunk
    env.close()
"""

from __future__ import annotations

import multiprocessing as mp
import os
import weakref
from typing import Sequence

import numpy as np
import torch

from worldloop.envs.protocol import REWARD_SCALE, EnvReset, EnvStep, check_actions
from worldloop.sims.experts import ExpertPlan
from worldloop.sims.tasks import ALL_TASKS, METAWORLD_TASKS, check_task, instruction, resolve_tasks
from worldloop.sims.configuration import METAWORLD_CAMERAS
from worldloop.sims.worker import ACTION_DIM, DEFAULT_MAX_STEPS, STATE_DIM, SimWorker, worker_main
from worldloop.utils.gl import RenderingUnavailable


class MetaWorldVecEnv:
    """N Meta-World episodes, each with its own task, seed, step counter and done flag.

    Another simulator (:class:`worldloop.sims.libero.LiberoVecEnv`) reuses the processes and the
    chunked stepping by setting ``worker_class``, ``cameras`` and the task hooks below."""

    action_dim = ACTION_DIM
    state_dim = STATE_DIM
    worker_class: type = SimWorker
    cameras = METAWORLD_CAMERAS
    task_table = METAWORLD_TASKS
    simulator = "Meta-World"

    def check_task(self, name: str) -> str:
        task = check_task(name)
        if task not in ALL_TASKS:
            raise ValueError(f"'{name}' is not a Meta-World task: set sim.backend=libero for LIBERO's")
        return task

    def resolve_tasks(self, sim_config) -> list[str]:
        return resolve_tasks(sim_config)

    def instruction(self, task: str) -> str:
        return instruction(task)

    def default_max_steps(self, task: str) -> int:
        """The task's episode length when sim.max_steps is 0."""
        return DEFAULT_MAX_STEPS

    def __init__(self, sim_config, num_envs: int, tasks: Sequence[str] | None = None, render: bool = True):
        """``render=False`` runs the physics only (black frames): for the scripted experts, which read the state."""
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if sim_config.camera not in self.cameras:
            raise ValueError(f"sim.camera = '{sim_config.camera}' is not a {self.simulator} camera; allowed: {', '.join(self.cameras)}")
        self.config = sim_config
        self.task_names = [self.check_task(t) for t in tasks] if tasks else self.resolve_tasks(sim_config)
        self.num_envs = num_envs
        self.chunk_size = sim_config.chunk_size
        self.image_size = sim_config.image_size
        self.max_steps = sim_config.max_steps or max(self.default_max_steps(t) for t in self.task_names)
        self.device = torch.device("cpu")
        self.instructions: list[str] = []
        self._steps = torch.zeros(num_envs, dtype=torch.int64)
        self._ever_success = torch.zeros(num_envs, dtype=torch.bool)  # R: the episode has succeeded by now
        self._done = torch.zeros(num_envs, dtype=torch.bool)
        self._started = False

        num_workers = min(sim_config.num_workers, num_envs)
        bounds = np.linspace(0, num_envs, num_workers + 1).round().astype(int)
        self._blocks = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        self._local: SimWorker | None = None
        self._processes: list[mp.process.BaseProcess] = []
        self._conns: list = []
        if num_workers == 1:
            self._local = self.worker_class(sim_config, num_envs, render)
        else:
            context = mp.get_context("spawn")
            for block in self._blocks:
                parent_conn, child_conn = context.Pipe()
                process = context.Process(
                    target=worker_main,
                    args=(child_conn, sim_config, block.stop - block.start, os.getpid(), self.worker_class, render),
                    daemon=True,
                    name=f"worldloop-sim-{block.start}",
                )
                process.start()
                child_conn.close()
                self._processes.append(process)
                self._conns.append(parent_conn)
        # Runs on close(), when the env is garbage-collected, or at interpreter exit (before
        # OpenGL is torn down), whichever comes first.
        self._finalizer = weakref.finalize(self, _shutdown, self._local, self._processes, self._conns)

    def worker_pids(self) -> list[int]:
        """The process ids of the simulator's worker processes ([] when it runs in this process)."""
        return [int(process.pid) for process in self._processes if process.pid is not None]

    # ------------------------------------------------------------------------------------------
    # The VecEnv protocol

    def reset(self, task_ids: Sequence[int | str], seeds: Sequence[int], expert_plans: Sequence[ExpertPlan] | None = None) -> EnvReset:
        """Start N episodes: task ``task_ids[i]`` (index into ``task_names`` or a task name), scene
        seed ``seeds[i]``; ``expert_plans[i]`` sets how :meth:`step_expert` behaves (default: clean)."""
        n = self.num_envs
        if len(task_ids) != n or len(seeds) != n:
            raise ValueError(f"reset needs one task id and one seed per environment ({n}); got {len(task_ids)} task ids and {len(seeds)} seeds")
        if expert_plans is not None and len(expert_plans) != n:
            raise ValueError(f"reset needs one expert plan per environment ({n}); got {len(expert_plans)}")
        tasks = [self._task_name(t) for t in task_ids]
        bad_seeds = [s for s in seeds if int(s) != s or int(s) < 0]
        if bad_seeds:
            raise ValueError(f"seeds must be non-negative integers, got {bad_seeds}")
        plans = list(expert_plans) if expert_plans is not None else [ExpertPlan(seed=int(s)) for s in seeds]
        items = [(task, int(seed), plan) for task, seed, plan in zip(tasks, seeds, plans)]
        result = self._call("reset", [items[b] for b in self._blocks])
        self.instructions = [self.instruction(t) for t in tasks]
        self._steps.zero_()
        self._ever_success.zero_()
        self._done.zero_()
        self._started = True
        return EnvReset(
            frames=torch.from_numpy(result["frames"]),
            instructions=list(self.instructions),
            state=torch.from_numpy(result["state"]),
        )

    def step(self, actions: torch.Tensor) -> EnvStep:
        """Execute one (N, K, A) action chunk."""
        check_actions(actions, self.num_envs, self.chunk_size, self.action_dim)
        actions_np = actions.detach().to("cpu", torch.float32).numpy()
        if not np.isfinite(actions_np).all():
            raise ValueError("actions contain NaN or inf")
        return self._step([actions_np[b] for b in self._blocks])[0]

    def step_expert(self) -> tuple[EnvStep, torch.Tensor]:
        """One chunk of the simulator's scripted experts, closed loop, following each env's expert plan.
        Returns the step and the (N, K, A) actions taken (zeros after an episode is done)."""
        return self._step([None] * len(self._blocks))

    @property
    def elapsed_steps(self) -> torch.Tensor:
        return self._steps.clone()

    def close(self) -> None:
        """End the workers (or free the in-process renderers); safe to call twice."""
        self._finalizer()

    def __enter__(self) -> "MetaWorldVecEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------

    def _task_name(self, task_id: int | str) -> str:
        if isinstance(task_id, str):
            return self.check_task(task_id)
        index = int(task_id)
        if not 0 <= index < len(self.task_names):
            raise ValueError(f"task id {index} is out of range: this env has {len(self.task_names)} tasks ({', '.join(self.task_names)})")
        return self.task_names[index]

    def _step(self, payloads: list) -> tuple[EnvStep, torch.Tensor]:
        if not self._started:
            raise RuntimeError("call reset(task_ids, seeds) before step")
        result = self._call("step", payloads)
        success = torch.from_numpy(result["success"])
        done = torch.from_numpy(result["done"])
        succeeded_before = self._ever_success.clone()
        self._ever_success |= success.any(dim=1)  # R: succeeded at any step so far, mid-chunk included
        reward = REWARD_SCALE * (self._ever_success.float() - succeeded_before.float())
        ended_now = done[:, -1] & ~self._done
        truncated = ended_now & ~self._ever_success
        self._done = done[:, -1].clone()
        self._steps = torch.from_numpy(result["steps"])
        step = EnvStep(
            frames=torch.from_numpy(result["frames"]),
            success=success,
            done=done,
            reward=reward,
            truncated=truncated,
            state=torch.from_numpy(result["state"]),
        )
        return step, torch.from_numpy(result["actions"])

    def _call(self, command: str, payloads: list) -> dict[str, np.ndarray]:
        """Run ``command`` on every worker (all at once) and concatenate their results in env order."""
        if not self._finalizer.alive:
            raise RuntimeError("this environment is closed")
        if self._local is not None:
            return getattr(self._local, command)(payloads[0])
        try:
            for conn, payload in zip(self._conns, payloads):
                conn.send((command, payload))
            results, errors = [], []
            for conn, process in zip(self._conns, self._processes):
                try:
                    status, result = conn.recv()
                except (EOFError, OSError):
                    process.join(timeout=1)
                    raise RuntimeError(
                        f"simulator worker {process.name} died (exit code {process.exitcode}); workers are started with 'spawn', "
                        "so a script that creates the env must do so under `if __name__ == '__main__':`"
                    ) from None
                if status == "error":
                    errors.append(result)
                results.append(result)
        except BaseException:  # Ctrl-C or a dead worker mid-chunk: the pipes are out of step, end every worker
            self.close()
            raise
        if errors:
            prefix = f"{RenderingUnavailable.__name__}: "
            if errors[0].startswith(prefix):  # the same clear error as with one in-process worker
                raise RenderingUnavailable(errors[0][len(prefix) :].split("\n", 1)[0])
            raise RuntimeError("simulator worker failed:\n" + errors[0])
        return {key: np.concatenate([r[key] for r in results]) for key in results[0]}


def _shutdown(local: SimWorker | None, processes: list, conns: list) -> None:
    """Close an env's in-process worker, or ask its worker processes to exit and reap them."""
    if local is not None:
        local.close()
    for conn in conns:
        try:
            conn.send(("close", None))
        except (BrokenPipeError, OSError):
            pass
    for process in processes:
        process.join(timeout=5)
        if process.is_alive():
            process.terminate()
            process.join(timeout=5)
    for conn in conns:
        conn.close()

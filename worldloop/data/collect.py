"""Collect trajectories in the real simulator into a LeRobot v3.0 dataset, resumably.

The collection is a deterministic *plan*: for every task, episodes 0..N-1, each with a simulator
seed derived from ``config.seed`` and the task name, a fixed share of them noisy (an
:class:`~worldloop.sims.experts.ExpertPlan` drawn from the same seed). Each planned episode has a
key (``task/episode``) that is stored with it, so rerunning on the same folder skips what is
committed and runs the rest; raising ``--episodes-per-task`` later extends the same plan.

A *driver* decides the actions: :func:`expert_driver` lets the simulator's scripted experts act
(closed loop, per their plans); :func:`policy_driver` wraps any object with
``act(images, instructions) -> ActOutput`` (e.g. a VLA checkpoint), chunk by chunk.
"""

from __future__ import annotations

import signal
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from worldloop.config import CONFIG_FILENAME, ConfigError, load_saved_config, save_config
from worldloop.data.configuration import FPS, NOISY_FRACTION, PLAN_DEFINING
from worldloop.utils.io import atomic_write_json
from worldloop.utils.stats import rate_with_stderr

SUMMARY_FILENAME = "summary.json"


@dataclass(frozen=True)
class PlannedEpisode:
    key: str
    """'task/episode', unique in a dataset: what a resumed collection skips."""
    task: str
    """Simulator task name."""
    episode: int
    """Index of the episode within its task (0..N-1)."""
    seed: int
    """Simulator seed (Meta-World: initial state and goal; LIBERO: fixed initial state seed % 50)."""
    noisy: bool
    """Collected with the noisy expert."""


def collection_plan(tasks: list[str], episodes_per_task: int, noisy_fraction: float, seed: int, first_episode: int = 0) -> list[PlannedEpisode]:
    """The planned episodes, interleaved across tasks (episode ``first_episode`` of every task, then the next, ...).

    Episode e of a task is noisy when floor((e+1) f) > floor(e f) (f the noisy fraction), which
    spreads noisy episodes evenly and keeps the first N of a longer plan identical to a shorter one.
    Seeds depend on (seed, task name, e) only, so adding tasks changes no other episode, and a plan from
    ``first_episode`` N on continues one of N episodes per task with initial states of its own.
    """
    plan = []
    for e in range(first_episode, first_episode + episodes_per_task):
        for task in tasks:
            sim_seed = int(np.random.default_rng([seed, zlib.crc32(task.encode()), e]).integers(2**31 - 1))
            noisy = int((e + 1) * noisy_fraction + 1e-9) > int(e * noisy_fraction + 1e-9)
            plan.append(PlannedEpisode(key=f"{task}/{e:04d}", task=task, episode=e, seed=sim_seed, noisy=noisy))
    return plan


# --------------------------------------------------------------------------------------------
# Drivers: who picks the actions


Driver = Callable[[Any, torch.Tensor, list[str]], tuple[Any, torch.Tensor]]
"""(env, current frames (N, H, W, 3) uint8, instructions) -> (EnvStep, actions (N, K, A) taken)."""


def expert_driver(env, frames: torch.Tensor, instructions: list[str]):
    """The simulator's scripted experts act for one chunk (their plans were given at reset)."""
    return env.step_expert()


def policy_driver(policy, temperature: float = 1.0, greedy: bool = False) -> Driver:
    """A driver from any policy with ``act(images, instructions, temperature, greedy) -> ActOutput``."""

    def drive(env, frames: torch.Tensor, instructions: list[str]):
        with torch.no_grad():
            out = policy.act(frames, instructions, temperature=temperature, greedy=greedy)
        actions = out.actions.to("cpu", torch.float32)
        return env.step(actions), actions

    return drive


# --------------------------------------------------------------------------------------------
# Running


def run_batch(env, batch: list[PlannedEpisode], driver: Driver, expert_config) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """Run one episode per environment (``len(batch) == env.num_envs``); yield ``(i, episode)`` as
    soon as environment i's episode has ended, so that it can be committed while the others run.

    An episode holds frames (T, H, W, 3) uint8 (the observation before each action), actions
    (T, A), success (T,) after each action and state (T, S) before each action; T = actions executed.
    """
    from worldloop.sims.experts import plan_episode

    plans = [plan_episode(expert_config, p.noisy, p.seed) for p in batch]  # used by step_expert only
    reset = env.reset([p.task for p in batch], [p.seed for p in batch], expert_plans=plans)
    frames = [reset.frames[:, None]]  # chunks of (N, k, H, W, 3)
    states = [reset.state[:, None]] if reset.state is not None else None
    actions, success, done = [], [], []
    current = reset.frames
    finished = np.zeros(len(batch), bool)
    while not finished.all():
        step, taken = driver(env, current, list(reset.instructions))
        frames.append(step.frames)
        if states is not None:
            states.append(step.state)
        actions.append(taken)
        success.append(step.success)
        done.append(step.done)
        current = step.frames[:, -1]
        for i in np.flatnonzero(step.done[:, -1].numpy() & ~finished):
            finished[i] = True
            done_i = torch.cat([d[i] for d in done]).numpy()
            length = int(np.flatnonzero(done_i)[0]) + 1
            yield int(i), {
                "frames": torch.cat([f[i] for f in frames])[:length].numpy(),
                "actions": torch.cat([a[i] for a in actions])[:length].numpy().astype(np.float32),
                "success": torch.cat([s[i] for s in success])[:length].numpy().astype(bool),
                "state": torch.cat([s[i] for s in states])[:length].numpy().astype(np.float32) if states is not None else None,
            }


def collect(
    config,
    out: str | Path,
    driver: Driver | None = None,
    policy_name: str = "expert",
    episodes_per_task: int | None = None,
    progress: bool = True,
    max_episodes: int | None = None,
    first_episode: int = 0,
) -> dict[str, Any]:
    """Collect the planned episodes into the dataset at ``out`` (resuming), then summarise it.

    ``driver`` defaults to the scripted expert. ``first_episode``: the plan's first episode number per task (episodes
    0 .. N-1 of the same seed are another dataset's, e.g. the base rollouts a world model trained on). ``max_episodes`` stops after that many new
    episodes (for tests and partial runs). Returns the summary that is also written to
    ``out/summary.json``.
    """
    from tqdm import tqdm

    from worldloop.data.writer import DatasetWriter
    from worldloop.sims import make_env
    from worldloop.sims.tasks import instruction, resolve_tasks
    from worldloop.utils.registry import SIMULATORS

    out = Path(out)
    try:
        tasks = resolve_tasks(config.sim)
    except ValueError as error:
        raise ConfigError(f"sim.tasks / sim.suite: {error}") from error
    n_per_task = config.collect.episodes_per_task if episodes_per_task is None else episodes_per_task
    if n_per_task < 1:
        raise ConfigError(f"episodes per task must be >= 1, got {n_per_task}")
    if first_episode < 0:
        raise ConfigError(f"the first episode number must be >= 0, got {first_episode}")
    check_resumable(config, out)
    save_config(config, out)
    driver = driver or expert_driver
    start = time.time()
    simulator = SIMULATORS.get(config.sim.backend)
    with DatasetWriter(out, fps=FPS, image_size=config.sim.image_size, action_dim=simulator.action_dim, state_dim=simulator.state_dim) as writer:
        others = sorted({str(r.get("worldloop/policy")) for r in writer.episode_rows()} - {policy_name})
        if others:
            raise ConfigError(f"{out} holds episodes collected by policy {', '.join(others)}; collect with --policy {policy_name} into another folder")
        done_keys = writer.completed_keys()
        # the expert's noise plan means nothing to a policy: none of its episodes is a noisy expert's
        noisy_fraction = NOISY_FRACTION if policy_name == "expert" else 0.0
        plan = collection_plan(tasks, n_per_task, noisy_fraction, config.seed, first_episode)
        todo = [p for p in plan if p.key not in done_keys]
        if max_episodes is not None:
            todo = todo[:max_episodes]
        new_outcomes: list[bool] = []
        if todo:
            num_envs = max(1, min(config.collect.num_envs, len(todo)))
            bar = tqdm(total=len(todo), unit="ep", desc="collect", disable=not progress, dynamic_ncols=True)
            env = make_env(config, num_envs, tasks=tasks)
            try:
                with _sigterm_as_interrupt():
                    for first in range(0, len(todo), num_envs):
                        batch = todo[first : first + num_envs]
                        padded = batch + [batch[-1]] * (num_envs - len(batch))  # extra envs rerun the last; dropped
                        for i, episode in run_batch(env, padded, driver, config.expert):
                            if i >= len(batch):
                                continue
                            planned = batch[i]
                            writer.add_episode(
                                episode["frames"],
                                episode["actions"],
                                episode["success"],
                                instruction(planned.task),
                                state=episode["state"],
                                key=planned.key,
                                extra={
                                    "task": planned.task,
                                    "episode": planned.episode,
                                    "seed": planned.seed,
                                    "noisy": planned.noisy,
                                    "policy": policy_name,
                                },
                            )
                            new_outcomes.append(bool(episode["success"].any()))
                            bar.set_postfix(success=f"{np.mean(new_outcomes):.2f}", refresh=False)
                            bar.update(1)
            finally:
                bar.close()
                env.close()
        summary = summarize(writer.episode_rows())
    order = {task: i for i, task in enumerate(tasks)}
    summary["tasks"] = dict(sorted(summary["tasks"].items(), key=lambda item: (order.get(item[0], len(order)), item[0])))
    summary["run"] = {
        "new_episodes": len(new_outcomes),
        "skipped_completed": len(done_keys),
        "wall_time_s": round(time.time() - start, 2),
        "episodes_per_s": round(len(new_outcomes) / max(time.time() - start, 1e-9), 3),
        "policy": policy_name,
    }
    atomic_write_json(out / SUMMARY_FILENAME, summary)
    return summary


def check_resumable(config, out: Path) -> None:
    """Refuse to write into ``out`` when it holds a collection made with incompatible settings,
    or anything that is not a worldloop dataset."""
    from worldloop.utils.runfolder import LOCK_NAME, RUN_FILE, RunSpec, differences, run_settings

    saved_path = out / CONFIG_FILENAME
    if saved_path.is_file():
        plan = RunSpec(PLAN_DEFINING)
        changed = differences(run_settings(plan, load_saved_config(saved_path), {}), run_settings(plan, config, {}))
        if changed:
            raise ConfigError(
                f"{out} was collected with other settings and cannot be resumed with these ({'; '.join(changed)}); "
                "use another --out folder or the same settings"
            )
    elif out.exists() and any(p for p in out.iterdir() if p.name not in (LOCK_NAME, RUN_FILE)):
        raise ConfigError(f"{out} exists and is not a worldloop collection (no {CONFIG_FILENAME}); choose an empty or new --out folder")


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per task: episodes, success rate (success at any step) with its standard error, mean length;
    the same split by clean/noisy; and overall."""

    def block(selected: list[dict[str, Any]]) -> dict[str, Any]:
        if not selected:  # null, not NaN: summary.json stays strict JSON (a policy's rollouts have no noisy episodes)
            return {"episodes": 0, "success_rate": None, "stderr": None, "mean_length": None}
        rate, stderr = rate_with_stderr([bool(r.get("worldloop/success")) for r in selected])
        mean_length = float(np.mean([r["length"] for r in selected]))
        return {"episodes": len(selected), "success_rate": rate, "stderr": stderr, "mean_length": mean_length}

    def with_splits(selected: list[dict[str, Any]]) -> dict[str, Any]:
        result = block(selected)
        result["clean"] = block([r for r in selected if not r.get("worldloop/noisy")])
        result["noisy"] = block([r for r in selected if r.get("worldloop/noisy")])
        return result

    tasks: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        tasks.setdefault(row.get("worldloop/task") or row["tasks"][0], []).append(row)
    return {"tasks": {t: with_splits(r) for t, r in tasks.items()}, "overall": with_splits(rows)}


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as a fixed-width table."""
    header = f"{'task':<26} {'episodes':>8} {'success':>15} {'clean':>15} {'noisy':>15} {'mean len':>9}"
    lines = [header, "-" * len(header)]

    def rate(b: dict[str, Any]) -> str:
        return "-" if not b["episodes"] else f"{b['success_rate']:.2f} ± {b['stderr']:.2f}"

    entries = list(summary["tasks"].items()) + [("overall", summary["overall"])]
    for i, (name, b) in enumerate(entries):
        if i == len(entries) - 1:
            lines.append("-" * len(header))
        lines.append(f"{name:<26} {b['episodes']:>8} {rate(b):>15} {rate(b['clean']):>15} {rate(b['noisy']):>15} {b['mean_length']:>9.1f}")
    return "\n".join(lines)


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt so that workers are closed on the way out (committed
    episodes are safe either way)."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

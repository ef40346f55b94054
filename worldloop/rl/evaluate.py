"""Evaluation in the real simulator: success_once per task and overall, with standard errors.

Episode e of task t always starts from simulator seed ``EVAL_SEED_OFFSET + 1000 * global_index(t) + e``
(``global_index`` is the task's position in Meta-World's task list, so a task keeps its seeds in any
suite), disjoint from collection seeds, which stay below 2**31 = ``EVAL_SEED_OFFSET``. Episodes run in waves of
``num_envs`` environments spread over the simulator's worker processes; in each chunk the policy acts
on every environment in one batched forward. Sampling draws from one generator seeded with
``config.seed``, so two runs of the same checkpoint on the CPU give identical numbers.

LIBERO follows the standard protocol (OpenVLA-OFT's): episode e of a task starts from the task's fixed
initial state e (50 per task), so 50 episodes per task cover them all once.

The scripted expert (``policy="expert"``) runs through the same path with ``env.step_expert()``:
its success rate (~100% on MT10) is the evaluator's sanity check. Without videos it runs the physics
only (``make_env(render=False)``): it reads the simulator's state, not frames.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from worldloop.data.configuration import FPS
from worldloop.policies import EXPERT
from worldloop.utils.stats import rate_with_stderr


EVAL_SEED_OFFSET = 2**31
"""Episode e of Meta-World task t (its index among all tasks) is evaluated from simulator seed EVAL_SEED_OFFSET + 1000 t + e;
collection draws its seeds below 2**31, so evaluation stays disjoint from it."""


def eval_seed(task: str, episode: int, seed_offset: int = EVAL_SEED_OFFSET) -> int:
    """The initial-state seed of ``episode`` of ``task``, as its simulator's task table says (Meta-World: a scene seed
    apart for every task and episode; LIBERO: the index of the task's fixed initial state, ``episode`` itself, the
    standard protocol: episodes 0..49 start from the 50 initial states in order)."""
    from worldloop.sims.tasks import owner

    table, task = owner(task)
    return table.eval_seed(task, episode, seed_offset)


def evaluation_seeds(tasks: Sequence[str], episodes_per_task: int, seed_offset: int = EVAL_SEED_OFFSET) -> list[int]:
    """The initial-state seed of every episode of an evaluation, in its job order (episode-major, tasks interleaved)."""
    return [eval_seed(task, episode, seed_offset) for episode in range(episodes_per_task) for task in tasks]


def check_policy_fits(policy, env) -> None:
    """A clear error when the policy cannot drive ``env`` (action dimension, frame size, chunk size)."""
    where = getattr(policy, "source", "the policy")
    if policy.action_dim != env.action_dim:
        raise ValueError(f"{where} acts in {policy.action_dim} action dimensions but the environment takes {env.action_dim}: it was trained for another robot or simulator")
    if policy.image_size != env.image_size:
        raise ValueError(f"{where} takes {policy.image_size}x{policy.image_size} frames but the environment renders {env.image_size}x{env.image_size}; set sim.image_size={policy.image_size}")
    if policy.chunk_size != env.chunk_size:
        raise ValueError(f"{where} emits chunks of {policy.chunk_size} actions but the environment steps {env.chunk_size}; set sim.chunk_size={policy.chunk_size}")


def evaluate_policy(
    policy,
    config,
    tasks: Sequence[str] | None = None,
    episodes_per_task: int | None = None,
    out: str | Path | None = None,
    greedy: bool | None = None,
    temperature: float | None = None,
    num_envs: int | None = None,
    videos_per_task: int | None = None,
    progress: bool = True,
    world_model: str | Path | None = None,
) -> dict[str, Any]:
    """Run ``episodes_per_task`` episodes of every task and return the results dict (also written
    to ``out/results.json`` and ``out/results.md``, with captioned videos in ``out/videos``, when
    ``out`` is given). Unset arguments come from ``config.eval``; tasks default to the suite."""
    from tqdm import tqdm

    from worldloop.sims import make_env
    from worldloop.sims.tasks import instruction, resolve_tasks
    from worldloop.utils.device import autocast_dtype

    ev = config.eval
    tasks = list(tasks) if tasks else resolve_tasks(config.sim)
    episodes_per_task = episodes_per_task or ev.episodes_per_task
    greedy = ev.greedy if greedy is None else greedy
    temperature = 1.0 if temperature is None else temperature
    videos_per_task = ev.videos_per_task if videos_per_task is None else videos_per_task
    if out is None:
        videos_per_task = 0
    is_expert = isinstance(policy, str) and policy == EXPERT

    jobs = [(task, episode) for episode in range(episodes_per_task) for task in tasks]  # tasks interleaved over workers
    num_envs = min(num_envs or ev.num_envs, len(jobs))
    success = np.zeros(len(jobs), dtype=bool)
    lengths = np.zeros(len(jobs), dtype=np.int64)
    videos: dict[int, np.ndarray] = {}
    if not is_expert:
        # encode new instructions before the simulator starts: the text encoder's imports (triton)
        # crash in a process that already renders with Mesa's EGL
        policy.add_instructions([instruction(task) for task in tasks])
    vae = None
    if world_model is not None:  # loaded before the simulator starts rendering, like the instructions below
        from worldloop.worldmodel.vae import world_model_vae

        if is_expert:
            raise ValueError("the scripted expert acts on the simulator's state, not on frames: --world-model applies to policies")
        vae = world_model_vae(world_model, config.sim.image_size).to(policy.device)
    env = make_env(config, num_envs, tasks=tasks, render=not (is_expert and videos_per_task == 0))
    if vae is not None:  # the policy sees the simulator through the world model's VAE, as it sees imagination
        from worldloop.envs.codec import CodecObservations

        env = CodecObservations(env, vae)
    started, env_steps = time.time(), 0
    bar = tqdm(total=len(jobs), desc=f"eval {'expert' if is_expert else 'policy'}", dynamic_ncols=True, disable=None if progress else True)
    try:
        if not is_expert:
            check_policy_fits(policy, env)
            policy.eval()
            device = policy.device
            generator = torch.Generator(device=device).manual_seed(config.seed)
            dtype = autocast_dtype(device)
        for first in range(0, len(jobs), num_envs):
            wave = list(range(first, min(first + num_envs, len(jobs))))
            slots = wave + [wave[-1]] * (num_envs - len(wave))  # a short last wave repeats its last job
            reset = env.reset([jobs[j][0] for j in slots], [eval_seed(jobs[j][0], jobs[j][1]) for j in slots])
            record = [i for i, j in enumerate(wave) if jobs[j][1] < videos_per_task]
            clips = {i: [reset.frames[i].numpy()] for i in record}
            frames, ever = reset.frames, torch.zeros(num_envs, dtype=torch.bool)
            done = torch.zeros(num_envs, dtype=torch.bool)
            while not done.all():
                if is_expert:
                    step, _ = env.step_expert()
                else:
                    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                        acted = policy.act(frames, reset.instructions, temperature=temperature, greedy=greedy, generator=generator)
                    step = env.step(acted.actions.float().cpu())
                ever |= step.success.any(dim=1)
                done = step.done[:, -1]
                frames = step.frames[:, -1]
                for i in record:
                    clips[i].append(step.frames[i].numpy())
            steps = env.elapsed_steps
            for i, j in enumerate(wave):
                success[j], lengths[j] = bool(ever[i]), int(steps[i])
                if i in clips:
                    videos[j] = np.concatenate([clips[i][0][None], *clips[i][1:]])[: lengths[j] + 1]
            env_steps += int(steps[: len(wave)].sum())
            bar.update(len(wave))
    finally:
        bar.close()
        env.close()
    seconds = time.time() - started
    results = evaluation_results(policy, config, tasks, jobs, success, lengths, greedy, temperature, seconds, env_steps, world_model)
    if out is not None:
        write_results(results, out, {j: (jobs[j], bool(success[j]), clip) for j, clip in videos.items()}, FPS)
    return results


def evaluation_results(policy, config, tasks: Sequence[str], jobs: list[tuple[str, int]], success: np.ndarray, lengths: np.ndarray,
                       greedy: bool, temperature: float, seconds: float, env_steps: int, world_model: str | Path | None) -> dict[str, Any]:  # fmt: skip
    """:func:`evaluate_policy`'s results dict from its episodes' outcomes (``jobs``: (task, episode) in run order)."""
    from worldloop.sims.tasks import instruction

    is_expert = isinstance(policy, str) and policy == EXPERT
    episodes_per_task = len(jobs) // len(tasks)
    per_task = {}
    for task in tasks:
        rows = [j for j, (t, _) in enumerate(jobs) if t == task]
        rate, stderr = rate_with_stderr(success[rows].tolist())
        per_task[task] = {
            "instruction": instruction(task),
            "success_once": rate,
            "stderr": stderr,
            "episodes": len(rows),
            "mean_episode_length": float(lengths[rows].mean()),
            "per_episode": "".join("1" if success[j] else "0" for j in rows),  # episode 0, 1, ...: for paired comparisons
        }
    rate, stderr = rate_with_stderr(success.tolist())
    results = {
        "policy": EXPERT if is_expert else getattr(policy, "source", type(policy).__name__),
        "success_once": rate,
        "stderr": stderr,
        "episodes": len(jobs),
        "episodes_per_task": episodes_per_task,
        "mean_episode_length": float(lengths.mean()),
        "greedy": bool(greedy) if not is_expert else None,
        "temperature": float(temperature) if not (is_expert or greedy) else None,
        "seeds": evaluation_seeds(tasks, episodes_per_task),
        "per_task": per_task,
        "seconds": seconds,
        "env_steps_per_second": env_steps / max(seconds, 1e-9),
        "sim": dataclasses.asdict(config.sim),
        "observed_through": None if world_model is None else str(world_model),
    }
    return results


def paired_eval_change(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """How success_once changed from evaluation ``before`` to ``after`` of the same tasks and initial states (the
    same seeds, e.g. a base policy and its RL-trained successor), paired episode by episode, overall and per task
    (:func:`worldloop.utils.stats.paired_difference`)."""
    from worldloop.utils.stats import paired_difference

    if before.get("seeds") != after.get("seeds"):
        raise ValueError("the two evaluations did not start from the same initial states (their seeds differ): evaluate both "
                         "with the same tasks and episodes per task")  # fmt: skip
    if any("per_episode" not in row for result in (before, after) for row in result["per_task"].values()):
        raise ValueError("an evaluation without per-episode outcomes (results.json from before they were kept): evaluate it again")
    per_task = {task: paired_difference([c == "1" for c in before["per_task"][task]["per_episode"]], [c == "1" for c in row["per_episode"]])
                for task, row in after["per_task"].items() if row["episodes"] >= 2}  # fmt: skip
    tasks = list(after["per_task"])
    overall = paired_difference([c == "1" for t in tasks for c in before["per_task"][t]["per_episode"]],
                                [c == "1" for t in tasks for c in after["per_task"][t]["per_episode"]])  # fmt: skip
    return overall | {"per_task": per_task}


def write_results(results: dict[str, Any], out: str | Path, videos: dict, fps: int) -> None:
    """``results.json``, ``results.md`` and captioned ``videos/<task>_<episode>.mp4`` in ``out``."""
    from worldloop.sims.tasks import instruction
    from worldloop.utils.io import atomic_write_json, atomic_write_text

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results.json", results)
    atomic_write_text(out / "results.md", results_table(results))
    if videos:
        from worldloop.data.video import write_mp4
        from worldloop.utils.draw import caption

        for (task, episode), succeeded, clip in videos.values():
            write_mp4(out / "videos" / f"{task}_{episode:03d}.mp4", caption(clip, instruction(task), succeeded), fps)


def results_table(results: dict[str, Any]) -> str:
    """A Markdown table: one row per task and the overall rate, each with its standard error."""
    mode = "expert" if results["policy"] == EXPERT else ("greedy" if results["greedy"] else f"temperature {results['temperature']}")
    through = f", observing the simulator through {results['observed_through']}'s VAE" if results.get("observed_through") else ""
    lines = [
        f"# Evaluation of {results['policy']} ({mode}{through})",
        "",
        "| task | success_once | ± stderr | episodes | mean length |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for task, row in results["per_task"].items():
        lines.append(f"| {task} | {row['success_once']:.3f} | {row['stderr']:.3f} | {row['episodes']} | {row['mean_episode_length']:.1f} |")
    lines.append(f"| **overall** | **{results['success_once']:.3f}** | {results['stderr']:.3f} | {results['episodes']} | {results['mean_episode_length']:.1f} |")
    return "\n".join(lines) + "\n"

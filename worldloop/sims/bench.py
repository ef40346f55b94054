"""``worldloop bench sim``: real-simulator steps/s with rendered frames.

For every image size and worker count it builds a :class:`MetaWorldVecEnv` over the configured
tasks (``envs_per_worker`` environments per worker), resets it, and times ``--steps`` random
action steps per environment, chunk by chunk. Episodes never end during the measurement (no
time limit, no end at success), so every timed step is simulated and rendered.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import time

import torch

from worldloop.sims.metaworld import MetaWorldVecEnv
from worldloop.utils.io import atomic_write_text


def measure(sim_config, num_envs: int, steps: int) -> dict[str, float]:
    """Start-up seconds, env steps/s and frames/s for ``steps`` steps of every env (random actions)."""
    K = sim_config.chunk_size
    chunks = max(1, -(-steps // K))
    sim_config = dataclasses.replace(sim_config, max_steps=chunks * K + K, success_hold_steps=10**9)
    start = time.perf_counter()
    env = MetaWorldVecEnv(sim_config, num_envs)
    try:
        num_tasks = len(env.task_names)
        env.reset([i % num_tasks for i in range(num_envs)], list(range(num_envs)))
        env.step(torch.zeros(num_envs, K, env.action_dim))  # warm up (first render, caches)
        startup = time.perf_counter() - start
        generator = torch.Generator().manual_seed(0)
        before = int(env.elapsed_steps.sum())
        start = time.perf_counter()
        frames = 0
        for _ in range(chunks):
            out = env.step(torch.rand(num_envs, K, env.action_dim, generator=generator) * 2 - 1)
            frames += out.frames.shape[0] * out.frames.shape[1]
        seconds = time.perf_counter() - start
        simulated = int(env.elapsed_steps.sum()) - before
    finally:
        env.close()
    return {"startup_s": startup, "steps_per_s": simulated / seconds, "frames_per_s": frames / seconds, "ms_per_chunk": 1000 * seconds / chunks}


def bench_sim(args, config) -> int:
    sim = config.sim
    worker_counts = args.workers or sorted({1, sim.num_workers})
    for size in args.sizes:
        if size not in (64, 128, 256):
            print(f"worldloop bench sim: --sizes {size} is not supported; allowed: 64, 128, 256")
            return 2
    header = f"{'size':>5} {'workers':>7} {'envs':>5} {'steps/s':>9} {'frames/s':>9} {'ms/chunk':>9} {'startup s':>9}"
    lines = [
        f"# worldloop bench sim: Meta-World, camera {sim.camera}, chunk {sim.chunk_size}, "
        f"{args.steps} random-action steps per env; MUJOCO_GL={os.environ.get('MUJOCO_GL', '')}, {os.cpu_count()} CPUs, {platform.node()}",
        header,
    ]
    print("\n".join(lines), flush=True)
    for size in args.sizes:
        for workers in worker_counts:
            sim_config = dataclasses.replace(sim, image_size=size, num_workers=workers)
            num_envs = workers * args.envs_per_worker
            result = measure(sim_config, num_envs, args.steps)
            line = (
                f"{size:>5} {workers:>7} {num_envs:>5} {result['steps_per_s']:>9.1f} {result['frames_per_s']:>9.1f} "
                f"{result['ms_per_chunk']:>9.1f} {result['startup_s']:>9.1f}"
            )
            print(line, flush=True)
            lines.append(line)
    if args.out:
        atomic_write_text(args.out, "\n".join(lines) + "\n")
    return 0

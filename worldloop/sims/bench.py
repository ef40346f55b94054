"""``worldloop bench sim``: real-simulator steps/s with rendered frames, and the memory each worker holds.

For every image size and worker count it builds the configured simulator (``sim.backend``: Meta-World, LIBERO or a
registered one) over the configured tasks (``envs_per_worker`` environments per worker), resets it, and times
``--steps`` random action steps per environment, chunk by chunk. Episodes never end during the measurement (no
time limit, no end at success), so every timed step is simulated and rendered. After the timed steps, each worker
process's resident memory (Linux ``VmRSS``) is read: their mean is the memory per worker (with one worker the
simulator runs in this process, whose memory holds everything else too: '-').
"""

from __future__ import annotations

import dataclasses
import os
import platform
import time

import torch

from worldloop.sims import make_env
from worldloop.utils.io import atomic_write_text


def resident_mib(pid: int) -> float | None:
    """A process's resident memory in MiB (Linux /proc); None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def measure(sim_config, num_envs: int, steps: int) -> dict[str, float]:
    """Start-up seconds, env steps/s, frames/s and the workers' mean resident MiB (None in-process) for ``steps``
    steps of every env (random actions)."""
    K = sim_config.chunk_size
    chunks = max(1, -(-steps // K))
    sim_config = dataclasses.replace(sim_config, max_steps=chunks * K + K, success_hold_steps=10**9)
    start = time.perf_counter()
    env = make_env(sim_config, num_envs)
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
        memory = [resident_mib(pid) for pid in getattr(env, "worker_pids", lambda: [])()]
    finally:
        env.close()
    memory = [m for m in memory if m is not None]
    return {"startup_s": startup, "steps_per_s": simulated / seconds, "frames_per_s": frames / seconds, "ms_per_chunk": 1000 * seconds / chunks,
            "worker_mib": sum(memory) / len(memory) if memory else None}  # fmt: skip


def bench_sim(args, config) -> int:
    sim = config.sim
    worker_counts = args.workers or sorted({1, sim.num_workers})
    for size in args.sizes:
        if size not in (64, 128, 256):
            print(f"worldloop bench sim: --sizes {size} is not supported; allowed: 64, 128, 256")
            return 2
    header = f"{'size':>5} {'workers':>7} {'envs':>5} {'steps/s':>9} {'frames/s':>9} {'ms/chunk':>9} {'startup s':>9} {'MiB/worker':>10}"
    lines = [
        f"# worldloop bench sim: {sim.backend}, camera {sim.camera}, chunk {sim.chunk_size}, "
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
                f"{result['ms_per_chunk']:>9.1f} {result['startup_s']:>9.1f} "
                f"{'-' if result['worker_mib'] is None else format(result['worker_mib'], '.0f'):>10}"
            )
            print(line, flush=True)
            lines.append(line)
    if args.out:
        atomic_write_text(args.out, "\n".join(lines) + "\n")
    return 0

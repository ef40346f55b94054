"""``worldloop bench data``: dataset write and read speed with synthetic episodes (no simulator)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np


def bench_data(args, config) -> int:
    """Write 8 episodes of ``--steps`` frames at each of ``--sizes``, then read them cold (decode
    into the cache) and warm (from the cache); print episodes/s and frames/s."""
    from worldloop.data.configuration import FPS
    from worldloop.data.dataset import TrajectoryDataset
    from worldloop.data.writer import DatasetWriter

    num_episodes, length = 8, max(int(args.steps), 2)
    rows = [f"{'size':>5} {'write ep/s':>11} {'cold read frames/s':>19} {'warm read frames/s':>19} {'MB/episode':>11}"]
    rng = np.random.default_rng(0)
    for size in args.sizes:
        y, x = np.mgrid[0:size, 0:size] / size
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            with DatasetWriter(f"{folder}/ds", fps=FPS, image_size=size, action_dim=4, state_dim=39) as writer:
                for e in range(num_episodes):
                    t = np.arange(length)[:, None, None] / 10
                    frames = (np.stack([np.sin(3 * x + t + e), np.cos(3 * y - t), np.sin(2 * (x + y) + t)], -1) * 120 + 128).astype(np.uint8)
                    writer.add_episode(frames, rng.uniform(-1, 1, (length, 4)), np.zeros(length, bool), "bench", state=rng.standard_normal((length, 39)))
            write = num_episodes / (time.perf_counter() - start)
            speeds = []
            for _ in range(2):
                ds = TrajectoryDataset(f"{folder}/ds")
                start = time.perf_counter()
                frames_read = sum(len(ep) for ep in ds.episodes())
                speeds.append(frames_read / (time.perf_counter() - start))

            megabytes = sum(p.stat().st_size for p in Path(folder, "ds").rglob("*") if p.is_file() and ".cache" not in p.parts) / 1e6
            rows.append(f"{size:>5} {write:>11.1f} {speeds[0]:>19.0f} {speeds[1]:>19.0f} {megabytes / num_episodes:>11.2f}")
    table = "\n".join(rows)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    return 0

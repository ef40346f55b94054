"""Wall-clock timing of device work for the `bench` targets."""

from __future__ import annotations

import time
from typing import Any, Callable

import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work (a no-op on CPU): device work is asynchronous."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_call(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int = 1) -> float:
    """Mean seconds per call of ``fn`` after ``warmup`` untimed calls (compilation, caches, allocator)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / repeats

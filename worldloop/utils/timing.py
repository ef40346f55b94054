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


def gpu_busy_seconds(fn: Callable[[], Any], device: torch.device) -> tuple[float, float | None]:
    """(wall seconds of ``fn``, seconds in which at least one GPU kernel ran), from torch.profiler's kernel
    intervals (their union, so overlapping streams count once); None on a CPU. Profiling slows launch-bound
    code: use the share busy / wall, not the wall, as the measurement."""
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start, None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        wall = time.perf_counter() - start
    kernels = [(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return wall, union_length(kernels) / 1e6  # the profiler's times are microseconds


def union_length(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals: overlapping time counts once."""
    total, reach = 0.0, float("-inf")
    for begin, end in sorted(intervals):
        if end > reach:
            total += end - max(begin, reach)
            reach = end
    return total

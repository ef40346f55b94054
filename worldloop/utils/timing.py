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
    kernels = kernel_intervals(prof)
    return wall, union_length(kernels) / 1e6  # the profiler's times are microseconds


def profile_calls(fn: Callable[[], Any], device: torch.device, calls: int = 3, top: int = 12, top_copies: int = 6) -> dict[str, Any]:
    """Where ``calls`` calls of ``fn`` (after one untimed) spend their time, from torch.profiler: the profiled wall
    seconds per call; on a GPU, the share of it in which a kernel ran (``busy``: the rest is the GPU waiting for the
    CPU) and the kernels launched per call; and the ``top`` operators by their own time on the device (on a CPU, by
    their own CPU time), each with its calls and milliseconds per call of ``fn`` and its share of that own time; and
    ``copies``: the ``top_copies`` groups of ``aten::copy_`` calls (dtype casts and copies) by their input shapes, the
    same way, so that a reader tells a weight's cast from an activation's."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize(device)
        wall = (time.perf_counter() - start) / calls
    on_gpu = device.type == "cuda"
    kernels = kernel_intervals(prof)

    def own_us(event) -> float:  # microseconds of the operator's own work, summed over its calls
        return float(getattr(event, "self_device_time_total", 0.0)) if on_gpu else float(event.self_cpu_time_total)

    averages = [e for e in prof.key_averages() if own_us(e) > 0]
    total = sum(own_us(e) for e in averages) or 1.0
    timed = lambda e: {"calls": e.count / calls, "ms": own_us(e) / 1e3 / calls, "share": own_us(e) / total}  # noqa: E731
    operators = [{"name": e.key} | timed(e) for e in sorted(averages, key=own_us, reverse=True)[:top]]
    copies = sorted((e for e in prof.key_averages(group_by_input_shape=True) if e.key == "aten::copy_" and own_us(e) > 0), key=own_us, reverse=True)
    copies = [{"shapes": [list(shape) for shape in e.input_shapes if shape]} | timed(e) for e in copies[:top_copies]]
    return {"wall_ms": 1e3 * wall, "busy": union_length(kernels) / 1e6 / calls / wall if on_gpu else None,
            "kernels_per_call": len(kernels) / calls if on_gpu else None, "operators": operators, "copies": copies}  # fmt: skip


def format_profile(profile: dict[str, Any]) -> str:
    """:func:`profile_calls`'s result as a few lines: the wall, the GPU's busy share and launches, the top operators."""
    busy = "" if profile["busy"] is None else f", GPU busy {100 * profile['busy']:.0f} %, {profile['kernels_per_call']:.0f} kernels"
    lines = [f"profiled: {profile['wall_ms']:.1f} ms per call{busy}", f"  {'operator':<48} {'calls':>6} {'ms':>8} {'share':>6}"]
    lines += [f"  {o['name'][:48]:<48} {o['calls']:6.0f} {o['ms']:8.2f} {100 * o['share']:5.1f}%" for o in profile["operators"]]
    if profile.get("copies"):
        lines += [f"  {'aten::copy_ by input shapes':<48} {'calls':>6} {'ms':>8} {'share':>6}"]
        lines += [f"  {' <- '.join(map(str, c['shapes']))[:48]:<48} {c['calls']:6.0f} {c['ms']:8.2f} {100 * c['share']:5.1f}%" for c in profile["copies"]]
    return "\n".join(lines)


def kernel_intervals(prof) -> list[tuple[float, float]]:
    """(start, end) in microseconds of every GPU kernel a torch.profiler run recorded."""
    return [(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def union_length(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals: overlapping time counts once."""
    total, reach = 0.0, float("-inf")
    for begin, end in sorted(intervals):
        if end > reach:
            total += end - max(begin, reach)
            reach = end
    return total

"""``worldloop bench wm-train`` and ``bench vae-train``: world-model and VAE training speed, with random
weights and random data.

It runs ``train_world_model`` itself, the loop ``train-wm`` runs, on ready-made random clips of the
preset's shape (``world_model.size``, ``world_model.batch_size``, latents of ``sim.image_size`` frames
under the preset's VAE). Each setting trains twice, ``--steps`` steps and 1/6 of that; the wall-time
difference over the step difference is the time per optimizer step, free of the fixed costs around
the loop (building the model, the final samples, the save). On a GPU the same pair runs once more under
torch.profiler: the kernel time's difference over the wall time's difference is the share of the step in which the
GPU was busy (``gpu_busy``; low: the host, launching kernels, is the limit), and MFU is the model's FLOPs per step
over the step time and the device's dense bf16 peak. Settings: no self-forcing, and
self-forcing at ``world_model.self_forcing`` (0.5 when the preset has none) from the first step: that
share of the clips gets its memory latent from a no-grad sample of the clip one chunk earlier, in
``sampling_steps`` Euler steps. Reported: steps/s, clips/s and the
DiT's matmul TFLOP/s (3 forwards per trained clip, plus the self-forced samples' forwards).

Under ``torchrun --nproc-per-node N``, each setting is measured twice: rank 0 alone at the preset's batch (the
one-process baseline), then all N ranks data-parallel with the preset's batch on each (a global batch N times as
large). Reported beside it: clips/s per process and the scaling efficiency, (clips/s of N processes) / (N x clips/s
of one); 1.0 is linear.

``bench vae-train`` runs ``train_vae`` the same way (``--steps`` and 1/6 of that, the difference timed) on
random frames of ``sim.image_size``; reported: steps/s, clips/s, the step's FLOPs per second (counted by torch's
FlopCounterMode), MFU and the GPU's busy share. (Channels-last 3D convolutions were measured too, on 2026-12-02 and
2026-12-04: no faster at the preset's batch; docs/benchmarks.md.)
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch

from worldloop.config import Config
from worldloop.utils import distributed
from worldloop.utils.timing import seconds_per_call

CLIPS = 256  # random clips to draw batches from; their content does not change the speed


def random_clips(channels: int, side: int, action_dim: int = 4, count: int = CLIPS) -> dict[str, torch.Tensor]:
    """Latent clips (count, C, 4, side, side), raw actions (count, 13, A) and each clip's predecessor
    (the one before it; -1 for the first), the layout ``train_world_model`` takes."""
    generator = torch.Generator().manual_seed(0)
    return {
        "latents": torch.randn(count, channels, 4, side, side, generator=generator),
        "actions": torch.rand(count, 13, action_dim, generator=generator) * 2 - 1,
        "previous": torch.arange(count) - 1,
    }


def time_training(config: Config, clips: dict[str, torch.Tensor], vae, steps: int, self_forcing: float, device: torch.device) -> float:
    """Wall seconds of one ``train_world_model`` run of ``steps`` steps (build, loop, samples and save)."""
    return seconds_per_call(lambda: train_wm(config, clips, vae, steps, self_forcing, device), device, repeats=1, warmup=0)


def train_wm(config: Config, clips: dict[str, torch.Tensor], vae, steps: int, self_forcing: float, device: torch.device) -> None:
    """One ``train_world_model`` run of ``steps`` steps on ``clips``, into a temporary folder."""
    from worldloop.worldmodel.train_dit import train_world_model

    never = 10**9  # no periodic logging, samples or checkpoints inside the timed loop
    wm = dataclasses.replace(config.world_model, steps=steps, self_forcing=self_forcing, time_limit_s=0.0, checkpoint_every=never)
    with tempfile.TemporaryDirectory() as out:
        train_world_model(wm, [], vae, out, device, seed=config.seed, clips=clips, log_every=never, self_forcing_after=0.0)


def seconds_per_step(run_seconds: Callable[[int], float], steps: int) -> float:
    """Seconds per optimizer step of a training run timed at ``steps`` and 1/6 of that: the difference over the
    step difference, free of the fixed costs around the loop."""
    short = max(1, steps // 6)
    return max(run_seconds(steps) - run_seconds(short), 1e-9) / (steps - short)


def busy_share(run: Callable[[int], None], steps: int, device: torch.device) -> float | None:
    """The share of a training step in which the GPU runs a kernel: the runs of :func:`seconds_per_step`, profiled,
    kernel seconds over wall seconds, each the difference of the two runs; None on a CPU."""
    from worldloop.utils.timing import gpu_busy_seconds

    if device.type != "cuda":
        return None
    short = max(1, steps // 6)
    (wall_long, busy_long), (wall_short, busy_short) = (gpu_busy_seconds(lambda: run(n), device) for n in (steps, short))
    return min(1.0, max(0.0, (busy_long - busy_short) / max(wall_long - wall_short, 1e-9)))


def write_report(out: str | None, text: str, payload: Any) -> None:
    """Print a bench's table; with ``out``, also write it there and ``payload`` as JSON beside it."""
    from worldloop.utils.io import atomic_write_json, atomic_write_text

    print(text)
    if out:
        atomic_write_text(Path(out), text + "\n")
        atomic_write_json(Path(out).with_suffix(".json"), payload)


def measure(config: Config, clips: dict[str, torch.Tensor], vae, steps: int, self_forcing: float, device: torch.device) -> dict:
    from worldloop.worldmodel.bench import peak_flops
    from worldloop.worldmodel.modeling import dit_flops_per_forward

    per_step = seconds_per_step(lambda n: time_training(config, clips, vae, n, self_forcing, device), steps)
    busy = busy_share(lambda n: train_wm(config, clips, vae, n, self_forcing, device), steps, device)
    peak = peak_flops(device)
    wm = config.world_model
    side = clips["latents"].shape[-1]
    tokens = 4 * (side // 2) ** 2
    flops = 3 * dit_flops_per_forward(wm.size, wm.batch_size, tokens)
    sample_steps = wm.sampling_steps
    flops += sample_steps * dit_flops_per_forward(wm.size, 1, tokens) * self_forcing * wm.batch_size  # the self-forced clips
    return {
        "size": wm.size, "batch": wm.batch_size, "tokens": tokens, "self_forcing": self_forcing, "self_forcing_steps": sample_steps,
        "step_ms": 1e3 * per_step, "steps_per_s": 1 / per_step, "clips_per_s": wm.batch_size / per_step,
        "dit_tflops": flops / per_step / 1e12, "mfu": flops / per_step / peak if peak else None, "gpu_busy": busy,
        "compiled": bool(wm.compile and device.type == "cuda"),
    }  # fmt: skip


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def format_table(rows: list[dict]) -> str:
    header = (f"{'preset':<8} {'batch':>5} {'tokens':>6} {'compiled':>8} {'self-forcing':>12} {'step ms':>8} {'steps/s':>8} {'clips/s':>8} "
              f"{'DiT TF/s':>8} {'MFU':>5} {'GPU busy':>8}")  # fmt: skip
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['size']:<8} {r['batch']:>5} {r['tokens']:>6} {'yes' if r['compiled'] else 'no':>8} {r['self_forcing']:>12.2f} "
                     f"{r['step_ms']:8.1f} {r['steps_per_s']:8.2f} {r['clips_per_s']:8.1f} {r['dit_tflops']:8.2f} {percent(r['mfu']):>5} "
                     f"{percent(r['gpu_busy']):>8}")  # fmt: skip
    return "\n".join(lines)


def bench_wm_train(args: argparse.Namespace, config: Config) -> int:
    from worldloop.utils.device import resolve_device
    from worldloop.worldmodel import vae as vae_lib

    if args.steps < 2:
        raise ValueError(f"bench wm-train needs --steps >= 2 (it times the difference of two runs), got {args.steps}")
    device = resolve_device(config.device)
    torch.manual_seed(config.seed)
    vae = vae_lib.build_vae(config.vae)
    side = config.sim.image_size // vae_lib.spatial_factor(vae)
    clips = random_clips(int(vae.config.z_dim), side)
    if distributed.active():
        return bench_wm_train_scaling(args, config, clips, vae, device)
    time_training(config, clips, vae, 2, 1.0, device)  # warm-up, both paths: CUDA context, kernels, cuDNN's choices
    rows = []
    for self_forcing in (0.0, config.world_model.self_forcing or 0.5):
        rows.append(measure(config, clips, vae, args.steps, self_forcing, device))
        print(format_table(rows[-1:]).splitlines()[-1], flush=True)
    write_report(args.out, wm_title(config, device) + "\n" + format_table(rows), rows)
    return 0


def wm_title(config: Config, device: torch.device, processes: str = "") -> str:
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return (f"worldloop bench wm-train on {where}{processes} ({config.sim.image_size}px frames, "
            f"{config.world_model.sampling_steps} sampler steps per self-forced clip)")  # fmt: skip


def bench_wm_train_scaling(args: argparse.Namespace, config: Config, clips: dict[str, torch.Tensor], vae, device: torch.device) -> int:
    """Under torchrun: each setting by rank 0 alone, then by every rank with the preset's batch each; the scaling efficiency."""
    ranks = distributed.world_size()
    scaled = dataclasses.replace(config, world_model=dataclasses.replace(config.world_model, batch_size=config.world_model.batch_size * ranks))
    with distributed.alone() as working:
        if working:
            time_training(config, clips, vae, 2, 1.0, device)  # warm-up
    time_training(scaled, clips, vae, 2, 1.0, device)
    rows = []
    for self_forcing in (0.0, config.world_model.self_forcing or 0.5):
        with distributed.alone() as working:
            one = measure(config, clips, vae, args.steps, self_forcing, device) if working else None
        many = measure(scaled, clips, vae, args.steps, self_forcing, device)
        if distributed.is_main():
            rows += [one | {"processes": 1, "clips_per_s_per_process": one["clips_per_s"], "scaling_efficiency": 1.0},
                     many | {"processes": ranks, "clips_per_s_per_process": many["clips_per_s"] / ranks,
                             "scaling_efficiency": many["clips_per_s"] / (ranks * one["clips_per_s"])}]  # fmt: skip
            print("\n".join(format_scaling_table(rows[-2:]).splitlines()[-2:]), flush=True)
    if distributed.is_main():
        write_report(args.out, wm_title(config, device, f" x {ranks} processes") + "\n" + format_scaling_table(rows), rows)
    return 0


def format_scaling_table(rows: list[dict]) -> str:
    header = f"{'processes':>9} {'global batch':>12} {'self-forcing':>12} {'step ms':>8} {'clips/s':>8} {'clips/s per process':>19} {'scaling efficiency':>18}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['processes']:>9} {r['batch']:>12} {r['self_forcing']:>12.2f} {r['step_ms']:8.1f} {r['clips_per_s']:8.1f} "
                     f"{r['clips_per_s_per_process']:19.1f} {percent(r['scaling_efficiency']):>18}")  # fmt: skip
    return "\n".join(lines)


# ============================================================================================ VAE


def random_episodes(image_size: int, count: int = 8, length: int = 40) -> list[SimpleNamespace]:
    """Episodes of random uint8 frames (length, H, W, 3): what ``train_vae`` reads."""
    generator = torch.Generator().manual_seed(0)
    return [
        SimpleNamespace(frames=torch.randint(0, 256, (length, image_size, image_size, 3), generator=generator, dtype=torch.uint8),
                        actions=torch.zeros(length, 4))
        for _ in range(count)
    ]  # fmt: skip


def time_vae_training(config: Config, episodes: list, steps: int, device: torch.device, compiled: bool = False) -> float:
    """Wall seconds of one ``train_vae`` run of ``steps`` steps (build, loop, statistics, metrics and save)."""
    return seconds_per_call(lambda: train_vae_run(config, episodes, steps, device, compiled), device, repeats=1, warmup=0)


def train_vae_run(config: Config, episodes: list, steps: int, device: torch.device, compiled: bool = False) -> None:
    """One ``train_vae`` run of ``steps`` steps on ``episodes``, into a temporary folder; ``compiled``: its forward
    compiled (after a compiled warm-up run, the difference of two runs leaves compilation out, whether a run compiles
    again or reuses what the last one compiled)."""
    from worldloop.worldmodel.train_vae import train_vae

    never = 10**9
    vae = dataclasses.replace(config.vae, steps=steps, time_limit_s=0.0, init=None, checkpoint_every=never)
    with tempfile.TemporaryDirectory() as out:
        train_vae(vae, episodes, episodes[:1], out, device, seed=config.seed, log_every=never, compile_forward=compiled)


def vae_step_flops(config: Config, device: torch.device) -> float:
    """FLOPs of one VAE training step (encode, decode, backward) at the bench's shapes, counted by torch's FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    from worldloop.worldmodel import vae as vae_lib
    from worldloop.worldmodel.train_vae import VAE_CLIP_FRAMES

    vae = vae_lib.build_vae(config.vae).to(device)
    frames = torch.randint(0, 256, (config.vae.batch_size, VAE_CLIP_FRAMES, config.sim.image_size, config.sim.image_size, 3),
                           dtype=torch.uint8, device=device)  # fmt: skip
    with FlopCounterMode(display=False) as counter:
        pixels = vae_lib.frames_to_pixels(frames)
        (vae.decode(vae.encode(pixels).latent_dist.sample()).sample - pixels).abs().mean().backward()
    return float(counter.get_total_flops())


def measure_vae(config: Config, episodes: list, steps: int, device: torch.device, flops: float, compiled: bool = False) -> dict:
    from worldloop.worldmodel.bench import peak_flops
    from worldloop.worldmodel.train_vae import VAE_CLIP_FRAMES

    per_step = seconds_per_step(lambda n: time_vae_training(config, episodes, n, device, compiled), steps)
    busy = busy_share(lambda n: train_vae_run(config, episodes, n, device, compiled), steps, device)
    peak = peak_flops(device)
    batch = config.vae.batch_size
    return {"size": config.vae.size, "batch": batch, "frames": VAE_CLIP_FRAMES, "image_size": config.sim.image_size, "compiled": compiled,
            "spatial_downsamples": config.vae.spatial_downsamples, "step_ms": 1e3 * per_step, "steps_per_s": 1 / per_step, "clips_per_s": batch / per_step,
            "tflops": flops / per_step / 1e12, "mfu": flops / per_step / peak if peak else None, "gpu_busy": busy}  # fmt: skip


def format_vae_table(rows: list[dict]) -> str:
    header = (f"{'preset':<8} {'batch':>5} {'frames':>6} {'pixels':>6} {'halvings':>8} {'compiled':>8} {'step ms':>8} {'steps/s':>8} {'clips/s':>8} "
              f"{'TF/s':>6} {'MFU':>5} {'GPU busy':>8}")  # fmt: skip
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['size']:<8} {r['batch']:>5} {r['frames']:>6} {r['image_size']:>6} {r['spatial_downsamples']:>8} "
                     f"{'yes' if r['compiled'] else 'no':>8} {r['step_ms']:8.1f} "
                     f"{r['steps_per_s']:8.2f} {r['clips_per_s']:8.1f} {r['tflops']:6.1f} {percent(r['mfu']):>5} {percent(r['gpu_busy']):>8}")  # fmt: skip
    return "\n".join(lines)


def bench_vae_train(args: argparse.Namespace, config: Config) -> int:
    """Time ``train_vae`` at the preset's shapes; on a GPU, eagerly and with its forward compiled."""
    from worldloop.utils.device import resolve_device
    from worldloop.worldmodel.train_vae import VAE_CLIP_FRAMES

    if args.steps < 2:
        raise ValueError(f"bench vae-train needs --steps >= 2 (it times the difference of two runs), got {args.steps}")
    device = resolve_device(config.device)
    episodes = random_episodes(config.sim.image_size, length=max(40, VAE_CLIP_FRAMES))
    flops = vae_step_flops(config, device)
    rows = []
    for compiled in (False, True) if device.type == "cuda" else (False,):  # eager against compiled, on a GPU
        time_vae_training(config, episodes, 2, device, compiled)  # warm-up: CUDA context, cuDNN's choices, compilation
        rows.append(measure_vae(config, episodes, args.steps, device, flops, compiled))
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    title = f"worldloop bench vae-train on {where} ({config.sim.image_size}px frames)"
    write_report(args.out, f"{title}\n{format_vae_table(rows)}", {"rows": rows})
    return 0

"""``worldloop bench wm-train`` and ``bench vae-train``: world-model and VAE training speed, with random
weights and random data.

It runs ``train_world_model`` itself, the loop ``train-wm`` runs, on ready-made random clips of the
preset's shape (``world_model.size``, ``world_model.batch_size``, latents of ``sim.image_size`` frames
under the preset's VAE). Each setting trains twice, ``--steps`` steps and 1/6 of that; the wall-time
difference over the step difference is the time per optimizer step, free of the fixed costs around
the loop (building the model, the final samples, the save). Settings: no self-forcing, and
self-forcing at ``world_model.self_forcing`` (0.5 when the preset has none) from the first step: that
share of the clips gets its memory latent from no-grad samples of the clips 1..``self_forcing_chunks``
chunks earlier, in ``self_forcing_steps`` Euler steps each (``sampling_steps`` when 0). Reported: steps/s, clips/s and the
DiT's matmul TFLOP/s (3 forwards per trained clip, plus the self-forced samples' forwards).

``bench vae-train`` runs ``train_vae`` the same way (``--steps`` and 1/6 of that, the difference timed) on
random frames of ``sim.image_size``, with the VAE's 3D convolutions in the default (NCDHW) and in the
channels-last (NDHWC) memory layout (``vae.channels_last``); reported: steps/s and clips/s of each, and which
is faster.
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
    from worldloop.worldmodel.train import train_world_model

    never = 10**9  # no periodic logging, samples or checkpoints inside the timed loop
    wm = dataclasses.replace(config.world_model, steps=steps, self_forcing=self_forcing, self_forcing_after=0.0, time_limit_s=0.0,
                             log_every=never, sample_every=never, checkpoint_every=never)  # fmt: skip
    with tempfile.TemporaryDirectory() as out:
        run = lambda: train_world_model(wm, [], vae, out, device, seed=config.seed, clips=clips)  # noqa: E731
        return seconds_per_call(run, device, repeats=1, warmup=0)


def seconds_per_step(run_seconds: Callable[[int], float], steps: int) -> float:
    """Seconds per optimizer step of a training run timed at ``steps`` and 1/6 of that: the difference over the
    step difference, free of the fixed costs around the loop."""
    short = max(1, steps // 6)
    return max(run_seconds(steps) - run_seconds(short), 1e-9) / (steps - short)


def write_report(out: str | None, text: str, payload: Any) -> None:
    """Print a bench's table; with ``out``, also write it there and ``payload`` as JSON beside it."""
    from worldloop.utils.io import atomic_write_json, atomic_write_text

    print(text)
    if out:
        atomic_write_text(Path(out), text + "\n")
        atomic_write_json(Path(out).with_suffix(".json"), payload)


def measure(config: Config, clips: dict[str, torch.Tensor], vae, steps: int, self_forcing: float, device: torch.device) -> dict:
    from worldloop.worldmodel.modeling import dit_flops_per_forward

    per_step = seconds_per_step(lambda n: time_training(config, clips, vae, n, self_forcing, device), steps)
    wm = config.world_model
    side = clips["latents"].shape[-1]
    tokens = 4 * (side // 2) ** 2
    flops = 3 * dit_flops_per_forward(wm.size, wm.batch_size, tokens)
    sample_steps = sampler_steps(wm)
    chunks = (1 + wm.self_forcing_chunks) / 2  # the mean depth drawn per self-forced clip (the random clips' chain is long)
    flops += sample_steps * chunks * dit_flops_per_forward(wm.size, 1, tokens) * self_forcing * wm.batch_size  # expected self-forced clips
    return {
        "size": wm.size, "batch": wm.batch_size, "tokens": tokens, "self_forcing": self_forcing, "self_forcing_steps": sample_steps,
        "self_forcing_chunks": wm.self_forcing_chunks,
        "step_ms": 1e3 * per_step, "steps_per_s": 1 / per_step, "clips_per_s": wm.batch_size / per_step,
        "dit_tflops": flops / per_step / 1e12,
    }  # fmt: skip


def sampler_steps(wm) -> int:
    """Euler steps (no-grad DiT forwards) of one self-forced sample."""
    return wm.self_forcing_steps or wm.sampling_steps


def format_table(rows: list[dict]) -> str:
    header = f"{'preset':<8} {'batch':>5} {'tokens':>6} {'self-forcing':>12} {'step ms':>8} {'steps/s':>8} {'clips/s':>8} {'DiT TF/s':>8}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['size']:<8} {r['batch']:>5} {r['tokens']:>6} {r['self_forcing']:>12.2f} {r['step_ms']:8.1f} "
                     f"{r['steps_per_s']:8.2f} {r['clips_per_s']:8.1f} {r['dit_tflops']:8.2f}")  # fmt: skip
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
    time_training(config, clips, vae, 2, 1.0, device)  # warm-up, both paths: CUDA context, kernels, cuDNN's choices
    rows = []
    for self_forcing in (0.0, config.world_model.self_forcing or 0.5):
        rows.append(measure(config, clips, vae, args.steps, self_forcing, device))
        print(format_table(rows[-1:]).splitlines()[-1], flush=True)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    steps = sampler_steps(config.world_model)
    title = f"worldloop bench wm-train on {where} ({config.sim.image_size}px frames, {steps} sampler steps per self-forced clip)"
    write_report(args.out, title + "\n" + format_table(rows), rows)
    return 0


# ============================================================================================ VAE


def random_episodes(image_size: int, count: int = 8, length: int = 40) -> list[SimpleNamespace]:
    """Episodes of random uint8 frames (length, H, W, 3): what ``train_vae`` reads."""
    generator = torch.Generator().manual_seed(0)
    return [
        SimpleNamespace(frames=torch.randint(0, 256, (length, image_size, image_size, 3), generator=generator, dtype=torch.uint8),
                        actions=torch.zeros(length, 4))
        for _ in range(count)
    ]  # fmt: skip


def time_vae_training(config: Config, episodes: list, steps: int, channels_last: bool, device: torch.device) -> float:
    """Wall seconds of one ``train_vae`` run of ``steps`` steps (build, loop, statistics, metrics and save)."""
    from worldloop.worldmodel.train import train_vae

    never = 10**9
    vae = dataclasses.replace(config.vae, steps=steps, channels_last=channels_last, time_limit_s=0.0, init=None, pretrained=None,
                              log_every=never, checkpoint_every=never)  # fmt: skip
    with tempfile.TemporaryDirectory() as out:
        run = lambda: train_vae(vae, episodes, episodes[:1], out, device, seed=config.seed)  # noqa: E731
        return seconds_per_call(run, device, repeats=1, warmup=0)


def measure_vae(config: Config, episodes: list, steps: int, channels_last: bool, device: torch.device) -> dict:
    per_step = seconds_per_step(lambda n: time_vae_training(config, episodes, n, channels_last, device), steps)
    layout = "channels_last" if channels_last else "contiguous"
    batch = config.vae.batch_size
    return {"size": config.vae.size, "batch": batch, "frames": config.vae.clip_frames, "image_size": config.sim.image_size,
            "layout": layout, "step_ms": 1e3 * per_step, "steps_per_s": 1 / per_step, "clips_per_s": batch / per_step}  # fmt: skip


def format_vae_table(rows: list[dict]) -> str:
    header = f"{'preset':<8} {'batch':>5} {'frames':>6} {'pixels':>6} {'layout':<14} {'step ms':>8} {'steps/s':>8} {'clips/s':>8}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['size']:<8} {r['batch']:>5} {r['frames']:>6} {r['image_size']:>6} {r['layout']:<14} {r['step_ms']:8.1f} "
                     f"{r['steps_per_s']:8.2f} {r['clips_per_s']:8.1f}")  # fmt: skip
    return "\n".join(lines)


def bench_vae_train(args: argparse.Namespace, config: Config) -> int:
    """Time ``train_vae`` with both memory layouts; the JSON next to ``--out`` names the faster (``faster``)."""
    from worldloop.utils.device import resolve_device

    if args.steps < 2:
        raise ValueError(f"bench vae-train needs --steps >= 2 (it times the difference of two runs), got {args.steps}")
    device = resolve_device(config.device)
    episodes = random_episodes(config.sim.image_size, length=max(40, config.vae.clip_frames))
    for channels_last in (False, True):  # warm-up: CUDA context, cuDNN's choices for both layouts
        time_vae_training(config, episodes, 2, channels_last, device)
    rows = []
    for channels_last in (False, True):
        rows.append(measure_vae(config, episodes, args.steps, channels_last, device))
        print(format_vae_table(rows[-1:]).splitlines()[-1], flush=True)
    faster = min(rows, key=lambda r: r["step_ms"])["layout"]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    title = f"worldloop bench vae-train on {where} ({config.sim.image_size}px frames, {config.vae.spatial_downsamples} spatial halvings)"
    write_report(args.out, f"{title}\n{format_vae_table(rows)}\nfaster: {faster}", {"rows": rows, "faster": faster})
    return 0

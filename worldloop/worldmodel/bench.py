"""``worldloop bench wm``: world-model rollout speed, end to end, with random weights.

For every size in ``--models`` (at its own resolution: tiny 64, small 128,
wan2.2-5b 256 with the Wan2.2 VAE) and batch size in ``--batch-sizes``: one
``WorldModel.step`` = the DiT sampler (``sampling_steps`` batched forwards) + decoding the new frames
(as ``world_model.decode`` says), timed after warm-up. Also reported: the DiT part alone, the decode of the new
latents with the cache vs decoding [context + new] from scratch, new frames/s and model FLOP
utilisation of the DiT (matmul FLOPs / time / the device's dense bf16 peak; the VAE's FLOPs are not
counted, so MFU of the whole step is a lower bound).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from worldloop.config import Config
from worldloop.utils.timing import format_profile, profile_calls, seconds_per_call

RESOLUTION = {"tiny": 64, "small": 128, "wan2.2-5b": 256}
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def build_model(size: str, config: Config, device: torch.device):
    from worldloop.worldmodel import vae as vae_lib
    from worldloop.worldmodel.configuration import VAEConfig
    from worldloop.worldmodel.rollout import WorldModel

    torch.manual_seed(0)
    with torch.device(device):  # initialise on the GPU: 5B random parameters take minutes on the CPU
        vae = vae_lib.build_vae(VAEConfig(size=size, decoder_base_dim=config.vae.decoder_base_dim))
        wm_config = dataclasses.replace(config.world_model, size=size)
        return WorldModel.build(wm_config, vae, RESOLUTION[size], 4, device=device).for_inference()


@torch.no_grad()
def measure(model, size: str, batch: int, device: torch.device, repeats: int = 3, profile: bool = False) -> dict:
    from worldloop.worldmodel import vae as vae_lib
    from worldloop.worldmodel.modeling import dit_flops_per_forward
    from worldloop.worldmodel.rollout import autocast, sample_future

    image = RESOLUTION[size]
    first = torch.randint(0, 256, (batch, image, image, 3), dtype=torch.uint8, device=device)
    actions = torch.randn(batch, model.chunk_size, 4, device=device)
    model.reset(first)
    step_s = seconds_per_call(lambda: model.step(actions), device, repeats)
    step_profile = profile_calls(lambda: model.step(actions), device, repeats) if profile else None
    context = model.context
    noise = torch.randn(context.shape[0], context.shape[1], 2, *context.shape[3:], device=device)
    all_actions = torch.randn(batch, 13, 4, device=device)
    dit_s = seconds_per_call(lambda: sample_future(model.dit, context, all_actions, noise, model.sigmas), device, repeats)
    new = noise

    model.decoder.reset()
    with autocast(device):
        model.decoder(context)  # prime outside the timing; time only the new latents
    primed = [c.clone() if isinstance(c, torch.Tensor) else c for c in model.decoder.cache]

    def decode_new():
        model.decoder.cache = [c.clone() if isinstance(c, torch.Tensor) else c for c in primed]
        with autocast(device):
            model.decoder(new)

    def decode_full():
        with autocast(device):
            vae_lib.decode(model.decoding_vae, torch.cat([context, new], dim=2))

    cached_s = seconds_per_call(decode_new, device, repeats)
    full_s = seconds_per_call(decode_full, device, repeats)
    tokens = 4 * (context.shape[3] // 2) * (context.shape[4] // 2)
    flops = model.sampling_steps * dit_flops_per_forward(size, batch, tokens)
    peak = peak_flops(device)
    frames = batch * model.chunk_size
    row = {
        "size": size, "image": image, "batch": batch, "tokens": tokens,
        "step_ms": 1e3 * step_s, "dit_ms": 1e3 * dit_s, "decode_cached_ms": 1e3 * cached_s, "decode_full_ms": 1e3 * full_s,
        "frames_per_s": frames / step_s, "dit_only_frames_per_s": frames / dit_s,
        "dit_tflops": flops / dit_s / 1e12, "dit_mfu": (flops / dit_s / peak) if peak else None,
        "step_mfu": (flops / step_s / peak) if peak else None,
    }  # fmt: skip
    if step_profile is not None:
        row["profile"] = step_profile
    return row


def format_table(rows: list[dict]) -> str:
    header = f"{'preset':<10} {'img':>4} {'batch':>5} {'step ms':>9} {'DiT ms':>9} {'dec new':>9} {'dec full':>9} {'frames/s':>9} {'DiT TF/s':>9} {'DiT MFU':>8} {'step MFU':>8}"
    lines = [header, "-" * len(header)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['size']:<10} {r['image']:>4} {r['batch']:>5}  {r['error']}")
            continue
        mfu = lambda v: f"{100 * v:7.1f}%" if v is not None else "     n/a"  # noqa: E731
        lines.append(
            f"{r['size']:<10} {r['image']:>4} {r['batch']:>5} {r['step_ms']:9.1f} {r['dit_ms']:9.1f} {r['decode_cached_ms']:9.1f} "
            f"{r['decode_full_ms']:9.1f} {r['frames_per_s']:9.1f} {r['dit_tflops']:9.2f} {mfu(r['dit_mfu'])} {mfu(r['step_mfu'])}"
        )
    return "\n".join(lines)


def bench_wm(args: argparse.Namespace, config: Config) -> int:
    from worldloop.utils.device import resolve_device
    from worldloop.utils.io import atomic_write_json, atomic_write_text

    device = resolve_device(config.device)
    if min(args.batch_sizes) < 1:
        raise ValueError(f"--batch-sizes must be positive, got {args.batch_sizes}")
    rows = []
    for size in args.models:
        model = build_model(size, config, device)
        for batch in args.batch_sizes:
            try:
                rows.append(measure(model, size, batch, device, profile=args.profile))
            except torch.cuda.OutOfMemoryError as error:  # report and continue with the next setting
                rows.append({"size": size, "image": RESOLUTION[size], "batch": batch, "error": f"out of memory: {str(error)[:80]}"})
                torch.cuda.empty_cache()
            print(format_table(rows[-1:]).splitlines()[-1], flush=True)
            if "profile" in rows[-1]:
                print(format_profile(rows[-1]["profile"]), flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    table = format_table(rows)
    profiles = [f"{r['size']} batch {r['batch']}: {format_profile(r['profile'])}" for r in rows if "profile" in r]
    table = "\n\n".join([table, *profiles])
    title = f"worldloop bench wm on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'} ({config.world_model.sampling_steps} sampler steps, 8 new frames per step)"
    print(title + "\n" + table)
    if args.out:
        atomic_write_text(Path(args.out), title + "\n" + table + "\n")
        atomic_write_json(Path(args.out).with_suffix(".json"), rows)
    return 0

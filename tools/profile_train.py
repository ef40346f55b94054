"""Where a training step's time goes, on a CUDA GPU: one VAE step and one DiT step at several shapes (random data).

    python tools/profile_train.py [vae|dit|all]      # OUT=folder also writes profile.json there

For each setting: milliseconds per step, the share of the step in which a GPU kernel runs (the union of the
kernel intervals over the wall time; low: the host launching kernels is the limit), kernels per step, and
torch.profiler's table of the most expensive operators. The settings are those docs/experiments/
2026-12-04-fidelity-recipe.md compared (the metaworld-gpu preset's shapes before and after that run).
`worldloop bench wm-train` / `bench vae-train` measure the preset's own settings, with MFU.
"""
import copy
import dataclasses
import json
import os
import sys
import time
import torch
import torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity

from worldloop.config import load_config
from worldloop.worldmodel import vae as vae_lib
from worldloop.worldmodel.flow_matching import flow_matching_loss
from worldloop.worldmodel.train_dit import self_forced_memory
from worldloop.worldmodel.training import ema_step
from worldloop.worldmodel.rollout import WorldModel, autocast

dev = torch.device("cuda")
results = {}


def busy_share(prof, wall):
    from worldloop.utils.timing import union_length

    kernels = [(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return union_length(kernels) / 1e6 / wall


def timed(name, step, n=10, warm=3, prof_steps=5):
    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t) / n * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(prof_steps):
            step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    share = busy_share(prof, wall)
    print(f"\n=== {name}: {ms:.1f} ms/step, GPU busy {share:.2f} (profiled wall {wall / prof_steps * 1e3:.1f} ms/step)", flush=True)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60)
    print(table, flush=True)
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) / prof_steps
    print(f"kernels per step: {kernels:.0f}", flush=True)
    results[name] = {"ms": ms, "busy": share, "kernels_per_step": kernels}
    return ms


def vae_step_fn(cfg, image, batch, channels_last=False, compile_=False):
    vcfg = dataclasses.replace(cfg.vae, spatial_downsamples=(3 if image >= 128 else 2) if "down" not in os.environ else int(os.environ["down"]))
    vae = vae_lib.build_vae(vcfg).to(dev).train()
    layout = torch.channels_last_3d if channels_last else torch.contiguous_format
    for module in vae.modules():  # the 3D convolutions' weights in the layout; activations follow the input's
        if isinstance(module, torch.nn.Conv3d):
            module.to(memory_format=layout)
    opt = torch.optim.AdamW(vae.parameters(), lr=1e-4, fused=True)
    frames_cpu = torch.randint(0, 256, (batch, 13, image, image, 3), dtype=torch.uint8)

    def step():
        frames = frames_cpu.to(dev)
        pixels = vae_lib.frames_to_pixels(frames).contiguous(memory_format=layout)
        with autocast(dev):
            post = vae.encode(pixels).latent_dist
            recon = vae.decode(post.sample()).sample
        recon = recon.float()
        loss = (recon - pixels).abs().mean() + (recon - pixels).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
    return step


def dit_step_fn(cfg, side, channels, batch, sf=0.0, fused=False, compile_=False):
    wm = dataclasses.replace(cfg.world_model, batch_size=batch)
    vae = vae_lib.build_vae(cfg.vae)
    model = WorldModel.build(wm, vae, side * vae_lib.spatial_factor(vae), 4, device=dev)
    dit = model.dit.train()
    ema = copy.deepcopy(dit).eval().requires_grad_(False)
    opt = torch.optim.AdamW(dit.parameters(), lr=1e-4, fused=fused) if fused else torch.optim.AdamW(dit.parameters(), lr=1e-4)
    g = torch.Generator(device=dev).manual_seed(0)
    M = 2048
    lat = torch.randn(M, channels, 4, side, side, device=dev)
    act = torch.randn(M, 13, 4, device=dev)
    prev = torch.arange(M, device=dev) - 1
    fwd = dit
    if compile_:
        fwd = torch.compile(dit)

    def step():
        idx = torch.randint(M, (batch,), generator=g, device=dev)
        x0 = lat[idx]
        a = act[idx]
        if sf:
            chosen = (torch.rand(batch, device=dev, generator=g) < sf) & (prev[idx] >= 0)
            x0 = x0.clone()
            x0[chosen, :, 1] = self_forced_memory(dit, lat, act, prev, idx[chosen], 1, model.sigmas, g)
        loss = flow_matching_loss(fwd, x0, a, wm, g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(dit.parameters(), 1.0)
        opt.step()
        ema_step(ema, dit, 0.995)
        float(loss.detach())
    return step


which = sys.argv[1:] or ["all"]
cfg = load_config("metaworld-gpu", ["device=cuda"])
print(torch.__version__, torch.cuda.get_device_name(), flush=True)
torch.backends.cudnn.benchmark = True
if "vae" in which or "all" in which:
    timed("vae 128px down3 b16", vae_step_fn(cfg, 128, 16))
    timed("vae 128px down3 b16 channels_last", vae_step_fn(cfg, 128, 16, channels_last=True), n=5)
    timed("vae 64px down2 b16", vae_step_fn(cfg, 64, 16), n=5)
    timed("vae 64px down2 b64", vae_step_fn(cfg, 64, 64), n=5)
if "dit" in which or "all" in which:
    timed("dit small 16x16 b64", dit_step_fn(cfg, 16, 32, 64))
    timed("dit small 16x16 b64 sf0.5", dit_step_fn(cfg, 16, 32, 64, sf=0.5))
    timed("dit small 16x16 b64 fusedadam", dit_step_fn(cfg, 16, 32, 64, fused=True))
    timed("dit small 16x16 b256 fusedadam", dit_step_fn(cfg, 16, 32, 256, fused=True))
    try:
        timed("dit small 16x16 b256 compiled", dit_step_fn(cfg, 16, 32, 256, fused=True, compile_=True), warm=4)
    except Exception as e:  # noqa
        print("compile failed:", repr(e)[:500], flush=True)
    timed("dit small 8x8 b256 fusedadam", dit_step_fn(cfg, 8, 32, 256, fused=True))
out = os.environ.get("OUT")
if out:
    json.dump(results, open(os.path.join(out, "profile.json"), "w"), indent=1)

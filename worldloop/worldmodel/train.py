"""Training the VAE and the world model, top to bottom.

``train_vae``: random clips of dataset frames -> AutoencoderKLWan, L1 + L2 reconstruction + KL; then per-channel latent statistics and
held-out PSNR/SSIM.

``train_world_model``: every clip of every training episode is encoded once (cached on disk next to
the run), then rectified flow: ``x_sigma = (1 - sigma) x0 + sigma eps``, the DiT predicts the
velocity ``eps - x0`` of the 2 future latents given the clean (or lightly noised, context-noise
augmentation) context latents and the 13 actions. EMA weights are what gets saved.

Under torchrun both are data-parallel (:mod:`worldloop.utils.distributed`): every rank draws the same global batch
and trains on its rows, the gradients are averaged, rank 0 writes checkpoints, TensorBoard and the model.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from worldloop.utils import distributed
from worldloop.utils.checkpoint import resume, save_checkpoint
from worldloop.utils.io import atomic_path, atomic_write_json, read_json
from worldloop.worldmodel import vae as vae_lib
from worldloop.worldmodel.clips import STATIC_FRACTION, episode_clips, predecessors
from worldloop.worldmodel.configuration import VAEConfig, WorldModelConfig
from worldloop.worldmodel.metrics import masked_psnr, moving_pixels, psnr, ssim
from worldloop.worldmodel.rollout import WorldModel, autocast, sample_future, sampler_sigmas, shift_sigmas


class EpisodeLike(Protocol):
    frames: Any  # (T, H, W, 3) uint8
    actions: Any  # (T, A) float32


def load_split(dataset_dir: str | Path, seed: int, held_out_fraction: float | None = None) -> tuple[list, list, Any]:
    """(train episodes, held-out episodes, dataset) of a LeRobot dataset folder, split per task (held_out_fraction
    None: worldloop.data.dataset.HELD_OUT_FRACTION, the split training keeps out)."""
    from worldloop.data.dataset import HELD_OUT_FRACTION, TrajectoryDataset, split_episodes

    held_out_fraction = HELD_OUT_FRACTION if held_out_fraction is None else held_out_fraction

    dataset = TrajectoryDataset(dataset_dir)
    train_idx, held_idx = split_episodes(dataset, held_out_fraction=held_out_fraction, seed=seed)
    return list(dataset.episodes(train_idx)), list(dataset.episodes(held_idx)), dataset


def _frames(episode: EpisodeLike) -> torch.Tensor:
    return torch.as_tensor(np.asarray(episode.frames))


def _actions(episode: EpisodeLike) -> np.ndarray:
    return np.asarray(episode.actions, dtype=np.float32)


class TrainingBudget:
    """How far training is through its budget: ``steps`` optimizer steps, or ``time_limit_s`` seconds
    of training (summed over resumed runs) when that is set, whichever runs out first. The learning
    rate follows it, so a time-limited run still warms up and decays: a schedule over ``steps`` alone
    left a 100-s H200 run of train-vae inside its warm-up (154 of 300 warm-up steps)."""

    def __init__(self, steps: int, time_limit_s: float = 0.0, seconds_done: float = 0.0):
        self.steps, self.time_limit_s = steps, time_limit_s
        self.seconds_done = seconds_done  # training seconds of earlier runs, from the checkpoint
        self.started = time.time()

    def seconds(self) -> float:
        """Training seconds so far; under torchrun with a time limit, rank 0's clock on every rank (one small
        all-reduce per call), so that the ranks stop at the same step and follow the same learning rate."""
        seconds = self.seconds_done + time.time() - self.started
        if self.time_limit_s and distributed.active():
            seconds = float(distributed.all_sum(seconds if distributed.is_main() else 0.0))
        return seconds

    def fraction(self, step: int) -> float:
        by_steps = step / max(1, self.steps)
        return max(by_steps, self.seconds() / self.time_limit_s) if self.time_limit_s else by_steps

    def out_of_time(self) -> bool:
        return bool(self.time_limit_s) and self.seconds() >= self.time_limit_s

    def lr_factor(self, step: int) -> float:
        """Linear warm-up over the first 5 % of the budget, then cosine decay to 10 % at its end."""
        fraction = self.fraction(step + 1)
        if fraction < 0.05:
            return fraction / 0.05
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (fraction - 0.05) / 0.95)))


def _progress(iterable: Iterable, **kwargs: Any):
    from tqdm.auto import tqdm

    return tqdm(iterable, **kwargs)


KL_WEIGHT = 1e-6
"""The VAE's KL term against its per-pixel L1 + L2 reconstruction loss."""
WEIGHT_DECAY = 0.01
"""The DiT's AdamW weight decay."""
GRAD_CLIP = 1.0
"""The DiT's gradient-norm clip."""
CONTEXT_NOISE = 0.3
"""Largest noise level sigma (0-1) put on the memory latent in training: the model learns to trust its context less, and
a rollout can tell it how noisy its memory is (world_model.memory_noise)."""
VAE_CLIP_FRAMES = 13
"""Frames per VAE training clip: 4 latent frames, the world model's layout (a VAE trained on 5-frame clips only ever saw
latent positions 0 and 1 and decoded positions 2+ poorly)."""
LOG_EVERY = 25
"""Steps between the training losses written to TensorBoard (reading a loss waits for the GPU)."""
SELF_FORCING_AFTER = 0.3
"""Share of the training budget (steps, or time under world_model.time_limit_s) before self-forcing starts
(world_model.self_forcing): until then the model's own predictions of a memory are noise."""

# ============================================================================================ VAE


def make_optimizer(parameters, lr: float, weight_decay: float, device: torch.device) -> torch.optim.AdamW:
    """AdamW (betas 0.9, 0.99), its update fused into one kernel per step on CUDA (the small DiT's step launched
    thousands of kernels, a third of them the optimizer's and the EMA's)."""
    return torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.99), fused=device.type == "cuda")


class FrameStore:
    """Every frame of ``episodes`` in one uint8 tensor ``(N, H, W, 3)`` on ``device``, so that a training step
    draws its clips with one gather on the device instead of a Python loop over episodes on the host.
    An episode shorter than a clip holds its last frame (as :func:`_random_clips` does)."""

    def __init__(self, episodes: Sequence[EpisodeLike], device: torch.device):
        frames = [_frames(episode) for episode in episodes]
        self.frames = torch.cat(frames).to(device)  # (N, H, W, 3)
        self.lengths = torch.tensor([len(f) for f in frames], device=device)
        self.starts = torch.cumsum(self.lengths, 0) - self.lengths

    def sample(self, count: int, length: int, generator: torch.Generator, rows: slice = slice(None)) -> torch.Tensor:
        """``count`` clips of ``length`` consecutive frames (count, length, H, W, 3), episodes drawn at random; only
        the clips of ``rows`` are gathered (a rank's share: the draws are the same whatever the share)."""
        device = self.frames.device
        episode = torch.randint(len(self.lengths), (count,), generator=generator, device=device)
        room = (self.lengths[episode] - length).clamp(min=0) + 1  # start positions that fit the clip
        offset = (torch.rand(count, generator=generator, device=device) * room).long()
        within = (offset[:, None] + torch.arange(length, device=device)).minimum(self.lengths[episode, None] - 1)
        return self.frames[(self.starts[episode, None] + within)[rows]]


def _random_clips(episodes: Sequence[EpisodeLike], count: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` clips of ``length`` consecutive frames (B, length, H, W, 3) uint8, episodes chosen at random."""
    clips = []
    for _ in range(count):
        episode = episodes[int(torch.randint(len(episodes), (1,), generator=generator))]
        frames = _frames(episode)
        if len(frames) < length:  # short episode: hold its last frame
            frames = torch.cat([frames, frames[-1:].expand(length - len(frames), -1, -1, -1)])
        start = int(torch.randint(len(frames) - length + 1, (1,), generator=generator))
        clips.append(frames[start : start + length])
    return torch.stack(clips)


def reconstruction_metrics(vae, episodes: Sequence[EpisodeLike], device: torch.device, clips: int = 64, length: int = 13, seed: int = 0) -> dict[str, float]:
    """Mean PSNR / SSIM of VAE reconstructions of held-out clips, and ``psnr_moving``: the PSNR over the pixels that move
    within a clip (``metrics.moving_pixels``: the arm and the objects it moves, ~10 % of a Meta-World frame), where a
    VAE blurs first and where copy-last-frame, which is exact elsewhere, is beaten or not."""
    generator = torch.Generator().manual_seed(seed)
    real = _random_clips(episodes, clips, length, generator).to(device)
    values_psnr, values_ssim, values_moving = [], [], []
    with torch.no_grad():
        for batch in real.split(16):
            with autocast(device):
                recon = vae_lib.decode(vae, vae_lib.encode(vae, batch))
            values_psnr.append(psnr(recon, batch).flatten())
            values_ssim.append(ssim(recon, batch).flatten())
            values_moving.append(masked_psnr(recon, batch, moving_pixels(batch)).flatten())
    moving = torch.cat(values_moving)
    moving = moving[moving.isfinite()]
    return {"psnr": float(torch.cat(values_psnr).mean()), "ssim": float(torch.cat(values_ssim).mean()),
            "psnr_moving": float(moving.mean()) if len(moving) else None, "clips": clips, "frames_per_clip": length}  # fmt: skip


def latent_statistics(vae, episodes: Sequence[EpisodeLike], device: torch.device, clips: int = 128, length: int = 9) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of the raw (unnormalised) 4-frame-group latents of training clips."""
    generator = torch.Generator().manual_seed(1)
    real = _random_clips(episodes, clips, length, generator).to(device)
    raws = []
    with torch.no_grad(), autocast(device):
        for batch in real.split(16):
            pixels = vae_lib.frames_to_pixels(batch)
            raws.append(vae.encode(pixels).latent_dist.mode().float()[:, :, 1:])
    # the 4-frame-group latents only: they are what the DiT predicts (the first, single-frame latent
    # of a clip has its own, often larger, spread)
    raw = torch.cat(raws).transpose(0, 1).flatten(1)  # (C, everything)
    return raw.mean(1).tolist(), raw.std(1).clamp_min(1e-4).tolist()


def vae_forward(vae, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The VAE's training forward: encode, sample the posterior, decode. Returns the posterior's mean, log-variance and
    variance, and the reconstruction: tensors only, so that it compiles into one graph (``train_vae(compile_forward=True)``)."""
    posterior = vae.encode(pixels).latent_dist
    return posterior.mean, posterior.logvar, posterior.var, vae.decode(posterior.sample()).sample


def train_vae(config: VAEConfig, train_episodes: Sequence[EpisodeLike], held_out: Sequence[EpisodeLike], out: str | Path, device: torch.device, seed: int = 0,
              log_every: int = LOG_EVERY, compile_forward: bool = False) -> dict[str, Any]:
    """Train an AutoencoderKLWan from scratch or from ``config.init`` (or load ``config.pretrained``), save it to ``out``
    in diffusers format with its latent statistics, and write ``out/metrics.json``. ``compile_forward``: torch.compile
    the training forward (:func:`vae_forward`; `bench vae-train` measures it against eager on a GPU)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not train_episodes:
        raise ValueError("train-vae: the dataset has no training episodes")
    main, mine = distributed.is_main(), distributed.rows(config.batch_size, "vae.batch_size")
    if config.pretrained:
        vae = vae_lib.load_vae(config.pretrained).to(device)
        steps_done, losses, first, train_seconds, curve = 0, [], 0, 0.0, []
    else:
        torch.manual_seed(seed)
        vae = (vae_lib.load_vae(config.init).train() if config.init else vae_lib.build_vae(config)).to(device)
        image_size = int(_frames(train_episodes[0]).shape[1])
        factor = vae_lib.spatial_factor(vae)
        if image_size % factor:
            raise ValueError(f"frames of {image_size}x{image_size} are not divisible by the VAE's {factor}x spatial compression")
        distributed.broadcast_parameters(vae)
        distributed.seed_per_rank(seed)  # the posterior's noise: each rank its own
        optimizer = make_optimizer(vae.parameters(), config.lr, 0.0, device)
        budget = TrainingBudget(config.steps, config.time_limit_s)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, budget.lr_factor)
        generator = torch.Generator(device=device).manual_seed(seed)
        store = FrameStore(train_episodes, device)
        stateful = {"optimizer": optimizer, "scheduler": scheduler, "generator": generator}
        step = 0
        resumed = resume(out, "train-vae", {"vae": vae}, stateful)
        if resumed is not None:
            _, step, extra = resumed
            budget.seconds_done = extra.get("seconds", 0.0)
        writer = distributed.summary_writer(str(out / "tb"))
        losses = []
        vae.train()
        budget.started, done, first = time.time(), step, step
        forward = torch.compile(vae_forward) if compile_forward else vae_forward
        bar = _progress(range(step, config.steps), initial=step, total=config.steps, desc="train-vae", disable=not main)
        curve, tenths = [], int(10 * budget.fraction(step))  # held-out PSNR at each tenth of the budget: how it grows with time
        for step in bar:
            if budget.out_of_time():  # checked first: a resumed run whose time is spent takes no step
                break
            frames = store.sample(config.batch_size, VAE_CLIP_FRAMES, generator, mine)
            pixels = vae_lib.frames_to_pixels(frames)
            with autocast(device):
                mean, logvar, var, recon = forward(vae, pixels)
            recon = recon.float()
            l1 = (recon - pixels).abs().mean()
            l2 = (recon - pixels).pow(2).mean()
            kl = 0.5 * (mean.float().pow(2) + var.float() - 1.0 - logvar.float()).mean()
            loss = l1 + l2 + KL_WEIGHT * kl
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            distributed.average_gradients(vae.parameters())
            torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            done = step + 1
            if (step + 1) % log_every == 0 or step + 1 == config.steps:  # reading the loss waits for the GPU: only here
                losses.append(distributed.all_mean(float(loss.detach())))
                writer.add_scalar("vae/loss", losses[-1], step + 1)
                writer.add_scalar("vae/l1", distributed.all_mean(float(l1.detach())), step + 1)
                writer.add_scalar("vae/kl", distributed.all_mean(float(kl.detach())), step + 1)
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
            reached = int(10 * budget.fraction(step + 1))  # the same on every rank (rank 0's clock)
            if reached > tenths:
                tenths = reached
                seconds = budget.seconds()
                if main:
                    curve.append({"step": step + 1, "seconds": seconds} | reconstruction_metrics(vae, held_out or train_episodes, device, clips=16))
                    writer.add_scalar("vae/held_out_psnr", curve[-1]["psnr"], step + 1)
                    vae.train()
            if (step + 1) % config.checkpoint_every == 0 and step + 1 < config.steps:
                save_checkpoint(out, step + 1, {"vae": vae}, stateful, extra={"seconds": budget.seconds()})
        steps_done, train_seconds = done, time.time() - budget.started
        if done > first and done % log_every and done != config.steps:  # the last step's loss, when it was not logged
            losses.append(distributed.all_mean(float(loss.detach())))
        save_checkpoint(out, steps_done, {"vae": vae}, stateful, extra={"seconds": budget.seconds()})
        writer.close()
        vae.eval()
        if main:
            mean, std = latent_statistics(vae, train_episodes, device)
            vae.register_to_config(latents_mean=mean, latents_std=std)
    if not main:  # rank 0 measures and saves the VAE; the others return what it measured
        return distributed.broadcast_object(None)
    vae.eval()
    metrics = {
        "held_out": reconstruction_metrics(vae, held_out or train_episodes, device),
        "held_out_is_train": not held_out,
        "held_out_curve": curve,  # 16 clips at each tenth of the budget (of this run; the seconds count resumed runs too)
        "steps": steps_done,
        "final_loss": losses[-1] if losses else None,
        "train_seconds_this_run": train_seconds,
        "clips_per_s": (steps_done - first) * config.batch_size / train_seconds if train_seconds else None,
        "processes": distributed.world_size(),
        "parameters_millions": sum(p.numel() for p in vae.parameters()) / 1e6,
        "spatial_compression": vae_lib.spatial_factor(vae),
        "latent_channels": int(vae.config.z_dim),
        "image_size": None if config.pretrained else int(_frames(train_episodes[0]).shape[1]),  # the frames it learned (train-wm checks)
    }
    vae.save_pretrained(str(out), safe_serialization=True)
    atomic_write_json(out / "metrics.json", metrics)
    return distributed.broadcast_object(metrics)


# ==================================================================================== world model


@torch.no_grad()
def encode_clips(
    vae, episodes: Sequence[EpisodeLike], config: WorldModelConfig, device: torch.device, seed: int = 0, batch: int = 32, progress: bool = True
) -> dict[str, torch.Tensor]:
    """Every training clip as latents ``(M, C, 4, h, w)`` [slot 0, memory, future, future] with its
    13 raw actions ``(M, 13, A)`` and the index of the clip one chunk earlier ``(M,)`` (-1: none; see
    :mod:`worldloop.worldmodel.clips`); ``progress``: a progress bar over the episodes."""
    rng = np.random.default_rng(seed)
    latents, actions, previous, count = [], [], [], 0
    for episode in _progress(episodes, desc="encode clips", leave=False, disable=not progress):
        frames = _frames(episode)
        specs = episode_clips(_actions(episode), config.chunk_size, config.clip_stride, rng)
        if not specs:
            continue
        with autocast(device):
            reference = vae_lib.encode(vae, frames[:1][None].to(device))  # (1, C, 1, h, w)
            for start in range(0, len(specs), batch):
                group = specs[start : start + batch]
                index = torch.as_tensor(np.stack([s.frame_indices for s in group]))
                clip_latents = vae_lib.encode(vae, frames[index].to(device))  # (b, C, 4, h, w)
                clip_latents[:, :, :1] = reference
                latents.append(clip_latents.float().cpu())
        actions.append(torch.as_tensor(np.stack([s.actions for s in specs])))
        local = predecessors(specs, config.chunk_size)
        previous.append(torch.as_tensor(np.where(local >= 0, local + count, -1)))
        count += len(specs)
    if not latents:
        raise ValueError(f"no episode is long enough for a clip of {5 + config.chunk_size} frames")
    return {"latents": torch.cat(latents), "actions": torch.cat(actions), "previous": torch.cat(previous)}


def cached_clips(vae, episodes: Sequence[EpisodeLike], config: WorldModelConfig, device: torch.device, cache_dir: Path, key: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """:func:`encode_clips`, stored once in ``cache_dir/latents.safetensors`` and reused while ``key`` matches. Under
    torchrun rank 0 encodes and writes them; the other ranks read its file."""
    from safetensors.torch import load_file

    if distributed.is_main():
        clips = _cached_clips(vae, episodes, config, device, cache_dir, key, seed)
    distributed.barrier()
    return clips if distributed.is_main() else load_file(cache_dir / "latents.safetensors")


def _cached_clips(vae, episodes: Sequence[EpisodeLike], config: WorldModelConfig, device: torch.device, cache_dir: Path, key: dict[str, Any],
                  seed: int) -> dict[str, torch.Tensor]:  # fmt: skip
    from safetensors.torch import load_file, save_file

    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    file, meta = cache_dir / "latents.safetensors", cache_dir / "latents.json"
    if file.is_file() and meta.is_file() and read_json(meta).get("digest") == digest:
        clips = load_file(file)
        if "previous" in clips:  # caches written before self-forcing lack it
            return clips
    clips = encode_clips(vae, episodes, config, device, seed)
    with atomic_path(file) as tmp:
        save_file({k: v.contiguous() for k, v in clips.items()}, str(tmp))
    atomic_write_json(meta, {"digest": digest, "key": key, "clips": len(clips["latents"])})
    return clips


def train_world_model(
    config: WorldModelConfig,
    train_episodes: Sequence[EpisodeLike],
    vae,
    out: str | Path,
    device: torch.device,
    seed: int = 0,
    cache_key: dict[str, Any] | None = None,
    clips: dict[str, torch.Tensor] | None = None,
    init: WorldModel | None = None,
    steps_before: int | None = 0,
    log_every: int = LOG_EVERY,
    self_forcing_after: float = SELF_FORCING_AFTER,
) -> WorldModel:
    """Train the action-conditioned DiT on ``train_episodes``; the EMA model is saved to ``out``
    (config.json, model.safetensors, vae/) and returned. ``clips`` ({"latents" (M, C, 4, h, w),
    "actions" (M, 13, A) raw, optionally "previous" (M,) for self-forcing}) replaces the episodes with
    ready-made latent clips. ``init`` starts from a trained world model's weights and action
    statistics (fine-tuning, e.g. PACE's WM Evo, or a DiT grown over several runs); ``steps_before``
    (its :func:`steps_trained`, None: unknown) lets results.json's ``steps_total`` count its steps too.
    ``self_forcing_after``: the share of the budget before self-forcing starts (0: from the first step, as
    `bench wm-train` measures it)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vae = vae.to(device).eval().requires_grad_(False)
    if clips is None:
        if not train_episodes:
            raise ValueError("train-wm: no training episodes")
        image_size = int(_frames(train_episodes[0]).shape[1])
        all_actions = np.concatenate([_actions(e) for e in train_episodes])
        key = dict(cache_key or {}, image_size=image_size, episodes=len(train_episodes), chunk=config.chunk_size,
                   stride=config.clip_stride, static=STATIC_FRACTION, seed=seed,
                   vae_mean=list(vae.config.latents_mean)[:4])  # fmt: skip
        clips = cached_clips(vae, train_episodes, config, device, out, key, seed)
    else:
        image_size = int(clips["latents"].shape[-1]) * vae_lib.spatial_factor(vae)
        all_actions = clips["actions"][:, 5:].reshape(-1, clips["actions"].shape[-1]).numpy()
    action_dim = all_actions.shape[1]
    action_mean, action_std = all_actions.mean(0), np.maximum(all_actions.std(0), 1e-3)
    if init is not None:
        if (init.image_size, len(init.spec["action_mean"])) != (image_size, action_dim):
            raise ValueError(f"--init world model renders {init.image_size}px with {len(init.spec['action_mean'])}-d actions; this data has {image_size}px, {action_dim}-d")
        if bool(init.spec["context_channels"]) != config.context_channels:
            raise ValueError(f"--init world model has context_channels={bool(init.spec['context_channels'])}; "
                             f"world_model.context_channels={config.context_channels} builds a DiT whose input layer differs: set it alike")
        action_mean, action_std = np.asarray(init.spec["action_mean"]), np.asarray(init.spec["action_std"])
    latents_all, actions_all = clips["latents"].to(device), clips["actions"].to(device)
    if config.self_forcing and "previous" not in clips:
        raise ValueError("world_model.self_forcing needs clips with 'previous' (the clip one chunk earlier); ready-made clips lack it")
    previous_all = clips["previous"].to(device) if "previous" in clips else None

    main, mine = distributed.is_main(), distributed.rows(config.batch_size, "world_model.batch_size")
    torch.manual_seed(seed)
    model = WorldModel.build(config, vae, image_size, action_dim, action_mean.tolist(), action_std.tolist(), device)
    if init is not None:
        load_init_weights(model.dit, init.dit)
    dit = model.dit.train()
    ema = copy.deepcopy(dit).eval().requires_grad_(False)
    optimizer = make_optimizer(dit.parameters(), config.lr, WEIGHT_DECAY, device)
    budget = TrainingBudget(config.steps, config.time_limit_s)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, budget.lr_factor)
    generator = torch.Generator(device=device).manual_seed(seed)
    modules, stateful = {"dit": dit, "ema": ema}, {"optimizer": optimizer, "scheduler": scheduler, "generator": generator}
    shape = dict(image_size=image_size, action_dim=action_dim, latent_shape=list(latents_all.shape[1:]), size=config.size)
    if config.context_channels:  # only when set, so that checkpoints from before the option still resume
        shape["context_channels"] = True

    step = 0

    def same_shape(checkpoint: Path, saved: dict) -> None:
        saved_shape = saved.get("shape") or {}
        if saved_shape != shape:
            differ = sorted(key for key in saved_shape.keys() | shape.keys() if saved_shape.get(key) != shape.get(key))
            raise ValueError(f"checkpoint {checkpoint} cannot resume this run: it differs in {differ} "
                             f"(checkpoint {saved_shape}, this run {shape}); train into a new --out or match the settings")

    resumed = resume(out, "train-wm", modules, stateful, check=same_shape)
    if resumed is not None:
        _, step, extra = resumed
        budget.seconds_done = extra.get("seconds", 0.0)
    for module in modules.values():
        distributed.broadcast_parameters(module)

    writer = distributed.summary_writer(str(out / "tb"))
    num_clips = len(latents_all)
    mean_t = torch.as_tensor(action_mean, dtype=torch.float32, device=device)
    std_t = torch.as_tensor(action_std, dtype=torch.float32, device=device)
    normalised_all = (actions_all - mean_t) / std_t  # (M, 13, A), once for every batch and self-forced sample
    loss_value, done, self_forced = float("nan"), step, 0
    forced_per_step = round(config.self_forcing * config.batch_size)  # a fixed count: the compiled graphs see fixed shapes
    forced_rows = self_forced_rows(forced_per_step, config.batch_size)  # where they sit in the global batch: each rank its share
    has_previous = torch.nonzero(previous_all >= 0).flatten() if previous_all is not None else None
    if forced_per_step and not len(has_previous):
        raise ValueError("world_model.self_forcing: no training clip has a predecessor one chunk earlier (episodes too short?)")
    forward = compiled(dit, config, device)
    budget.started, first = time.time(), step
    bar = _progress(range(step, config.steps), initial=step, total=config.steps, desc="train-wm", disable=not main)
    for step in bar:
        if budget.out_of_time():  # checked first: a resumed run whose time is spent takes no step
            break
        index = torch.randint(num_clips, (config.batch_size,), generator=generator, device=device)
        forcing = forced_per_step and budget.fraction(step) >= self_forcing_after
        if forcing:  # the forced rows become clips that have a predecessor, drawn uniformly among them
            pick = torch.randint(len(has_previous), (forced_per_step,), generator=generator, device=device)
            index = index.clone()
            index[forced_rows] = has_previous[pick]
        x0 = latents_all[index]  # (B, C, 4, h, w): the global batch; this rank computes on its rows ``mine``
        actions = normalised_all[index]  # (B, 13, A)
        if forcing:
            # the memory the model will really see from a rollout's second chunk on: its own samples (this rank's rows)
            here = forced_rows[(forced_rows >= mine.start) & (forced_rows < mine.stop)]
            if len(here):
                x0[here, :, 1] = self_forced_memory(forward, latents_all, normalised_all, previous_all, index[here], model.sigmas, generator)
            self_forced += forced_per_step
        loss = flow_matching_loss(forward, x0, actions, config, generator, rows=mine)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        distributed.average_gradients(dit.parameters())
        grad_norm = torch.nn.utils.clip_grad_norm_(dit.parameters(), GRAD_CLIP)
        optimizer.step()
        scheduler.step()
        ema_step(ema, dit, min(config.ema_decay, (1 + step) / (10 + step)))
        done = step + 1
        if done % log_every == 0 or done == config.steps:  # reading the loss waits for the GPU: only here
            loss_value = distributed.all_mean(float(loss.detach()))
            writer.add_scalar("wm/loss", loss_value, done)
            writer.add_scalar("wm/grad_norm", float(grad_norm), done)
            writer.add_scalar("wm/lr", scheduler.get_last_lr()[0], done)
            writer.add_scalar("wm/self_forced_clips", self_forced, done)
            bar.set_postfix(loss=f"{loss_value:.4f}")
        if main and (done % config.checkpoint_every == 0 or done == config.steps):  # sample videos at every checkpoint
            _log_samples(writer, ema, vae, latents_all[:4], normalised_all[:4], model.sigmas, done)
        if done % config.checkpoint_every == 0 and done < config.steps:
            save_checkpoint(out, done, modules, stateful, extra={"shape": shape, "seconds": budget.seconds()})
    if done > first and done % log_every and done != config.steps:  # the last step's loss, when it was not logged
        loss_value = distributed.all_mean(float(loss.detach()))
    loop_seconds = time.time() - budget.started
    if main and done % config.checkpoint_every and done < config.steps:  # stopped by the time limit: samples of the end state
        _log_samples(writer, ema, vae, latents_all[:4], normalised_all[:4], model.sigmas, done)
    writer.close()
    save_checkpoint(out, done, modules, stateful, extra={"shape": shape, "seconds": budget.seconds()})
    model.dit = ema
    if not main:  # rank 0 writes the model and results.json
        distributed.barrier()
        return model
    model.save_pretrained(out, dit=ema)
    total = {} if steps_before is None else {"steps_total": steps_before + done}  # "steps" are this run's
    atomic_write_json(out / "results.json", {"steps": done, **total, "final_loss": loss_value, "clips": num_clips, "self_forced_clips_this_run": self_forced,
                                             "train_seconds_this_run": time.time() - budget.started, "batch_size": config.batch_size,
                                             "compiled": forward is not dit, "processes": distributed.world_size(),
                                             "clips_per_s": (done - first) * config.batch_size / loop_seconds if loop_seconds > 0 else None,
                                             "parameters_millions": sum(p.numel() for p in ema.parameters()) / 1e6})  # fmt: skip
    distributed.barrier()
    return model


def steps_trained(folder: str | Path) -> int | None:
    """Optimizer steps the world model in ``folder`` has taken in all its training runs (results.json's
    ``steps_total``, or ``steps`` where it has no other); None where its results.json is absent or says neither."""
    path = Path(folder) / "results.json"
    if not path.is_file():
        return None
    results = read_json(path)  # a corrupt file is named in its error
    steps = results.get("steps_total", results.get("steps"))
    return None if steps is None else int(steps)


def load_init_weights(dit, init_dit) -> None:
    """``init_dit``'s weights into the new ``dit``; a missing or unexpected weight is an error."""
    missing, unexpected = dit.load_state_dict({k: v.float() for k, v in init_dit.state_dict().items()}, strict=False)
    if unexpected or missing:
        raise ValueError(f"--init world model's DiT does not match this one: "
                         f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")  # fmt: skip


@torch.no_grad()
def ema_step(ema: torch.nn.Module, model: torch.nn.Module, decay: float) -> None:
    """One step of the exponential moving average of ``model``'s weights in ``ema``: ema <- decay ema + (1 - decay) model
    (one multi-tensor kernel for all weights, not one per tensor)."""
    torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 1.0 - decay)


def compiled(dit, config: WorldModelConfig, device: torch.device):
    """The DiT's forward for training: ``torch.compile``d on CUDA when ``config.compile`` (the small DiT's eager step
    is bound by kernel launches, not arithmetic), else the module itself. Compiled with fixed shapes: one graph for
    the training batch and one for the self-forced samples' batch."""
    if not (config.compile and device.type == "cuda"):
        return dit
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True  # a graph that fails to compile runs eagerly instead of ending the run
    return torch.compile(dit, dynamic=False)


def self_forced_rows(count: int, batch: int) -> torch.Tensor:
    """The rows of a global batch of ``batch`` that hold the ``count`` self-forced clips: the first rows of each rank's
    share, as evenly as they split (in one process, the first ``count`` rows)."""
    ranks, share = distributed.world_size(), batch // distributed.world_size()
    per_rank = [count // ranks + (r < count % ranks) for r in range(ranks)]
    return torch.tensor([r * share + i for r in range(ranks) for i in range(per_rank[r])], dtype=torch.long)


def flow_matching_loss(
    dit, x0: torch.Tensor, actions: torch.Tensor, config: WorldModelConfig, generator: torch.Generator, rows: slice = slice(None),
) -> torch.Tensor:
    """The DiT's rectified-flow loss on clips ``x0`` (B, C, 4, h, w) [reference, memory, future, future]
    with normalised ``actions`` (B, 13, A): the future latents are noised to ``(1 - sigma) x0 + sigma eps``
    (sigma time-shifted), the memory latent lightly (context-noise augmentation, up to
    ``CONTEXT_NOISE``; the reference, the episode's first frame, stays clean), and the DiT's
    velocity is regressed on ``eps - x0`` over the future slots. ``rows``: the clips the DiT sees (a rank's share of the global
    batch); the noise is drawn for all B, so each clip's noise is the same whatever the share."""
    batch = x0.shape[0]
    device = x0.device
    context, future = x0[:, :, :2], x0[:, :, 2:]
    sigma = shift_sigmas(torch.rand(batch, device=device, generator=generator), config.shift)
    noise = torch.randn(future.shape, device=device, generator=generator)
    s = sigma.view(-1, 1, 1, 1, 1)
    noisy_future = (1 - s) * future + s * noise
    context_sigma = torch.rand(batch, 2, device=device, generator=generator) * CONTEXT_NOISE
    context_sigma[:, 0] = 0.0
    context_noise = torch.randn(context.shape, device=device, generator=generator)
    cs = context_sigma.view(batch, 1, 2, 1, 1)
    noisy_context = (1 - cs) * context + cs * context_noise
    sigmas = torch.cat([context_sigma, sigma[:, None].expand(-1, future.shape[2])], dim=1)  # (B, 4)
    noisy = torch.cat([noisy_context, noisy_future], dim=2)[rows]
    with autocast(device):
        velocity = dit(noisy, sigmas[rows], actions[rows])
    return F.mse_loss(velocity[:, :, 2:].float(), (noise - future)[rows])


def self_forced_memory(
    dit, latents: torch.Tensor, actions: torch.Tensor, previous: torch.Tensor, clips: torch.Tensor, sigmas: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """The memory latent a rollout's second chunk would hold at each of ``clips`` (indices; each has a predecessor):
    the model's own last latent sampled from the real context of the clip one chunk earlier, driven by that clip's
    recorded (normalised) ``actions``. Returns (n, C, h, w)."""
    earlier = previous[clips]
    real = latents[earlier]  # (n, C, 4, h, w): its reference and memory frames, and the shape of its future
    noise = torch.randn(real[:, :, 2:].shape, device=latents.device, generator=generator)
    return sample_future(dit, real[:, :, :2], actions[earlier], noise, sigmas)[:, :, -1]


@torch.no_grad()
def _log_samples(writer, dit, vae, latents: torch.Tensor, actions: torch.Tensor, sigmas: torch.Tensor, step: int) -> None:
    """TensorBoard: real | generated 13-frame clips (context + 8 sampled frames) as one image strip each."""
    device = latents.device
    noise = torch.randn(latents[:, :, 2:].shape, device=device, generator=torch.Generator(device=device).manual_seed(0))
    generated = sample_future(dit, latents[:, :, :2], actions, noise, sigmas)
    with autocast(device):
        real = vae_lib.decode(vae, latents)  # (b, 13, H, W, 3)
        fake = vae_lib.decode(vae, torch.cat([latents[:, :, :2], generated], dim=2))
    real_rows = torch.cat(list(real.unbind(1)), dim=2)  # (b, H, 13 W, 3)
    fake_rows = torch.cat(list(fake.unbind(1)), dim=2)
    image = torch.cat([torch.cat([r, f], dim=0) for r, f in zip(real_rows, fake_rows)], dim=0)  # real above generated
    writer.add_image("wm/samples_real_over_generated", image.cpu(), step, dataformats="HWC")

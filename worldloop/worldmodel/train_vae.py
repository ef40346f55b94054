"""Training the VAE, top to bottom: random clips of dataset frames -> AutoencoderKLWan, L1 + L2 reconstruction + KL;
then per-channel latent statistics and held-out PSNR/SSIM. With ``vae.init`` and a narrower ``vae.decoder_base_dim``
it distils a light decoder instead: the init's encoder stays frozen, and the new decoder learns (L1 + L2) to decode
the init's latents into the frames the init's own decoder makes of them.

Under torchrun it is data-parallel (:mod:`worldloop.utils.distributed`): every rank draws the same global batch and
trains on its rows, the gradients are averaged, rank 0 writes checkpoints, TensorBoard and the VAE.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import torch

from worldloop.utils import distributed
from worldloop.utils.checkpoint import resume, save_checkpoint
from worldloop.utils.device import autocast
from worldloop.utils.io import atomic_write_json
from worldloop.worldmodel import vae as vae_lib
from worldloop.worldmodel.configuration import VAEConfig
from worldloop.worldmodel.metrics import masked_psnr, moving_pixels, psnr, ssim
from worldloop.worldmodel.training import LOG_EVERY, EpisodeLike, TrainingBudget, episode_frames, make_optimizer, progress

KL_WEIGHT = 1e-6
"""The VAE's KL term against its per-pixel L1 + L2 reconstruction loss."""
VAE_CLIP_FRAMES = 13
"""Frames per VAE training clip: 4 latent frames, the world model's layout (a VAE trained on 5-frame clips only ever saw
latent positions 0 and 1 and decoded positions 2+ poorly)."""


class FrameStore:
    """Every frame of ``episodes`` in one uint8 tensor ``(N, H, W, 3)`` on ``device``, so that a training step
    draws its clips with one gather on the device instead of a Python loop over episodes on the host.
    An episode shorter than a clip holds its last frame (as :func:`_random_clips` does)."""

    def __init__(self, episodes: Sequence[EpisodeLike], device: torch.device):
        frames = [episode_frames(episode) for episode in episodes]
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
        frames = episode_frames(episode)
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


def vae_loss(forward, vae, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The VAE's training loss on ``pixels`` through ``forward`` (:func:`vae_forward`, or it compiled): per-pixel L1 +
    L2 reconstruction + ``KL_WEIGHT`` KL of the posterior against N(0, 1). Returns the loss, its L1 and its KL."""
    with autocast(pixels.device):
        mean, logvar, var, recon = forward(vae, pixels)
    recon = recon.float()
    l1 = (recon - pixels).abs().mean()
    l2 = (recon - pixels).pow(2).mean()
    kl = 0.5 * (mean.float().pow(2) + var.float() - 1.0 - logvar.float()).mean()
    return l1 + l2 + KL_WEIGHT * kl, l1, kl


def distill_forward(vae, teacher, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A light decoder's training forward: the teacher encodes (a posterior sample, as its own decoder was trained on)
    and decodes; ``vae``'s decoder decodes the same latents. Returns the teacher's frames and ``vae``'s."""
    with torch.no_grad():
        latents = teacher.encode(pixels).latent_dist.sample()
        target = teacher.decode(latents).sample
    return target, vae.decode(latents).sample


def distill_loss(forward, vae, teacher, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """L1 + L2 between the light decoder's frames and the teacher's (through ``forward``: :func:`distill_forward`, or it
    compiled). Returns the loss, its L1 and a zero KL (the encoder is the teacher's, frozen)."""
    with autocast(pixels.device):
        target, recon = forward(vae, teacher, pixels)
    recon, target = recon.float(), target.float()
    l1 = (recon - target).abs().mean()
    return l1 + (recon - target).pow(2).mean(), l1, torch.zeros((), device=pixels.device)


def teacher_agreement(vae, teacher, episodes: Sequence[EpisodeLike], device: torch.device, clips: int = 64, length: int = 13, seed: int = 0) -> dict[str, float]:
    """Mean PSNR of a light decoder's frames against its teacher's own decode of the same latents (the teacher's
    posterior means of held-out clips): how closely the fast path reproduces the reference one."""
    generator = torch.Generator().manual_seed(seed)
    real = _random_clips(episodes, clips, length, generator).to(device)
    values = []
    with torch.no_grad():
        for batch in real.split(16):
            with autocast(device):
                latents = vae_lib.encode(teacher, batch)
                values.append(psnr(vae_lib.decode(vae, latents), vae_lib.decode(teacher, latents)).flatten())
    return {"psnr": float(torch.cat(values).mean()), "clips": clips, "frames_per_clip": length}


def train_vae(config: VAEConfig, train_episodes: Sequence[EpisodeLike], held_out: Sequence[EpisodeLike], out: str | Path, device: torch.device, seed: int = 0,
              log_every: int = LOG_EVERY, compile_forward: bool = False) -> dict[str, Any]:
    """Train an AutoencoderKLWan from scratch or from ``config.init`` (with 0 steps: take it as it is), save it to ``out``
    in diffusers format with its latent statistics, and write ``out/metrics.json``. ``compile_forward``: torch.compile
    the training forward (:func:`vae_forward`; `bench vae-train` measures it against eager on a GPU)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not train_episodes:
        raise ValueError("train-vae: the dataset has no training episodes")
    main, mine = distributed.is_main(), distributed.rows(config.batch_size, "vae.batch_size")
    teacher = None  # a light decoder's: vae.init, when vae.decoder_base_dim narrows its decoder
    as_is = config.steps == 0  # with vae.init (VAEConfig.validate)
    if as_is and not config.init:
        raise ValueError("vae.steps=0 takes vae.init as it is: set vae.init to a VAE folder, or train (vae.steps >= 1)")
    if as_is:
        vae = vae_lib.load_vae(config.init).to(device)
        steps_done, losses, first, train_seconds, curve = 0, [], 0, 0.0, []
    else:
        torch.manual_seed(seed)
        vae = vae_lib.load_vae(config.init).train() if config.init else vae_lib.build_vae(config)
        if config.init and config.decoder_base_dim and config.decoder_base_dim != vae_lib.decoder_width(vae):
            teacher = vae.to(device).eval().requires_grad_(False)
            vae = vae_lib.narrow_decoder(teacher, config.decoder_base_dim).train()
        vae = vae.to(device)
        image_size = int(episode_frames(train_episodes[0]).shape[1])
        factor = vae_lib.spatial_factor(vae)
        if image_size % factor:
            raise ValueError(f"frames of {image_size}x{image_size} are not divisible by the VAE's {factor}x spatial compression")
        distributed.broadcast_parameters(vae)
        distributed.seed_per_rank(seed)  # the posterior's noise: each rank its own
        optimizer = make_optimizer([p for p in vae.parameters() if p.requires_grad], config.lr, 0.0, device)
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
        forward = vae_forward if teacher is None else distill_forward
        forward = torch.compile(forward) if compile_forward else forward
        bar = progress(range(step, config.steps), initial=step, total=config.steps, desc="train-vae", disable=not main)
        curve, tenths = [], int(10 * budget.fraction(step))  # held-out PSNR at each tenth of the budget: how it grows with time
        for step in bar:
            if budget.out_of_time():  # checked first: a resumed run whose time is spent takes no step
                break
            frames = store.sample(config.batch_size, VAE_CLIP_FRAMES, generator, mine)
            pixels = vae_lib.frames_to_pixels(frames)
            loss, l1, kl = vae_loss(forward, vae, pixels) if teacher is None else distill_loss(forward, vae, teacher, pixels)
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
        if main and teacher is None:  # a light decoder decodes its teacher's latents: their statistics stay the teacher's
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
        "image_size": None if as_is else int(episode_frames(train_episodes[0]).shape[1]),  # the frames it learned (train-wm checks)
        "decoder_base_dim": vae_lib.decoder_width(vae),
        "decoder_parameters_millions": sum(p.numel() for p in vae.decoder.parameters()) / 1e6,
    }
    if teacher is not None:
        metrics["teacher"] = {"vae": str(config.init), "decoder_base_dim": vae_lib.decoder_width(teacher),
                              "held_out_psnr_vs_teacher": teacher_agreement(vae, teacher, held_out or train_episodes, device)}  # fmt: skip
    vae.save_pretrained(str(out), safe_serialization=True)
    atomic_write_json(out / "metrics.json", metrics)
    return distributed.broadcast_object(metrics)



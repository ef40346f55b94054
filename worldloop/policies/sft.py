"""Supervised fine-tuning of the CompactVLA on demonstrations (behaviour cloning on action tokens).

One training sample is (frame t, instruction, actions t .. t+K-1), the chunk padded by repeating
the episode's last action; the loss is the cross-entropy of the K x A action tokens. Read top to
bottom, :func:`fit_policy` is the whole algorithm:

    fit the action tokenizer on the training actions -> build the policy -> AdamW + warm-up/cosine
    -> loop: sample a batch, random shift (and VAE-reconstructed frames), forward (bf16 on GPU), token cross-entropy, step
       every quarter of the steps: held-out loss and token accuracy, and a resume point
    -> the model folder (config.json, model.safetensors, norm_stats.json) in OUT.

All frames and targets are held in memory on the training device (uint8), so a step never waits
for data. Resuming from OUT's latest checkpoint continues bit-exactly (same batches, same
weights on CPU): the batch sampler is a seeded generator saved with the checkpoint.

Under torchrun (:mod:`worldloop.utils.distributed`) every rank draws and augments the same global batch of
``sft.batch_size`` samples and trains on its own rows of it; the gradients are averaged over the ranks, and rank 0
alone writes checkpoints, TensorBoard, the progress bar and the model. The run is the same training whatever the
number of processes.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from worldloop.policies.compact_vla.modeling import CompactVLA
from worldloop.policies.tokenizer import ActionTokenizer
from worldloop.utils import distributed
from worldloop.utils.checkpoint import evaluation_interval, resume, save_checkpoint
from worldloop.utils.device import autocast_dtype, resolve_device
from worldloop.utils.io import atomic_write_json
from worldloop.worldmodel.vae import reconstruct, world_model_vae

WEIGHT_DECAY = 0.01
"""AdamW weight decay of fine-tuning."""
GRAD_CLIP = 1.0
"""Gradient-norm clip of fine-tuning."""
AUGMENT_SHIFT = 4
"""Random shift augmentation of every training frame: pad by this many pixels (edge replicate), crop back at random."""
HELD_OUT_SAMPLES = 2048
"""Held-out samples scored at each evaluation: a fixed, evenly spaced subset (all of them when fewer), as many as the
metaworld-gpu preset's runs scored (the codec token agreement of sft.augment_codec among them)."""


class EpisodeLike(Protocol):
    frames: Any  # (T, H, W, 3) uint8
    actions: Any  # (T, A) float32
    success: Any  # (T,) bool
    instruction: str


@dataclass
class Samples:
    """Every (frame, instruction, action chunk) sample of a set of episodes, as tensors."""

    frames: torch.Tensor
    """(N, H, W, 3) uint8: the observation of each sample."""
    chunks: torch.Tensor
    """(N, K, A) float32: the K actions from that frame on (last action repeated past the end)."""
    instruction_ids: torch.Tensor
    """(N,) int64 index into ``instructions``."""
    instructions: list[str]
    reconstructed: torch.Tensor | None = None
    """(N, H, W, 3) uint8: each frame encoded and decoded by a world model's VAE (:func:`with_reconstructions`)."""

    def __len__(self) -> int:
        return len(self.frames)

    def to(self, device: torch.device) -> Samples:
        reconstructed = None if self.reconstructed is None else self.reconstructed.to(device)
        return Samples(self.frames.to(device), self.chunks.to(device), self.instruction_ids.to(device), self.instructions, reconstructed)

    def subset(self, index: torch.Tensor) -> Samples:
        reconstructed = None if self.reconstructed is None else self.reconstructed[index]
        return Samples(self.frames[index], self.chunks[index], self.instruction_ids[index], self.instructions, reconstructed)


def action_chunks(actions: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """(T, A) -> (T, K, A): row t holds actions t .. t+K-1, repeating the last action past the end."""
    steps = len(actions)
    index = (torch.arange(steps)[:, None] + torch.arange(chunk_size)[None, :]).clamp(max=steps - 1)
    return actions[index]


def build_samples(episodes: Iterable[EpisodeLike], chunk_size: int, instructions: Sequence[str]) -> Samples:
    """All samples of ``episodes``; ``instructions`` fixes the id of each instruction."""
    frames, chunks, ids = [], [], []
    for episode in episodes:
        episode_frames = torch.from_numpy(np.array(episode.frames, dtype=np.uint8))  # a copy: frames may be read-only maps
        actions = torch.from_numpy(np.array(episode.actions, dtype=np.float32))
        if len(episode_frames) != len(actions) or len(actions) == 0:
            raise ValueError(f"episode with instruction {episode.instruction!r} has {len(episode_frames)} frames and {len(actions)} actions")
        frames.append(episode_frames)
        chunks.append(action_chunks(actions, chunk_size))
        ids.append(torch.full((len(actions),), list(instructions).index(episode.instruction), dtype=torch.int64))
    if not frames:
        raise ValueError("no episodes to build samples from")
    return Samples(torch.cat(frames), torch.cat(chunks), torch.cat(ids), list(instructions))


@torch.no_grad()
def with_reconstructions(samples: Samples, vae, batch_size: int = 256) -> Samples:
    """``samples`` with each frame passed through ``vae`` on its own (what a world model shows the policy of
    the same scene: its VAE's loss of detail), in batches on the VAE's device."""
    reconstructed = reconstruct(vae, samples.frames, batch_size, progress="sft: frames through the VAE")
    return Samples(samples.frames, samples.chunks, samples.instruction_ids, samples.instructions, reconstructed)


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    """LR multiplier: linear warm-up over ``warmup`` steps, then cosine decay to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def random_shift(images: torch.Tensor, shift: int, generator: torch.Generator) -> torch.Tensor:
    """Shift each image by up to ``shift`` pixels in x and y, repeating the edge (pad + random crop)."""
    batch, height, width, _ = images.shape
    offsets = torch.randint(-shift, shift + 1, (batch, 2), generator=generator).to(images.device)
    rows = (torch.arange(height, device=images.device)[None] + offsets[:, :1]).clamp(0, height - 1)  # (B, H)
    cols = (torch.arange(width, device=images.device)[None] + offsets[:, 1:]).clamp(0, width - 1)  # (B, W)
    return images[torch.arange(batch, device=images.device)[:, None, None], rows[:, :, None], cols[:, None, :]]


def random_reconstructed(images: torch.Tensor, reconstructed: torch.Tensor, prob: float, generator: torch.Generator) -> torch.Tensor:
    """Replace a random ``prob`` share of the frames (B, H, W, 3) by their VAE reconstructions (same shape)."""
    swap = (torch.rand(len(images), generator=generator) < prob).to(images.device)
    return torch.where(swap[:, None, None, None], reconstructed, images)


def evenly_spaced(count: int, limit: int) -> torch.Tensor:
    """At most ``limit`` indices spread evenly over ``range(count)``."""
    return torch.linspace(0, count - 1, min(limit, count)).round().long().unique()


@torch.no_grad()
def held_out_metrics(policy: CompactVLA, samples: Samples, tokens: torch.Tensor, batch_size: int) -> dict[str, float]:
    """Token cross-entropy and accuracy on ``samples``; with their reconstructions, ``codec_token_agreement``:
    the share of greedy tokens the policy keeps when it sees each frame through the world model's VAE (1: its
    choices survive the loss of detail that every imagined frame has), and ``codec_token_distance``, the mean
    number of bins between the two choices (well below 1: near-ties flipping; several: other actions)."""
    was_training = policy.training
    policy.eval()
    total_loss, correct, kept, apart, count = 0.0, 0, 0, 0, 0
    for start in range(0, len(samples), batch_size):
        part = slice(start, start + batch_size)
        instructions = [samples.instructions[i] for i in samples.instruction_ids[part].tolist()]
        with _autocast(policy.device):
            logits, _ = policy(samples.frames[part], instructions)
        target = tokens[part]
        total_loss += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum").item()
        correct += (logits.argmax(-1) == target).sum().item()
        count += target.numel()
        if samples.reconstructed is not None:
            with _autocast(policy.device):
                logits_reconstructed, _ = policy(samples.reconstructed[part], instructions)
            chosen, chosen_reconstructed = logits.argmax(-1), logits_reconstructed.argmax(-1)
            kept += (chosen_reconstructed == chosen).sum().item()
            apart += (chosen_reconstructed - chosen).abs().sum().item()
    policy.train(was_training)
    metrics = {"loss": total_loss / count, "token_accuracy": correct / count}
    if samples.reconstructed is not None:
        metrics |= {"codec_token_agreement": kept / count, "codec_token_distance": apart / count}
    return metrics


def _autocast(device: torch.device):
    dtype = autocast_dtype(device)
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else torch.autocast(device.type, enabled=False)


def training_samples(config, train_episodes: Iterable[EpisodeLike], held_out_episodes: Iterable[EpisodeLike], instructions: Sequence[str],
                     image_size: int, action_dim: int, world_model: str | Path | None, device: torch.device) -> tuple[Samples, Samples | None, int]:
    """SFT's samples on ``device``: the training ones (with their reconstructions through ``world_model``'s VAE where
    ``sft.augment_codec`` shows frames through it), the fixed, evenly spaced held-out subset every evaluation scores
    (reconstructed too, for ``codec_token_agreement``; None without held-out episodes) and the held-out samples' count."""
    sft, chunk_size = config.sft, config.policy.chunk_size
    if sft.augment_codec and world_model is None:
        raise ValueError(f"sft.augment_codec={sft.augment_codec} shows training frames through a world model's VAE: give the world model (--world-model)")
    train = build_samples(train_episodes, chunk_size, instructions)
    held_out_list = list(held_out_episodes)
    held_out = build_samples(held_out_list, chunk_size, instructions) if held_out_list else None
    held_out_total = 0 if held_out is None else len(held_out)
    if held_out is not None:
        held_out = held_out.subset(evenly_spaced(len(held_out), HELD_OUT_SAMPLES))
    if tuple(train.frames.shape[1:]) != (image_size, image_size, 3) or train.chunks.shape[-1] != action_dim:
        raise ValueError(f"episodes have frames {tuple(train.frames.shape[1:])} and {train.chunks.shape[-1]}-d actions; expected {image_size}x{image_size} and {action_dim}")
    if world_model is not None:  # reconstructions made once, before training: a step never waits for the VAE
        vae = world_model_vae(world_model, image_size).to(device)
        if sft.augment_codec:
            train = with_reconstructions(train, vae)
        if held_out is not None:
            held_out = with_reconstructions(held_out, vae)
        del vae
    return train.to(device), (held_out.to(device) if held_out is not None else None), held_out_total


def fit_policy(
    config,
    train_episodes: Iterable[EpisodeLike],
    held_out_episodes: Iterable[EpisodeLike],
    out: str | Path,
    instructions: Sequence[str],
    image_size: int,
    action_dim: int,
    stop_after: int | None = None,
    extra_results: dict[str, Any] | None = None,
    world_model: str | Path | None = None,
) -> dict[str, Any]:
    """Train a CompactVLA with ``config.policy`` / ``config.sft`` and write it to ``out``.

    Resumes from ``out``'s latest checkpoint when there is one. ``stop_after`` ends the run after
    that many steps (with a checkpoint), as an interruption would. ``world_model`` (a world-model or
    VAE folder): the held-out metrics add ``codec_token_agreement`` on its VAE's reconstructions, and
    ``sft.augment_codec`` of the training frames are shown through it. Returns the results dict, also
    written to ``out/sft_results.json``.
    """
    from tqdm import tqdm

    from worldloop.config import save_config

    sft, out = config.sft, Path(out)
    device = resolve_device(config.device)
    main, mine = distributed.is_main(), distributed.rows(sft.batch_size, "sft.batch_size")
    torch.manual_seed(config.seed)

    train, held_out, held_out_total = training_samples(config, train_episodes, held_out_episodes, instructions, image_size, action_dim,
                                                       world_model, device)  # fmt: skip
    tokenizer = ActionTokenizer.fit(train.chunks[:, 0].cpu())
    policy = CompactVLA(config.policy, action_dim, image_size, tokenizer)
    policy.add_instructions(list(instructions))
    policy.to(device).train()
    distributed.broadcast_parameters(policy)
    train_tokens = tokenizer.encode(train.chunks)  # (N, K, A)
    held_out_tokens = tokenizer.encode(held_out.chunks) if held_out is not None else None

    optimizer = torch.optim.AdamW(policy.parameters(), lr=sft.lr, weight_decay=WEIGHT_DECAY, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine(s, sft.warmup_steps, sft.steps))
    sampler = torch.Generator().manual_seed(config.seed)
    stateful = {"optimizer": optimizer, "scheduler": scheduler, "sampler": sampler}
    start, last_loss = 0, float("nan")
    resumed = resume(out, "sft", {"model": policy}, stateful)
    if resumed is not None:
        _, start, saved = resumed
        last_loss = saved.get("train_loss", last_loss)
    out.mkdir(parents=True, exist_ok=True)
    if main:
        save_config(config, out)

    writer = distributed.summary_writer(str(out / "tb"))
    metrics: dict[str, float] = {}
    started = time.time()
    end = sft.steps if stop_after is None else min(sft.steps, stop_after)
    every = evaluation_interval(sft.steps)  # held-out evaluations and checkpoints
    progress = tqdm(range(start, end), initial=start, total=sft.steps, desc="sft", dynamic_ncols=True, disable=None if main else True)
    for step in progress:
        index = torch.randint(len(train), (sft.batch_size,), generator=sampler)  # the global batch; this rank trains on ``mine``
        images = train.frames[index.to(device)]
        if sft.augment_codec:
            images = random_reconstructed(images, train.reconstructed[index.to(device)], sft.augment_codec, sampler)
        images = random_shift(images, AUGMENT_SHIFT, sampler)
        index = index[mine]
        batch_instructions = [instructions[i] for i in train.instruction_ids[index.to(device)].tolist()]
        with _autocast(device):
            logits, _ = policy(images[mine], batch_instructions)  # (B, K, A, bins)
        target = train_tokens[index.to(device)]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        distributed.average_gradients(policy.parameters())
        torch.nn.utils.clip_grad_norm_(policy.parameters(), GRAD_CLIP)
        optimizer.step()
        scheduler.step()

        done = step + 1
        last_loss = distributed.all_mean(loss.item())
        writer.add_scalar("train/loss", last_loss, done)
        writer.add_scalar("train/lr", scheduler.get_last_lr()[0], done)
        progress.set_postfix(loss=f"{last_loss:.3f}")
        if main and held_out is not None and (done % every == 0 or done == sft.steps):
            metrics = held_out_metrics(policy, held_out, held_out_tokens, sft.batch_size)
            for name, value in metrics.items():
                writer.add_scalar(f"held_out/{name}", value, done)
        if done % every == 0 or done == end:  # the last step too: a rerun of a finished run trains no step again
            save_checkpoint(out, done, {"model": policy}, stateful, extra={"train_loss": last_loss})
    progress.close()
    writer.close()
    elapsed = time.time() - started
    if end < sft.steps:
        return {"stopped_at": end}
    if main and held_out is not None and not metrics:  # resumed from the last step's checkpoint: the final evaluation is still due
        metrics = held_out_metrics(policy, held_out, held_out_tokens, sft.batch_size)
    metrics = distributed.broadcast_object(metrics)  # rank 0 evaluated

    results = {
        "steps": sft.steps,
        "train_samples": len(train),
        "held_out_samples": held_out_total,
        "final_train_loss": last_loss,
        "held_out_loss": metrics.get("loss"),
        "held_out_token_accuracy": metrics.get("token_accuracy"),
        **({"held_out_codec_token_agreement": metrics["codec_token_agreement"], "held_out_codec_token_distance": metrics["codec_token_distance"],
            "world_model": str(world_model)} if world_model is not None and metrics else {}),
        "seconds": elapsed,
        "seconds_per_step": elapsed / max(1, end - start),
        "parameters": sum(p.numel() for p in policy.parameters()),
        "processes": distributed.world_size(),
        **(extra_results or {}),
    }
    if main:
        publish_model(policy.cpu().eval(), out)
        atomic_write_json(out / "sft_results.json", results)
    distributed.barrier()
    return results


def publish_model(policy: CompactVLA, out: Path) -> None:
    """Write the model files into ``out`` beside its tb/ and checkpoints/ (which stay): the folder
    is saved whole under a staging name, then each file is renamed into place, config.json last."""
    staging = out / ".model-staging"
    policy.save_pretrained(staging)
    names = sorted(p.name for p in staging.iterdir())
    for name in [n for n in names if n != "config.json"] + ["config.json"]:
        os.replace(staging / name, out / name)
    staging.rmdir()


# ------------------------------------------------------------------------------------------------
# From a dataset folder


def select_episodes(summaries: Sequence[tuple[int, int, bool, bool]], per_task: int) -> list[int]:
    """From (episode index, task index, succeeded, clean) rows, up to ``per_task`` episodes of each
    task (0: all): successful ones first, clean (not noisy-expert) ones next, then in index order."""
    by_task: dict[int, list[tuple[int, int, bool, bool]]] = {}
    for summary in summaries:
        by_task.setdefault(summary[1], []).append(summary)
    chosen = []
    for task in sorted(by_task):
        ranked = sorted(by_task[task], key=lambda s: (not s[2], not s[3], s[0]))
        chosen.extend(s[0] for s in (ranked[:per_task] if per_task else ranked))
    return sorted(chosen)


def train_sft(
    config, dataset: str | Path, out: str | Path, episodes_per_task: int = 0, stop_after: int | None = None, world_model: str | Path | None = None,
) -> dict[str, Any]:
    """``worldloop sft``: choose ``episodes_per_task`` training episodes per task (successful ones first, then clean
    ones; 0: every one) from a LeRobot dataset folder, then :func:`fit_policy`."""
    from worldloop.data.dataset import TrajectoryDataset, split_episodes

    per_task = episodes_per_task
    ds = TrajectoryDataset(dataset)
    train_ids, held_ids = split_episodes(ds, seed=config.seed)
    summaries = [episode_summary(ds, i) for i in train_ids]
    chosen = select_episodes(summaries, per_task)
    if distributed.is_main():
        print(f"sft: {len(chosen)} training episodes ({per_task or 'all'} per task), {len(held_ids)} held out, from {dataset}")
    extra = {"dataset": str(dataset), "episodes_per_task": per_task, "train_episodes": chosen, "held_out_episodes": list(held_ids)}
    return fit_policy(
        config,
        (ds.episode(i) for i in chosen),
        (ds.episode(i) for i in held_ids),
        out,
        instructions=list(ds.tasks),
        image_size=ds.image_size,
        action_dim=ds.action_dim,
        stop_after=stop_after,
        extra_results=extra,
        world_model=world_model,
    )


def episode_summary(ds, index: int) -> tuple[int, int, bool, bool]:
    """(index, task index, succeeded, clean) of one episode, from the episode table when it records them."""
    info = ds.episode_info(index)
    clean = not info.get("noisy", False)
    if "success" in info:
        return index, int(ds.task_indices[index]), bool(info["success"]), clean
    episode = ds.episode(index)
    return index, int(episode.task_index), bool(torch.as_tensor(episode.success).any()), clean

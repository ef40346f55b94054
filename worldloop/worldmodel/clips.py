"""Training clips for the world model: which frames and actions make one 13-frame example.

A clip at time ``t`` (the newest context frame) is the frame sequence
``[pre, m1, m2, m3, m4, f1 .. f8]`` = frames ``t-4 .. t+8`` (indices below 0 clamped to the first
frame), encoded in one pass by the causal VAE into 4 latents ``[l(pre), l(m1..m4), l(f1..f4), l(f5..f8)]``.
Slot 0 is then replaced by the latent of the episode's first frame encoded alone (``l(o_0)``: first-frame
anchoring). This matches the rollout, where the memory latent is the last generated latent, which also
follows real predecessors.

The 13 actions are, per frame, the action that produced it: zero for the reference slot and for
a frame that repeats its predecessor (clamped start, static clips), ``a[i-1]`` for
frame ``i`` otherwise; the future frames carry the chunk ``a[t .. t+7]``.

:func:`encode_clips` encodes every clip of a set of episodes with the VAE: the examples the DiT trains on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from worldloop.utils.device import autocast
from worldloop.worldmodel import vae as vae_lib
from worldloop.worldmodel.configuration import WorldModelConfig
from worldloop.worldmodel.training import EpisodeLike, episode_actions, episode_frames, progress

CONTEXT = 5
STATIC_FRACTION = 0.05
"""Share of training clips that are static (one frame repeated) with zero actions."""
OUTCOME_LEAD_CHUNKS = 3
"""A clip is an outcome clip (world_model.outcome_weight) when one of its future frames lies within this many chunks
before its episode's first success or in the chunk that begins there: the approach the judge reads as a success."""


@dataclass
class ClipSpec:
    """One training clip: the 13 frame indices, the 13 raw actions, and whether it is static."""

    frame_indices: np.ndarray  # (13,) int
    actions: np.ndarray  # (13, A) float32, raw units
    static: bool


def clip_spec(actions: np.ndarray, t: int, chunk: int, static: bool = False) -> ClipSpec:
    """The clip whose newest context frame is ``t`` in an episode with per-frame ``actions`` (T, A)."""
    action_dim = actions.shape[1]
    if static:
        indices = np.full(CONTEXT + chunk, t)
        return ClipSpec(indices, np.zeros((CONTEXT + chunk, action_dim), np.float32), True)
    context = np.clip(np.arange(t - 4, t + 1), 0, None)
    indices = np.concatenate([context, np.arange(t + 1, t + 1 + chunk)])
    clip_actions = np.zeros((CONTEXT + chunk, action_dim), np.float32)
    for slot in range(1, CONTEXT + chunk):
        if indices[slot] == indices[slot - 1] + 1:
            clip_actions[slot] = actions[indices[slot] - 1]
    return ClipSpec(indices, clip_actions, False)


def episode_clips(
    actions: np.ndarray, chunk: int, stride: int, rng: np.random.Generator, static_fraction: float = STATIC_FRACTION
) -> list[ClipSpec]:
    """Clips every ``stride`` frames of one episode (T frames, actions (T, A)), plus static ones."""
    num_frames = len(actions)
    starts = list(range(0, num_frames - chunk, stride))
    clips = [clip_spec(actions, t, chunk) for t in starts]
    num_static = int(rng.binomial(len(clips), static_fraction / max(1e-9, 1 - static_fraction))) if clips else 0
    for t in rng.integers(0, num_frames, size=num_static):
        clips.append(clip_spec(actions, int(t), chunk, static=True))
    return clips


def outcome_clips(specs: list[ClipSpec], success: np.ndarray | None, chunk: int, lead_chunks: int = OUTCOME_LEAD_CHUNKS) -> np.ndarray:
    """Per clip of one episode (``success``: its (T,) per-frame flags after each action, None: unlabelled), whether
    one of its future frames lies in ``[onset - lead_chunks * chunk, onset + chunk)`` around the first success's frame
    ``onset``; static clips never are, and neither is any clip of an episode that never succeeds."""
    flags = np.zeros(len(specs), dtype=bool)
    if success is None or not np.asarray(success).any():
        return flags
    onset = int(np.argmax(np.asarray(success))) + 1  # frame i follows action i - 1: the first frame that shows the success
    low, high = onset - lead_chunks * chunk, onset + chunk
    for i, spec in enumerate(specs):
        future = spec.frame_indices[CONTEXT:]
        flags[i] = not spec.static and bool(((future >= low) & (future < high)).any())
    return flags


def predecessors(specs: list[ClipSpec], chunk: int) -> np.ndarray:
    """Per clip of one episode, the index of the clip one chunk earlier, whose last 4 future frames
    are this clip's memory frames (self-forcing generates them), or -1: a first chunk, a static clip,
    or a clip stride that does not divide the chunk."""
    newest = {int(s.frame_indices[CONTEXT - 1]): i for i, s in enumerate(specs) if not s.static}
    return np.array([-1 if s.static else newest.get(int(s.frame_indices[CONTEXT - 1]) - chunk, -1) for s in specs], dtype=np.int64)


@torch.no_grad()
def encode_clips(
    vae, episodes: Sequence[EpisodeLike], config: WorldModelConfig, device: torch.device, seed: int = 0, batch: int = 32, progress_bar: bool = True
) -> dict[str, torch.Tensor]:
    """Every training clip as latents ``(M, C, 4, h, w)`` [slot 0, memory, future, future] with its
    13 raw actions ``(M, 13, A)``, the index of the clip one chunk earlier ``(M,)`` (-1: none; see
    :func:`predecessors`) and whether it is an outcome clip ``(M,)`` (:func:`outcome_clips`); ``progress_bar``: a
    progress bar over the episodes."""
    rng = np.random.default_rng(seed)
    latents, actions, previous, outcome, count = [], [], [], [], 0
    for episode in progress(episodes, desc="encode clips", leave=False, disable=not progress_bar):
        frames = episode_frames(episode)
        specs = episode_clips(episode_actions(episode), config.chunk_size, config.clip_stride, rng)
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
        outcome.append(torch.as_tensor(outcome_clips(specs, getattr(episode, "success", None), config.chunk_size)))
        local = predecessors(specs, config.chunk_size)
        previous.append(torch.as_tensor(np.where(local >= 0, local + count, -1)))
        count += len(specs)
    if not latents:
        raise ValueError(f"no episode is long enough for a clip of {CONTEXT + config.chunk_size} frames")
    return {"latents": torch.cat(latents), "actions": torch.cat(actions), "previous": torch.cat(previous), "outcome": torch.cat(outcome)}

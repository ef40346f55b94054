"""The DiT's training loss, rectified flow: ``x_sigma = (1 - sigma) x0 + sigma eps``, the DiT predicts the velocity
``eps - x0`` of the 2 future latents given the clean (or lightly noised: context-noise augmentation) context latents
and the 13 actions. ``train-wm`` (:mod:`worldloop.worldmodel.train_dit`) trains with it, and so does the world
model's refinement on new episodes (:meth:`worldloop.worldmodel.rollout.WorldModel.refine_step`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from worldloop.utils.device import autocast
from worldloop.worldmodel.configuration import WorldModelConfig

CONTEXT_NOISE = 0.3
"""Largest noise level sigma (0-1) put on the memory latent in training: the model learns to trust its context less, and
a rollout can tell it how noisy its memory is (world_model.memory_noise)."""


def shift_sigmas(sigmas: torch.Tensor, shift: float) -> torch.Tensor:
    """Flow-matching time shift (SD3 / Wan): more of the steps at high noise for shift > 1."""
    return shift * sigmas / (1 + (shift - 1) * sigmas)


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

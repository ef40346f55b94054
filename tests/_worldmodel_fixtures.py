"""Synthetic episodes for world-model tests: a bright square that the actions move."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class SyntheticEpisode:
    frames: np.ndarray  # (T, H, W, 3) uint8: the observation before action t
    actions: np.ndarray  # (T, A) float32


def square_episode(rng: np.random.Generator, length: int = 24, size: int = 32, action_dim: int = 2, side: int = 8) -> SyntheticEpisode:
    """A square whose position moves by 2 pixels per unit action along x and y (walls clamp it)."""
    position = rng.integers(side, size - 2 * side, size=2).astype(float)
    frames, actions = [], []
    for _ in range(length):
        frame = np.full((size, size, 3), 30, np.uint8)
        y, x = int(position[0]), int(position[1])
        frame[y : y + side, x : x + side] = (230, 200, 40)
        frames.append(frame)
        action = rng.choice([-1.0, 1.0], size=action_dim).astype(np.float32)
        actions.append(action)
        position = np.clip(position + 2 * action[:2], 0, size - side)
    return SyntheticEpisode(np.stack(frames), np.stack(actions))


def square_episodes(count: int, seed: int = 0, **kwargs) -> list[SyntheticEpisode]:
    rng = np.random.default_rng(seed)
    return [square_episode(rng, **kwargs) for _ in range(count)]


def tiny_vae():
    """A random (untrained) tiny VAE is a fixed deterministic encoder; its latent statistics are measured
    on square episodes."""
    import torch

    from worldloop.worldmodel import vae as vae_lib
    from worldloop.worldmodel.configuration import VAEConfig
    from worldloop.worldmodel.train_vae import latent_statistics

    torch.manual_seed(0)
    model = vae_lib.build_vae(VAEConfig()).eval()
    mean, std = latent_statistics(model, square_episodes(4, seed=9), torch.device("cpu"), clips=8)
    model.register_to_config(latents_mean=mean, latents_std=std)
    return model

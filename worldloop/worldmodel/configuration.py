"""Configuration of the world model: the video VAE and the action-conditioned DiT."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class VAEConfig:
    """The video VAE (filled in by the world-model issue)."""


@dataclass
class WorldModelConfig:
    """The action-conditioned DiT (filled in by the world-model issue)."""

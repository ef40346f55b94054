"""Configuration of reinforcement learning in imagination."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RLConfig:
    """RL (filled in by the RL issue)."""

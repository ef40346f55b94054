"""Configuration of the success judges."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RewardConfig:
    """Success judges (filled in by the rewards issue)."""

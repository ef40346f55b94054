"""Configuration of the policy, its supervised fine-tuning and its evaluation."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PolicyConfig:
    """The compact VLA policy (filled in by the policy issue)."""


@dataclass
class SFTConfig:
    """Supervised fine-tuning (filled in by the policy issue)."""


@dataclass
class EvalConfig:
    """Real-simulator evaluation (filled in by the policy issue)."""

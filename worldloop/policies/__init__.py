"""Policies: the Policy protocol, the action tokenizer, the compact VLA, SFT and evaluation.

Importing this package is light; :func:`load_policy` imports the model code.
"""

from __future__ import annotations

from pathlib import Path

EXPERT = "expert"
"""``load_policy("expert")`` returns this marker: evaluation and collection then use the scripted experts."""


def load_policy(path: str | Path, device="cpu"):
    """A policy from a model folder (``config.json`` says its kind), or :data:`EXPERT` for ``"expert"``."""
    if str(path) == EXPERT:
        return EXPERT
    from worldloop.policies.modeling_vla import KIND, CompactVLA
    from worldloop.utils.device import resolve_device
    from worldloop.utils.pretrained import read_model_config

    kind = read_model_config(path).get("kind")
    if kind == KIND:
        return CompactVLA.from_pretrained(path, resolve_device(str(device)) if isinstance(device, str) else device)
    raise ValueError(f"{Path(path) / 'config.json'} holds a '{kind}' model; load_policy knows: {KIND}")

"""Policies: the Policy protocol, the action tokenizer, the compact VLA and SFT (evaluation: worldloop.rl.evaluate).

Importing this package is light; :func:`load_policy` imports the model code.
"""

from __future__ import annotations

from pathlib import Path

EXPERT = "expert"
"""``load_policy("expert")`` returns this marker: evaluation and collection then use the scripted experts."""


def load_policy(path: str | Path, device="cpu"):
    """A policy from a model folder, or :data:`EXPERT` for ``"expert"``. The folder's config.json names its
    ``kind``: a policy registered in :data:`worldloop.utils.registry.POLICIES` or a ``"package.module:Class"``."""
    if str(path) == EXPERT:
        return EXPERT
    from worldloop.utils.device import resolve_device
    from worldloop.utils.pretrained import read_model_config
    from worldloop.utils.registry import POLICIES

    kind = read_model_config(path).get("kind")
    if kind is None:
        raise ValueError(f"{Path(path) / 'config.json'} names no 'kind': cannot tell which policy it holds")
    return POLICIES.get(kind).from_pretrained(path, resolve_device(str(device)) if isinstance(device, str) else device)

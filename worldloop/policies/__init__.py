"""Policies: the Policy protocol, the action tokenizer, the compact VLA and SFT (evaluation: worldloop.rl.evaluate).

Importing this package is light; :func:`load_policy` imports the model code.
"""

from __future__ import annotations

from pathlib import Path

EXPERT = "expert"
"""``load_policy("expert")`` returns this marker: evaluation and collection then use the scripted experts."""


KIND_OF_MODEL_TYPE = {"openvla": "openvla-oft"}
"""A folder whose config.json has no ``kind`` but one of these ``model_type``s (a published checkpoint) is that policy."""


def load_policy(path: str | Path, device="cpu"):
    """A policy from a model folder, ``KIND:FOLDER`` (a registered policy kind, e.g. ``openvla-oft:DIR``), or
    :data:`EXPERT` for ``"expert"``. A plain folder's config.json names its ``kind`` (a policy registered in
    :data:`worldloop.utils.registry.POLICIES` or a ``"package.module:Class"``), or a known ``model_type``."""
    if str(path) == EXPERT:
        return EXPERT
    from worldloop.utils.device import resolve_device
    from worldloop.utils.pretrained import read_model_config
    from worldloop.utils.registry import POLICIES

    device = resolve_device(str(device)) if isinstance(device, str) else device
    kind, _, folder = str(path).partition(":")
    if folder and kind in POLICIES and not Path(path).exists():
        return POLICIES.get(kind).from_pretrained(folder, device)
    config = read_model_config(path)
    kind = config.get("kind") or KIND_OF_MODEL_TYPE.get(config.get("model_type"))
    if kind is None:
        raise ValueError(f"{Path(path) / 'config.json'} names no 'kind': cannot tell which policy it holds")
    return POLICIES.get(kind).from_pretrained(path, device)

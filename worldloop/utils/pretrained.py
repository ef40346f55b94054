"""Model folders: ``config.json`` + ``model.safetensors``, written atomically, no pickle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from worldloop.utils.checkpoint import _untie, read_finite_weights
from worldloop.utils.io import atomic_dir, atomic_write_json, read_json

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


def save_model_folder(folder: str | Path, config: dict[str, Any], module: torch.nn.Module, files: dict[str, Any] | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (+ extra JSON ``files``) as one atomic folder."""
    folder = Path(folder)
    with atomic_dir(folder) as tmp:
        atomic_write_json(tmp / CONFIG_NAME, config)
        tensors = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
        save_file(_untie(tensors), tmp / WEIGHTS_NAME)
        for name, content in (files or {}).items():
            atomic_write_json(tmp / name, content)
    return folder


def read_model_config(folder: str | Path, kind: str | None = None) -> dict[str, Any]:
    """Read ``folder/config.json``; with ``kind``, check its ``"kind"`` entry matches."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder {folder} does not exist")
    config = read_json(folder / CONFIG_NAME)
    if kind is not None and config.get("kind") != kind:
        raise ValueError(f"{folder} holds a '{config.get('kind')}' model, not a '{kind}'")
    return config


def load_weights(folder: str | Path, module: torch.nn.Module) -> None:
    """Load ``model.safetensors`` into ``module``, naming missing, mismatched or non-finite tensors."""
    file = Path(folder) / WEIGHTS_NAME
    if not file.is_file():
        raise FileNotFoundError(f"{file} is missing: the model folder has no weights")
    state = read_finite_weights(file)
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(k for k in set(expected) & set(state) if expected[k].shape != state[k].shape)
    if missing or unexpected or wrong:
        detail = "; ".join(
            part
            for part in (
                f"missing {missing[:5]}" if missing else "",
                f"unexpected {unexpected[:5]}" if unexpected else "",
                f"shape mismatch {[(k, tuple(state[k].shape), tuple(expected[k].shape)) for k in wrong[:5]]}" if wrong else "",
            )
            if part
        )
        raise ValueError(f"{file} does not match the model built from its config.json: {detail}")
    module.load_state_dict(state)

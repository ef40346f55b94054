"""Success judges: the Judge protocol, the trained classifier, TOPReward, calibration.

Importing this package is light; :func:`load_judge` imports the judge's code.
"""

from __future__ import annotations

from pathlib import Path

import torch

from worldloop.rewards.configuration import RewardConfig
from worldloop.utils.registry import JUDGES

RUN_MODEL_FOLDER = "model"
"""A ``train-reward`` run folder keeps its judge here."""


def load_judge(spec: str | Path, device: torch.device | str = "cpu", config: RewardConfig | None = None):
    """A judge from ``spec``: a judge folder (its config.json's ``kind`` names the class in
    :data:`~worldloop.utils.registry.JUDGES`; a ``train-reward`` run folder holds it in ``model/``), or
    ``"NAME:PATH"`` with NAME a registered judge (``"topreward:/models/Qwen3-VL-8B-Instruct"``), or
    ``"package.module:Class=PATH"``. The class's ``from_pretrained(PATH, device, config)`` loads it; ``config``
    (the run's RewardConfig) sets TOPReward's threshold, window and batching, a classifier keeps what it was saved with."""
    from worldloop.utils.pretrained import read_model_config

    device, spec, config = torch.device(device), str(spec), config or RewardConfig()
    name, separator, path = spec.partition("=") if "=" in spec else spec.partition(":")
    if separator and (name in JUDGES or ":" in name):
        return JUDGES.get(name).from_pretrained(path, device, config)
    folder = Path(spec)
    if not (folder / "config.json").is_file() and (folder / RUN_MODEL_FOLDER / "config.json").is_file():
        folder = folder / RUN_MODEL_FOLDER
    if not folder.is_dir():
        raise FileNotFoundError(f"judge '{spec}' is neither a judge folder nor NAME:PATH with NAME one of {', '.join(JUDGES.names())}")
    kind = read_model_config(folder).get("kind")
    if kind is None:
        raise ValueError(f"{folder / 'config.json'} names no 'kind': cannot tell which judge it holds")
    return JUDGES.get(kind).from_pretrained(folder, device, config)

"""What more than one verb does the same way."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from worldloop.config import Config, parse_overrides

if TYPE_CHECKING:
    import torch

SAMPLING_OPTIONS = ("sampling_steps", "shift", "decode", "decoder", "memory_noise")


def load_world_model(folder: str | Path, config: Config, overrides: list[str], device: "torch.device") -> Any:
    """A trained world model for inference, sampling as saved with it: the options it was trained and
    evaluated with travel with the model. A ``world_model.<option>=`` given on the command line
    (``overrides``) replaces the saved value; a preset's value does not, since a preset cannot say whether
    it meant this model. Prints what it samples with and where each value came from."""
    from worldloop.utils.pretrained import read_model_config
    from worldloop.utils.registry import WORLD_MODELS

    given = parse_overrides(overrides).get("world_model", {})
    chosen = {name: getattr(config.world_model, name) for name in SAMPLING_OPTIONS if name in given}
    kind = read_model_config(folder).get("kind")
    if kind is None:
        raise ValueError(f"{Path(folder) / 'config.json'} names no 'kind': cannot tell which world model it holds")
    model = WORLD_MODELS.get(kind).from_pretrained(folder, device, **chosen)
    spec = getattr(model, "spec", {})  # a world model of the user's own may keep no sampling spec
    described = ", ".join(f"{name} {spec[name]}" + (" (command line)" if name in chosen else "") for name in SAMPLING_OPTIONS if name in spec)
    print(f"world model {folder} samples with {described}; unmarked values are those saved with it")
    return model

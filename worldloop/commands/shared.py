"""What more than one verb does the same way."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from worldloop.config import Config, parse_overrides

if TYPE_CHECKING:
    import torch

SAMPLING_OPTIONS = ("sampling_steps", "shift", "decode", "memory_noise", "action_guidance")


def load_world_model(folder: str | Path, config: Config, overrides: list[str], device: "torch.device") -> Any:
    """A trained world model for inference, sampling as saved with it: the options it was trained and
    evaluated with travel with the model. A ``world_model.<option>=`` given on the command line
    (``overrides``) replaces the saved value; a preset's value does not, since a preset cannot say whether
    it meant this model. Prints what it samples with and where each value came from."""
    from worldloop.worldmodel.rollout import WorldModel

    given = parse_overrides(overrides).get("world_model", {})
    chosen = {name: getattr(config.world_model, name) for name in SAMPLING_OPTIONS if name in given}
    model = WorldModel.from_pretrained(folder, device, **chosen)
    described = ", ".join(f"{name} {model.spec[name]}" + (" (command line)" if name in chosen else "") for name in SAMPLING_OPTIONS)
    print(f"world model {folder} samples with {described}; unmarked values are those saved with it")
    return model

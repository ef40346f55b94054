"""What plugs in by name: policies, judges, simulators and world models.

Each registry maps a name to a class. The built-in entries are ``"package.module:Class"`` strings, imported
on first use, so that importing a registry stays light and no lower layer imports the models. A user's own
class plugs in two ways:

    from worldloop.utils.registry import POLICIES

    @POLICIES.register("my_vla")            # then a model folder whose config.json says "kind": "my_vla"
    class MyVLA: ...

or without registering, by its import path wherever a name is asked for: ``"my_package.policy:MyVLA"``
(a folder's ``kind``, ``sim.backend``, or the judge spec ``my_package.judge:MyJudge=PATH``).

What each kind of class must offer:

- policy: ``from_pretrained(folder, device)`` returning an object with the Policy protocol
  (:mod:`worldloop.policies.protocol`);
- judge: ``from_pretrained(path, device, config)`` with ``config`` the run's ``RewardConfig``, returning a
  Judge (:mod:`worldloop.rewards.protocol`);
- simulator: ``Class(sim_config, num_envs, tasks=None)``, a VecEnv (:mod:`worldloop.envs.protocol`);
- world model: ``from_pretrained(folder, device, **sampling)`` returning a world model
  (:class:`worldloop.worldmodel.protocol.WorldModelLike`: what the imagined environment steps and, where RL refines it,
  rl.refine.every > 0, what the refinement trains through its ``refine_*`` methods).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


class Registry:
    """Names -> classes of one kind; a name may also be a ``"package.module:Class"`` path."""

    def __init__(self, what: str, builtin: dict[str, str]):
        self.what = what
        self._entries: dict[str, Any] = dict(builtin)

    def register(self, name: str) -> Callable[[Any], Any]:
        """Class decorator: ``@REGISTRY.register("name")``. A name is registered once."""

        def add(cls: Any) -> Any:
            known = self._entries.get(name)
            if known is not None and known is not cls:
                raise ValueError(f"a {self.what} named '{name}' is already registered ({describe(known)})")
            self._entries[name] = cls
            return cls

        return add

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def get(self, name: str) -> Any:
        """The class registered as ``name``, or the one at the import path ``"package.module:Class"``."""
        entry = self._entries.get(name, name if ":" in str(name) else None)
        if entry is None:
            raise ValueError(f"unknown {self.what} '{name}'; registered: {', '.join(self.names())}; or give 'package.module:Class'")
        if isinstance(entry, str):
            entry = import_path(entry, self.what)
            if name in self._entries:
                self._entries[name] = entry
        return entry


def import_path(path: str, what: str = "class") -> Any:
    """``"package.module:Attribute"`` -> the attribute, with a one-line error naming the path."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{what} '{path}' is not of the form 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"{what} '{path}': cannot import {module_name} ({error})") from error
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"{what} '{path}': {module_name} has no '{attribute}'") from None


def describe(entry: Any) -> str:
    return entry if isinstance(entry, str) else f"{entry.__module__}:{entry.__qualname__}"


POLICIES = Registry(
    "policy", {"compact_vla": "worldloop.policies.compact_vla.modeling:CompactVLA", "openvla-oft": "worldloop.policies.openvla_oft.modeling:OpenVLAOFT"}
)
"""Policies by the ``kind`` in their folder's config.json."""
JUDGES = Registry(
    "judge",
    {"success_classifier": "worldloop.rewards.classifier:SuccessClassifier", "topreward": "worldloop.rewards.topreward:TOPReward"},
)
"""Success judges by the ``kind`` in their folder's config.json, or by the name before ``=`` in a judge spec."""
SIMULATORS = Registry("simulator", {"metaworld": "worldloop.sims.metaworld:MetaWorldVecEnv", "libero": "worldloop.sims.libero:LiberoVecEnv"})
"""Real simulators by ``sim.backend``."""
WORLD_MODELS = Registry("world model", {"world_model": "worldloop.worldmodel.rollout:WorldModel"})
"""World models by the ``kind`` in their folder's config.json."""

"""Real simulators behind the :class:`worldloop.envs.protocol.VecEnv` interface.

Importing this package is light; :func:`make_env` imports the configured backend.
"""

from __future__ import annotations

from typing import Sequence


def make_env(config, num_envs: int, tasks: Sequence[str] | None = None, render: bool = True):
    """The configured real simulator with ``num_envs`` environments: ``config.sim.backend`` names a class in
    :data:`worldloop.utils.registry.SIMULATORS` or is a ``"package.module:Class"``.

    ``config`` is the root :class:`worldloop.config.Config` (or a ``SimConfig``); ``tasks``
    overrides ``sim.tasks``/``sim.suite``; ``render=False`` steps the physics only (black frames, for the scripted experts).
    """
    from worldloop.utils.registry import SIMULATORS

    sim_config = getattr(config, "sim", config)
    simulator = SIMULATORS.get(sim_config.backend)
    return simulator(sim_config, num_envs, tasks=tasks) if render else simulator(sim_config, num_envs, tasks=tasks, render=False)

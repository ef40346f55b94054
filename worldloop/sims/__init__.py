"""Real simulators behind the :class:`worldloop.envs.protocol.VecEnv` interface.

Importing this package is light; :func:`make_env` imports the configured backend.
"""

from __future__ import annotations

from typing import Sequence


def make_env(config, num_envs: int, tasks: Sequence[str] | None = None):
    """The configured real simulator (``config.sim.backend``) with ``num_envs`` environments.

    ``config`` is the root :class:`worldloop.config.Config` (or a ``SimConfig``); ``tasks``
    overrides ``sim.tasks``/``sim.suite``.
    """
    sim_config = getattr(config, "sim", config)
    if sim_config.backend == "metaworld":
        from worldloop.sims.metaworld import MetaWorldVecEnv

        return MetaWorldVecEnv(sim_config, num_envs, tasks=tasks)
    raise ValueError(f"unknown simulator backend '{sim_config.backend}'; allowed: metaworld")

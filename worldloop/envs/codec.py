"""A real environment observed through a world model's VAE.

Every frame the imagined environment shows a policy has been encoded and decoded by the world model's VAE;
the simulator's frames have not. Wrapped in :class:`CodecObservations`, the simulator's frames pass through
the same VAE before anyone sees them, so a policy meets the same loss of detail in both worlds (in the
2026-12-03 vae-changes-first-choices run that loss alone changed 0.32 of the policy's first action tokens). The simulator's
own success and time limit are untouched: what is measured is still the real task.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch

from worldloop.envs.protocol import EnvReset, EnvStep, VecEnv
from worldloop.worldmodel.vae import reconstruct


class CodecObservations:
    """Any :class:`VecEnv` whose frames (from ``reset`` and ``step``) come back encoded and decoded by ``vae``,
    each on its own as a one-frame clip, in batches of ``batch_size`` on the VAE's device."""

    def __init__(self, env: VecEnv, vae: Any, batch_size: int = 256):
        self.env, self.vae, self.batch_size = env, vae, batch_size

    def reset(self, task_ids: Sequence[int | str], seeds: Sequence[int]) -> EnvReset:
        first = self.env.reset(task_ids, seeds)
        return dataclasses.replace(first, frames=reconstruct(self.vae, first.frames, self.batch_size))

    def step(self, actions: torch.Tensor) -> EnvStep:
        step = self.env.step(actions)
        return dataclasses.replace(step, frames=reconstruct(self.vae, step.frames, self.batch_size))

    def __getattr__(self, name: str) -> Any:  # num_envs, chunk_size, max_steps, elapsed_steps, close, ...
        return getattr(self.env, name)

"""Running a policy in any :class:`~worldloop.envs.protocol.VecEnv`: the rollout buffer of one batch of episodes and
the loop that fills it, what RL's algorithm and its world-model refinement need. Replays of its actions and how far
imagination tracks reality are the diagnostics' (:mod:`worldloop.diagnostics.tracking`)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import torch

from worldloop.envs.protocol import EnvReset, VecEnv
from worldloop.utils.device import autocast_dtype


@dataclass
class Rollout:
    """One batch of N episodes, T chunks each (T = the chunks until every episode had ended)."""

    images: torch.Tensor
    """(N, T, H, W, 3) uint8: the observation each chunk was chosen from."""
    instructions: list[str]
    """N instructions."""
    tokens: torch.Tensor
    """(N, T, K, A) int64 sampled action tokens."""
    log_probs: torch.Tensor
    """(N, T, K, A) their log-probabilities at the sampling temperature (the 'old' policy)."""
    rewards: torch.Tensor
    """(N, T) the environment's chunk rewards."""
    done: torch.Tensor
    """(N, T) bool: the episode had ended by the end of chunk t."""
    terminated: torch.Tensor
    """(N, T) bool: succeeded, or ended other than by the time limit, by the end of chunk t (no bootstrap past it)."""
    success: torch.Tensor
    """(N, T) bool: the success signal fired in chunk t."""
    elapsed: torch.Tensor
    """(N,) int64 actions executed per episode."""
    values: torch.Tensor | None = None
    """(N, T) value estimates (policies with a value head)."""
    last_values: torch.Tensor | None = None
    """(N,) value of the observation after the last chunk."""
    actions: torch.Tensor | None = None
    """(N, T, K, A) the action chunks sent to the environment (what a world model replays)."""
    frames: torch.Tensor | None = None
    """(N, T * K, H, W, 3) uint8 on the CPU: the observation after every action (``collect(keep_frames=True)``:
    what a world model trains on)."""

    @property
    def success_once(self) -> torch.Tensor:
        """(N,) bool: the episode succeeded at some step."""
        return self.success.any(dim=1)


def policy_device(policy: Any) -> torch.device:
    device = getattr(policy, "device", None)
    if isinstance(device, torch.device):
        return device
    return next(policy.parameters()).device


def autocast(device: torch.device):
    dtype = autocast_dtype(device)
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def check_compatible(policy: Any, env: VecEnv, where: str = "environment") -> None:
    """A clear error when the policy cannot act in ``env`` (action dimension, chunk size, resolution)."""
    for name in ("action_dim", "chunk_size", "image_size"):
        mine, theirs = int(getattr(policy, name)), int(getattr(env, name))
        if mine != theirs:
            raise ValueError(f"the policy has {name}={mine} but the {where} has {name}={theirs}: use a policy trained for this {where}")


@torch.no_grad()
def collect(policy: Any, env: VecEnv, first: EnvReset, temperature: float = 1.0, greedy: bool = False, keep_frames: bool = False) -> Rollout:
    """Run every episode of ``env`` (already reset to ``first``) until all have ended or the time
    limit, the policy sampling at ``temperature`` (or greedy); everything is kept on the policy's device,
    but for the frame after every action, kept on the CPU with ``keep_frames``."""
    device = policy_device(policy)
    num_chunks = math.ceil(env.max_steps / env.chunk_size)
    instructions = list(first.instructions)
    observation = first.frames
    images, actions, tokens, log_probs, values, rewards, done, truncated, success, frames = ([] for _ in range(10))
    for _ in range(num_chunks):
        with autocast(device):
            out = policy.act(observation, instructions, temperature=temperature, greedy=greedy)
        chunk = out.actions.float()
        step = env.step(chunk.to(env.device))
        images.append(observation.to(device))
        actions.append(chunk.to(device))
        tokens.append(out.tokens.to(device))
        log_probs.append(out.log_probs.float().to(device))
        if out.values is not None:
            values.append(out.values.float().to(device))
        rewards.append(step.reward.float().to(device))
        done.append(step.done[:, -1].to(device))
        truncated.append(step.truncated.to(device))
        success.append(step.success.any(dim=1).to(device))
        if keep_frames:
            frames.append(step.frames.cpu())
        observation = step.frames[:, -1]
        if bool(step.done[:, -1].all()):
            break
    last_values = None
    if values:
        with autocast(device):
            last_values = policy.act(observation, instructions, temperature=temperature).values.float().to(device)
    done_t, success_t = torch.stack(done, dim=1), torch.stack(success, dim=1)
    truncated_so_far = torch.stack(truncated, dim=1).cummax(dim=1).values
    succeeded_so_far = success_t.cummax(dim=1).values
    return Rollout(
        images=torch.stack(images, dim=1),
        instructions=instructions,
        tokens=torch.stack(tokens, dim=1),
        log_probs=torch.stack(log_probs, dim=1),
        rewards=torch.stack(rewards, dim=1),
        done=done_t,
        terminated=(done_t & ~truncated_so_far) | succeeded_so_far,
        success=success_t,
        elapsed=env.elapsed_steps.to(device),
        values=torch.stack(values, dim=1) if values else None,
        last_values=last_values,
        actions=torch.stack(actions, dim=1),
        frames=torch.cat(frames, dim=1) if keep_frames else None,
    )


def apply_calibration(judge: Any, result: dict[str, Any]) -> None:
    """The judge's thresholds as a saved calibration (:meth:`RealityCheck.recalibrate_judge`'s result) chose them."""
    judge.threshold = float(result["threshold"])
    judge.task_thresholds = {text: float(threshold) for text, threshold in result.get("instruction_thresholds", {}).items()}



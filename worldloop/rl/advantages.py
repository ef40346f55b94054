"""From a batch of chunked rollouts to per-chunk advantages and loss weights.

All tensors are indexed (N, T): N trajectories (env i of the batch), T chunks (one policy step =
one action chunk). ``done[i, t]`` is True from the chunk in which episode i ended on (the trainer
passes the environment's done or success, so the first success closes the valid part even when a
simulator holds the episode on for a few steps after it). GRPO groups are consecutive: trajectories
``g*G ... g*G + G-1`` started from the same initial state.
"""

from __future__ import annotations

import torch

EPS = 1e-6
"""Added to the group's standard deviation in the GRPO advantage."""


def first_done_index(done: torch.Tensor) -> torch.Tensor:
    """(N, T) bool -> (N,) int64: the chunk in which each episode ended; T - 1 when it never did
    (the rollout's last chunk closes it)."""
    num_chunks = done.shape[1]
    index = torch.arange(num_chunks, device=done.device).expand_as(done)
    return torch.where(done, index, num_chunks - 1).min(dim=1).values


def loss_mask(done: torch.Tensor, mask_after_success: bool = True) -> torch.Tensor:
    """(N, T) bool: chunks up to and including the first done; everything after is masked.
    With ``mask_after_success=False`` (WoVR's ablation, rl.mask_after_success) every collected chunk counts."""
    if not mask_after_success:
        return torch.ones_like(done, dtype=torch.bool)
    index = torch.arange(done.shape[1], device=done.device)
    return index[None, :] <= first_done_index(done)[:, None]


def trajectory_scores(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """S_i = sum of the chunk rewards over the trajectory's valid chunks: (N, T) -> (N,)."""
    return (rewards * mask).sum(dim=1)


def grpo_advantages(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """A_i = (S_i - mean_g S) / (std_g S + 1e-6) within each group of ``group_size`` consecutive
    trajectories; std is the unbiased sample standard deviation (torch's default). (N,) -> (N,)."""
    groups = _grouped(scores, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True)
    return ((groups - mean) / (std + EPS)).reshape(-1)


def shuffled_within_groups(scores: torch.Tensor, group_size: int, generator: torch.Generator) -> torch.Tensor:
    """rl.diagnostics.shuffled_scores: each group's scores in a random order of its own (a uniform permutation per
    group, drawn from ``generator`` on the CPU). Every group keeps its scores, so its mean, spread and whether it
    is informative; each trajectory gets a score another member earned. (N,) -> (N,)."""
    groups = _grouped(scores, group_size)
    order = torch.rand(groups.shape, generator=generator).argsort(dim=1).to(scores.device)
    return groups.gather(1, order).reshape(-1)


def informative_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N,) bool per trajectory: its group's scores are not all equal (not all-fail, not all-success)."""
    groups = _grouped(scores, group_size)
    spread = groups.max(dim=1).values - groups.min(dim=1).values
    return (spread > EPS).repeat_interleave(group_size)


def sample_weights(mask: torch.Tensor, keep: torch.Tensor, length_normalise: bool = True) -> torch.Tensor:
    """(N, T) loss weight of every chunk, summing to 1 over the batch (all zero when nothing is kept).

    Length-normalised: a kept trajectory's chunks each weigh 1 / (L_i * n_kept), L_i its valid
    length, so its loss is divided by its own length (L_max / L_i times a plain mean over the
    longest) and short KIR rollouts count as much as long drifting ones. Otherwise: one weight per
    valid chunk, 1 / (valid chunks in the batch), a plain token-level mean."""
    valid = (mask & keep[:, None]).float()
    if valid.sum() == 0:
        return valid
    if not length_normalise:
        return valid / valid.sum()
    lengths = valid.sum(dim=1, keepdim=True).clamp(min=1.0)
    num_kept = (valid.sum(dim=1) > 0).sum()
    return valid / lengths / num_kept


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    last_values: torch.Tensor,
    gamma: float = 0.99,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over chunks, each episode over its own chunks only.

    rewards, values: (N, T); done: (N, T) bool, True from the chunk in which the episode ended (by
    success or by its time limit); terminated: (N, T) bool, True from the chunk that ended it by success
    (no bootstrap past it); last_values: (N,) V of the observation after the last chunk. An episode that
    ends at chunk k < T - 1 without terminating bootstraps from values[:, k + 1] (V of the observation
    after chunk k) and takes no delta from after k; its advantages after k are 0. Returns (advantages, returns)."""
    num_chunks = rewards.shape[1]
    index = torch.arange(num_chunks, device=rewards.device)
    end = first_done_index(done | terminated)  # (N,)
    last_chunk = (index[None, :] == end[:, None]).float()
    valid = (index[None, :] <= end[:, None]).float()
    next_values = torch.cat([values[:, 1:], last_values[:, None]], dim=1)
    not_terminal = (~terminated).float()
    delta = rewards + gamma * next_values * not_terminal - values
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(last_values)
    for t in reversed(range(num_chunks)):
        running = delta[:, t] + gamma * lam * (1.0 - last_chunk[:, t]) * running
        advantages[:, t] = running
    advantages = advantages * valid
    return advantages, advantages + values


def explained_variance(values: torch.Tensor, returns: torch.Tensor, weights: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the chunks with weight > 0 (nan when Var = 0)."""
    keep = weights > 0
    if keep.sum() < 2:
        return float("nan")
    target, predicted = returns[keep], values[keep]
    variance = target.var()
    return float("nan") if variance == 0 else float(1.0 - (target - predicted).var() / variance)


def _grouped(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    if scores.ndim != 1 or scores.shape[0] % group_size != 0:
        raise ValueError(f"scores of shape {tuple(scores.shape)} cannot be split into groups of {group_size}")
    return scores.reshape(-1, group_size)

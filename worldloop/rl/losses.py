"""The RL losses, token-level, each a weighted sum over chunks.

A batch holds B chunks (samples). Per chunk: log-probs of its K x A action tokens, one advantage,
one weight (from :func:`worldloop.rl.advantages.sample_weights`, renormalised to sum to 1 over the
batch). A chunk's loss is the mean over its tokens; the batch loss is the weighted sum.
"""

from __future__ import annotations

import torch


def clipped_policy_loss(
    new_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate per token with an asymmetric clip [1 - clip_low, 1 + clip_high].

    new/old_log_probs: (B, K, A); advantages, weights: (B,). Returns the loss and, without
    gradient, ``approx_kl`` (k3 estimate of KL(old || new)) and ``clip_fraction`` (tokens whose
    ratio left the clip range), both weighted like the loss."""
    log_ratio = new_log_probs - old_log_probs
    ratio = log_ratio.exp()
    advantage = advantages[:, None, None]
    unclipped = -advantage * ratio
    clipped = -advantage * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = weighted_token_mean(torch.maximum(unclipped, clipped), weights)
    with torch.no_grad():
        approx_kl = weighted_token_mean((ratio - 1.0) - log_ratio, weights)
        outside = ((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)).float()
        clip_fraction = weighted_token_mean(outside, weights)
    return loss, {"approx_kl": approx_kl, "clip_fraction": clip_fraction}


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, weights: torch.Tensor, clip: float = 0.2
) -> torch.Tensor:
    """0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2), weighted over chunks (B,)."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    per_chunk = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return (per_chunk * weights).sum()


def entropy_bonus(entropy: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted mean token entropy (B, K, A) -> scalar (subtracted from the loss times its coefficient)."""
    return weighted_token_mean(entropy, weights)


def kl_penalty(new_log_probs: torch.Tensor, reference_log_probs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(new || reference) per token: exp(ref - new) - (ref - new) - 1, weighted."""
    delta = reference_log_probs - new_log_probs
    return weighted_token_mean(delta.exp() - delta - 1.0, weights)


def weighted_token_mean(per_token: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(B, K, A) -> mean over each chunk's tokens, then the weighted sum over the B chunks."""
    return (per_token.flatten(1).mean(dim=1) * weights).sum()

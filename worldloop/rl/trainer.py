"""Masked GRPO (WoVR) and PPO for a VLA policy in any vectorised, chunked environment.

One iteration, top to bottom (:func:`train`):

1. collect: G rollouts per initial state (groups share a task and a seed), sampling at the
   training temperature; the old log-probs are those of the sampled tokens at that temperature;
2. scores: S = sum of chunk rewards up to and including the first done; loss mask = those chunks;
3. advantages: GRPO (S - mean_g) / (std_g + 1e-6), groups without signal dropped; or PPO's GAE;
4. loss: token-level clipped ratio (asymmetric clip), each trajectory's loss divided by its
   valid length, optional entropy bonus, optional KL to the starting policy, PPO's clipped value loss;
5. update: several epochs of shuffled minibatches of valid chunks (fewer when groups were dropped, so each
   holds as many trajectories as a full batch's), gradient clipping, AdamW whose
   learning rate warms up linearly over the first ``LR_WARMUP_STEPS`` optimizer steps;
6. every ``rl.refine.every`` iterations, when a refiner is given (:mod:`worldloop.rl.refine`), the world model
   learns from the policy's own real rollouts (under torchrun on rank 0, whose refined weights every rank then takes);
7. the monitor, when given, watches: reality checks, warnings, stop rules and the time budget
   (:class:`worldloop.diagnostics.monitor.RunMonitor`; this module does not import it); atomic checkpoints
   that resume exactly (the bookkeeping: :class:`worldloop.rl.run.RLRun`).

The environment is anything with the :class:`~worldloop.envs.protocol.VecEnv` protocol: the
imagined environment (RL in the world model), the real simulator (the GRPO-in-reality baseline)
or the toy world of the tests.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from worldloop.envs.protocol import VecEnv
from worldloop.rl.advantages import (
    explained_variance,
    gae,
    grpo_advantages,
    informative_groups,
    loss_mask,
    sample_weights,
    shuffled_within_groups,
    trajectory_scores,
)
from worldloop.rl.configuration import RLConfig
from worldloop.rl.losses import clipped_policy_loss, clipped_value_loss, entropy_bonus, kl_penalty
from worldloop.rl.rollout import Rollout, autocast, check_compatible, collect, policy_device
from worldloop.rl.run import RLRun
from worldloop.utils import distributed

VALUE_CLIP = 0.2
"""PPO: clip range of the value update around the rollout's value estimate."""
VALUE_COEF = 0.5
"""PPO: weight of the value loss."""
LR_WARMUP_STEPS = 16
"""Optimizer steps over which the learning rate rises linearly to rl.lr (two iterations of the metaworld-gpu preset).
A fresh Adam's first steps move every weight by about lr whatever its gradient's noise (its second-moment estimate
is still one gradient): without warm-up, the H200 runs' first iteration took a 100M-parameter SFT policy to
actor/approx_kl 0.54 and 1.43, 25-70 times the later iterations' median
(docs/experiments/2026-12-01-first-rl-update-too-large.md)."""
MAX_GRAD_NORM = 1.0
"""Gradient clipping by global norm (actor/grad_norm is the norm before clipping)."""


def train(
    policy: Any,
    env: VecEnv,
    rl: RLConfig,
    out: str | Path,
    seed: int = 0,
    tasks: list[int | str] | None = None,
    monitor: Any | None = None,
    refiner: Any | None = None,
    console: bool = True,
    progress_bar: bool = True,
) -> dict[str, Any]:
    """Train ``policy`` (a torch module with the Policy protocol) in ``env`` for ``rl.iterations`` iterations,
    writing TensorBoard logs, checkpoints, ``results.json`` and the final policy folder (``out/policy``) under
    ``out``. Reruns with the same ``out`` resume from the latest checkpoint.
    ``monitor``: what watches the run (:class:`worldloop.diagnostics.monitor.RunMonitor`: reality checks, warnings,
    stop rules); its ``state()`` is checkpointed. ``refiner``: called as ``refiner(policy, iteration)`` every
    ``rl.refine.every`` iterations, returning metrics; its ``modules`` and ``stateful`` are checkpointed with the
    policy's, ``restore(iteration)`` rebuilds the rest on resume, and ``save(out / "world_model")`` keeps the refined
    world model (:class:`worldloop.rl.refine.WorldModelRefiner`). ``console``: one line of metrics per iteration;
    ``progress_bar``: a tqdm bar."""
    check_compatible(policy, env)
    num_envs, group_size, ppo, device = env.num_envs, rl.group_size, rl.algorithm == "ppo", policy_device(policy)
    groups_here = distributed.share(rl.num_groups, "rl.num_groups")  # this rank's whole groups
    if num_envs != groups_here * group_size:
        on = f" on each of {distributed.world_size()} processes" if distributed.active() else ""
        raise ValueError(f"the environment has {num_envs} envs; rl.num_groups x rl.group_size{on} = {groups_here} x {group_size} = {groups_here * group_size}")
    mine = slice(distributed.rank() * num_envs, (distributed.rank() + 1) * num_envs)  # this rank's envs of all
    console = console and distributed.is_main()  # every rank's monitor watches (its share of each check); rank 0 speaks
    distributed.seed_per_rank(seed)  # each rank samples its own rollouts
    distributed.broadcast_parameters(policy)
    tasks = list(tasks) if tasks is not None else list(range(len(getattr(env, "task_names", [0]))))
    parameters = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=rl.lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / LR_WARMUP_STEPS) if LR_WARMUP_STEPS else 1.0)
    reference = copy.deepcopy(policy).eval().requires_grad_(False) if rl.kl_coef > 0 else None  # rl.kl_coef's starting policy
    refiner = refiner if refiner is not None and rl.refine.every > 0 else None
    run = RLRun(out, rl, {"policy": policy} | ({"reference": reference} if reference is not None else {}),
                {"optimizer": optimizer, "scheduler": scheduler}, refiner, monitor, console)  # fmt: skip
    start, ended = run.start(policy)

    progress = tqdm(range(start, start if ended else rl.iterations), initial=start, total=rl.iterations, desc="rl", disable=not (console and progress_bar))
    for iteration in progress:
        began = time.perf_counter()

        # 1. Collect G rollouts per initial state at the training temperature.
        policy.eval()
        first = env.reset(*(starts[mine] for starts in group_starts(tasks, rl.num_groups, group_size, iteration, seed)))
        rollout = collect(policy, env, first, temperature=rl.train_temperature)
        num_chunks = rollout.rewards.shape[1]
        if ppo and rollout.values is None:
            raise ValueError("rl.algorithm=ppo needs a policy with a value head (train or build it with policy.value_head=true)")
        metrics: dict[str, float] = {"time/rollout": time.perf_counter() - began}

        # 2. Scores over the valid chunks: up to and including the first success (or the end of the episode).
        mask = loss_mask(rollout.done | rollout.success, rl.mask_after_success)  # (N, T)
        scores = trajectory_scores(rollout.rewards, mask)  # (N,)
        if rl.diagnostics.shuffled_scores:  # the control run: the same groups' scores, each credited to another member
            scores = shuffled_within_groups(scores, group_size, torch.Generator().manual_seed(seed * 1_000_003 + iteration))

        # 3. Advantages: group-relative (GRPO) or GAE (PPO); groups that all fail or all succeed carry no signal.
        returns = None
        if ppo:
            advantages, returns = gae(rollout.rewards, rollout.values, rollout.done, rollout.terminated, rollout.last_values, rl.gamma, rl.gae_lambda)
            keep = torch.ones(num_envs, dtype=torch.bool, device=device)
        else:
            advantages = grpo_advantages(scores, group_size)[:, None].expand(-1, num_chunks)  # (N, T)
            keep = informative_groups(scores, group_size) if rl.filter_groups else torch.ones(num_envs, dtype=torch.bool, device=device)
        weights = sample_weights(mask, keep)  # (N, T), sums to 1: each trajectory / its valid length

        # 4-5. Update: epochs of shuffled minibatches over the valid chunks; masked, length-normalised clipped loss.
        update_began = time.perf_counter()
        samples = weights.flatten().nonzero().squeeze(1)
        losses: dict[str, list[float]] = {}
        metrics["actor/lr"] = scheduler.get_last_lr()[0]  # at this iteration's first step (it rises within the warm-up)
        update_steps = 0
        # As many trajectories per minibatch as with every group kept: dropped groups mean fewer steps, not
        # as many steps on fewer samples (each a full-size AdamW step on noisier data).
        minibatches = minibatches_per_epoch(rl.num_minibatches, distributed.all_mean(keep.float().mean().item()))
        policy.train()
        for _ in range(rl.update_epochs if distributed.all_sum(len(samples)) else 0):
            for batch in minibatches_of(samples[torch.randperm(len(samples)).to(device)], minibatches):
                loss = None  # several ranks: one may have no sample left for a step every rank takes
                if len(batch):
                    loss, stats = minibatch_loss(policy, reference, rollout, advantages, returns, weights, batch, rl)
                    # The same weights that sampled the rollout: ~0 unless rollout and update compute log-probs differently.
                    metrics.setdefault("actor/approx_kl_before_update", stats["actor/approx_kl"])
                    for name, value in stats.items():
                        _append(losses, name, value)
                optimizer.zero_grad(set_to_none=True)
                if loss is not None:
                    loss.backward()
                distributed.average_gradients(parameters)
                grad_norm = torch.nn.utils.clip_grad_norm_(parameters, MAX_GRAD_NORM)
                optimizer.step()
                scheduler.step()
                update_steps += 1
                if loss is not None:
                    _append(losses, "actor/grad_norm", grad_norm)
        metrics |= {"actor/update_steps": float(update_steps), "time/update": time.perf_counter() - update_began}

        # 6. The world model learns what the updated policy really does, before RL can exploit what it renders wrongly.
        if refiner is not None and (iteration + 1) % rl.refine.every == 0:
            metrics |= refiner(policy, iteration + 1)

        # 7. Log; the monitor watches (reality checks, warnings, stop rules); atomic checkpoints.
        metrics |= rollout_metrics(rollout, scores, advantages, keep, mask, weights, returns, group_size, env, ppo)
        metrics |= {"rollout/valid_chunks": float(len(samples))}
        metrics |= {name: sum(values) / len(values) for name, values in losses.items()}
        metrics["time/iteration"] = time.perf_counter() - began
        metrics = distributed.reduce_metrics(metrics)
        ended = run.after_iteration(policy, iteration + 1, metrics)
        if ended:
            break
    return run.finish(policy)


def minibatch_loss(policy: Any, reference: Any, rollout: Rollout, advantages: torch.Tensor, returns: torch.Tensor | None, weights: torch.Tensor,
                   batch: torch.Tensor, rl: RLConfig) -> tuple[torch.Tensor, dict[str, float]]:  # fmt: skip
    """The loss of one minibatch of (trajectory, chunk) samples (``batch``: flat indices into (N, T)): the clipped
    policy loss on the samples' weights renormalised to 1, less the entropy bonus, plus PPO's clipped value loss and
    the KL penalty towards ``reference`` (None: none). Returns it and its parts, as floats, by metric name."""
    num_chunks = rollout.rewards.shape[1]
    env_index, chunk_index = batch // num_chunks, batch % num_chunks
    weight = weights[env_index, chunk_index]
    weight = weight / weight.sum()
    images = rollout.images[env_index, chunk_index]
    instructions = [rollout.instructions[i] for i in env_index.tolist()]
    tokens = rollout.tokens[env_index, chunk_index]
    device = policy_device(policy)
    with autocast(device):
        new = policy.evaluate(images, instructions, tokens, temperature=rl.train_temperature)
    policy_loss, stats = clipped_policy_loss(
        new.log_probs.float(), rollout.log_probs[env_index, chunk_index], advantages[env_index, chunk_index], weight, rl.clip_low, rl.clip_high
    )
    entropy = entropy_bonus(new.entropy.float(), weight)
    loss, parts = policy_loss - rl.entropy_coef * entropy, {}
    if returns is not None:  # PPO
        value_loss = clipped_value_loss(new.values.float(), rollout.values[env_index, chunk_index], returns[env_index, chunk_index], weight, VALUE_CLIP)
        loss = loss + VALUE_COEF * value_loss
        parts["critic/value_loss"] = value_loss
    if reference is not None:
        with torch.no_grad(), autocast(device):
            reference_log_probs = reference.evaluate(images, instructions, tokens, temperature=rl.train_temperature).log_probs
        kl = kl_penalty(new.log_probs.float(), reference_log_probs.float(), weight)
        loss = loss + rl.kl_coef * kl
        parts["actor/kl_loss"] = kl
    parts |= {"actor/policy_loss": policy_loss, "actor/approx_kl": stats["approx_kl"], "actor/clip_fraction": stats["clip_fraction"], "actor/entropy": entropy}
    return loss, {name: float(value.detach() if isinstance(value, torch.Tensor) else value) for name, value in parts.items()}


def rollout_metrics(rollout: Rollout, scores: torch.Tensor, advantages: torch.Tensor, keep: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor,
                    returns: torch.Tensor | None, group_size: int, env: VecEnv, ppo: bool) -> dict[str, float]:  # fmt: skip
    """What one iteration's rollouts and advantages were: success, return, kept groups, the advantages' spread."""
    group_success = rollout.success_once.view(-1, group_size)
    metrics = {
        "env/success_once": rollout.success_once.float().mean().item(),
        "env/return": scores.mean().item(),
        "env/episode_len": rollout.elapsed.float().mean().item(),
        "rollout/kept_groups": keep.float().mean().item(),
        "rollout/groups_all_success": group_success.all(dim=1).float().mean().item(),
        "rollout/groups_all_fail": (~group_success).all(dim=1).float().mean().item(),
    }
    if hasattr(env, "started_from_keyframe"):  # the imagined env: the share of KIR starts, and how each kind of start fared
        from_keyframe = env.started_from_keyframe.to(rollout.success_once.device)
        metrics["rollout/keyframe_starts"] = from_keyframe.float().mean().item()
        for name, starts in (("keyframe", from_keyframe), ("first_frame", ~from_keyframe)):
            if starts.any():  # absent, not NaN, when an iteration had no such start
                metrics[f"env/success_once_{name}"] = rollout.success_once[starts].float().mean().item()
    used = advantages[keep[:, None] & mask] if ppo else advantages[keep, 0]  # PPO: per chunk; GRPO: per trajectory
    if used.numel():
        metrics |= {
            "rollout/advantages_mean": used.mean().item(),
            "rollout/advantages_std": used.std().item() if used.numel() > 1 else 0.0,
            "rollout/advantages_max": used.max().item(),
            "rollout/advantages_min": used.min().item(),
        }
    if ppo:
        metrics["critic/explained_variance"] = explained_variance(rollout.values, returns, weights)
    return metrics


def minibatches_of(samples: torch.Tensor, count: int) -> list[torch.Tensor]:
    """``samples`` in ``count`` minibatches (``Tensor.chunk``'s, which may be fewer); with several ranks, padded with
    empty ones to exactly ``count``, since every rank takes the same optimizer steps."""
    pieces = list(samples.chunk(count)) if len(samples) else []
    return pieces + [samples[:0]] * (count - len(pieces)) if distributed.active() else pieces


def minibatches_per_epoch(num_minibatches: int, kept_fraction: float) -> int:
    """rl.num_minibatches scaled by the fraction of groups kept, at least one: ceil(M * kept)."""
    return max(1, math.ceil(num_minibatches * kept_fraction - 1e-9))


def group_starts(tasks: list[int | str], num_groups: int, group_size: int, iteration: int, seed: int) -> tuple[list, list[int]]:
    """Task and seed of every env: group g of iteration i takes task (i * num_groups + g) mod |tasks|
    and seed ``seed * 10**6 + i * num_groups + g``; its G members share both (one initial state)."""
    task_ids, seeds = [], []
    for g in range(num_groups):
        index = iteration * num_groups + g
        task_ids += [tasks[index % len(tasks)]] * group_size
        seeds += [seed * 1_000_000 + index] * group_size
    return task_ids, seeds


def _append(store: dict[str, list[float]], name: str, value: torch.Tensor | float) -> None:
    value = float(value.detach() if isinstance(value, torch.Tensor) else value)
    if math.isfinite(value):
        store.setdefault(name, []).append(value)

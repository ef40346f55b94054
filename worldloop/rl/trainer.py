"""Masked GRPO (WoVR) and PPO for a VLA policy in any vectorised, chunked environment.

One iteration, top to bottom:

1. collect: G rollouts per initial state (groups share a task and a seed), sampling at the
   training temperature; the old log-probs are those of the sampled tokens at that temperature;
2. scores: S = sum of chunk rewards up to and including the first done; loss mask = those chunks;
3. advantages: GRPO (S - mean_g) / (std_g + 1e-6), groups without signal dropped; or PPO's GAE;
4. loss: token-level clipped ratio (asymmetric clip), each trajectory's loss divided by its
   valid length, optional entropy bonus, optional KL to the starting policy, PPO's clipped value loss;
5. update: several epochs of shuffled minibatches of valid chunks (fewer when groups were dropped, so each
   holds as many trajectories as a full batch's), gradient clipping, AdamW whose
   learning rate warms up linearly over the first optimizer steps; optionally stopped early once a
   minibatch's approx_kl exceeds ``target_kl``;
6. every ``refine_every`` iterations, when a refiner is given (:mod:`worldloop.rl.refine`), the world model
   learns from the policy's own real rollouts;
7. every ``eval_every`` iterations, the reality check: real-simulator success and imagined
   success from the same initial states, and where their gap comes from; with
   ``stop_when_real_falls_se``, the run stops when real success has fallen, keeping the weights of the
   last evaluation at which it held; atomic checkpoints that resume exactly.

The environment is anything with the :class:`~worldloop.envs.protocol.VecEnv` protocol: the
imagined environment (RL in the world model), the real simulator (the GRPO-in-reality baseline)
or the toy world of the tests.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.tensorboard import SummaryWriter
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
from worldloop.rl.curves import plot_curves
from worldloop.rl.losses import clipped_policy_loss, clipped_value_loss, entropy_bonus, kl_penalty
from worldloop.rl.rollout import autocast, check_compatible, collect, paired_changes, policy_device, tracking_line
from worldloop.utils.checkpoint import announce_resume, latest_checkpoint, load_checkpoint, save_checkpoint
from worldloop.utils.io import atomic_path, atomic_write_json, atomic_write_text
from worldloop.utils.stats import format_kappa, format_paired


def train(
    policy: Any,
    env: VecEnv,
    rl: RLConfig,
    out: str | Path,
    seed: int = 0,
    tasks: list[int | str] | None = None,
    reality_check: Callable[[Any, str], dict[str, Any]] | None = None,
    refiner: Any | None = None,
    console: bool = True,
    progress_bar: bool = True,
    training_task_of: Callable[[str], int | str] | None = None,
) -> dict[str, Any]:
    """Train ``policy`` (a torch module with the Policy protocol) in ``env`` for ``rl.iterations``
    iterations, writing TensorBoard logs, checkpoints, ``results.json`` and the final policy folder
    (``out/policy``) under ``out``; ``evaluations.json`` holds the reality checks so far from the first one on.
    Reruns with the same ``out`` resume from the latest checkpoint.
    ``refiner``: called as ``refiner(policy, iteration)`` every ``rl.refine_every`` iterations, returning
    metrics; its ``modules`` and ``stateful`` are checkpointed with the policy's, ``restore(iteration)``
    rebuilds the rest on resume, and ``save(out / "world_model")`` keeps the refined world model
    (:class:`worldloop.rl.refine.WorldModelRefiner`).
    ``console``: one line of metrics per iteration and per evaluation; ``progress_bar``: a tqdm bar.
    ``training_task_of``: a reality check's task name -> its id in ``tasks`` (default: the name itself), for
    rl.drop_imagined_only (the imagined env's tasks are instructions, the check's simulator task names)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    check_compatible(policy, env)
    num_envs, group_size = env.num_envs, rl.group_size
    if num_envs != rl.num_groups * group_size:
        raise ValueError(f"the environment has {num_envs} envs; rl.num_groups x rl.group_size = {rl.num_groups} x {group_size} = {rl.num_groups * group_size}")
    ppo = rl.algorithm == "ppo"
    tasks = list(tasks) if tasks is not None else list(range(len(getattr(env, "task_names", [0]))))
    device = policy_device(policy)

    parameters = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=rl.lr, weight_decay=rl.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / rl.lr_warmup_steps) if rl.lr_warmup_steps else 1.0)
    reference = copy.deepcopy(policy).eval().requires_grad_(False) if rl.kl_coef > 0 else None
    refining = refiner is not None and rl.refine_every > 0
    modules = {"policy": policy} | ({"reference": reference} if reference is not None else {}) | (refiner.modules if refining else {})
    stateful = {"optimizer": optimizer, "scheduler": scheduler} | (refiner.stateful if refining else {})

    start, history, evaluations = 0, [], []
    warnings, silent = [], 0  # silent: consecutive GRPO iterations in which every group was filtered out
    fell = None  # rl.stop_when_real_falls_se: the evaluation at which real success fell
    held_path = out / "policy_held.pt"  # ... and the weights of the last evaluation at which it held
    checkpoint = latest_checkpoint(out)
    if checkpoint is not None:
        start, extra = load_checkpoint(checkpoint, modules, stateful)
        announce_resume("rl", checkpoint, start)
        history, evaluations, fell = extra["history"], extra["evaluations"], extra.get("stopped")
        warnings, silent = extra.get("warnings", []), extra.get("silent", 0)  # absent in checkpoints from before they were kept
        if extra.get("refining") and not refining:  # its refined world model lives in the checkpoint: without it the run would go on in the old one
            raise ValueError(f"{out} refined its world model on the policy's real rollouts (rl.refine_every); resume it with the same rl.refine_* settings")
        if refining:
            refiner.restore(start)
    writer = SummaryWriter(str(out / "tb"), purge_step=start)

    def warn(iteration: int, message: str, once: bool = True) -> None:
        """Record (and print) a diagnosis; ``once``: only the first of its kind (the text before ':') per run."""
        kind = message.split(":")[0]
        if once and any(w["message"].split(":")[0] == kind for w in warnings):
            return
        warnings.append({"iteration": iteration, "message": message})
        if console:
            tqdm.write(f"rl: WARNING {message}")

    # the latest evaluation's duration, what the final one is expected to take (kept with each evaluation: a resumed run knows it)
    eval_seconds = evaluations[-1].get("seconds", 0.0) if evaluations else 0.0

    def evaluate(iteration: int) -> None:
        nonlocal eval_seconds
        began = time.perf_counter()
        policy.eval()
        result = reality_check(policy, f"iteration_{iteration:04d}") | {"iteration": iteration}
        evaluations.append(result)
        writer.add_scalar("eval/success_once", result["real"]["success_once"], iteration)
        writer.add_scalar("eval/success_once_stderr", result["real"]["stderr"], iteration)
        for task, numbers in result["real"]["per_task"].items():
            writer.add_scalar(f"eval/{task}/success_once", numbers["success_once"], iteration)
        line = f"eval @ {iteration}: real {_rate(result['real'])}"
        if "imagined" in result:
            writer.add_scalar("eval/success_once_imagined", result["imagined"]["success_once"], iteration)
            if "imagined_keyframes" in result:  # the same policy in imagination from KIR keyframes
                writer.add_scalar("eval/success_once_imagined_keyframes", result["imagined_keyframes"]["success_once"], iteration)
                for task, numbers in result["imagined_keyframes"]["per_task"].items():
                    writer.add_scalar(f"eval/{task}/success_once_imagined_keyframes", numbers["success_once"], iteration)
            writer.add_scalar("eval/imagination_gap", result["imagined"]["success_once"] - result["real"]["success_once"], iteration)
            writer.add_scalar("eval/agreement", result["agreement"], iteration)
            if result.get("kappa") is not None:
                writer.add_scalar("eval/kappa", result["kappa"], iteration)
            line += f" | imagined {_rate(result['imagined'])} | agreement {_agreement(result)}"
            if "imagined_keyframes" in result:
                line += f" | imagined from keyframes {_rate(result['imagined_keyframes'])}"
            acted = result.get("imagined_actions_in_reality")
            if acted is not None:  # the imagined episodes' actions, done in the simulator
                writer.add_scalar("eval/success_once_imagined_actions_in_reality", acted["success_once"], iteration)
                line += f"\n  {imagined_actions_line(acted)}"
            again = result.get("imagination_repeat")
            if again is not None:  # the same actions in imagination under other noise
                writer.add_scalar("eval/success_once_imagination_repeat", again["success_once"], iteration)
                if again["kappa"] is not None:
                    writer.add_scalar("eval/kappa_imagination_repeat", again["kappa"], iteration)
                line += f"\n  {imagination_repeat_line(again)}"
            for row in result.get("tracking", []):
                writer.add_scalar(f"eval/tracking/psnr_after_{row['chunks']}_chunks", row["psnr"], iteration)
                writer.add_scalar(f"eval/tracking/psnr_initial_frame_after_{row['chunks']}_chunks", row["psnr_initial_frame"], iteration)
                for name in ("token_agreement", "token_distance", "token_agreement_reconstructed", "token_distance_reconstructed",
                             "token_agreement_reconstructed_imagined"):
                    if name in row:
                        writer.add_scalar(f"eval/tracking/{name}_after_{row['chunks']}_chunks", row[name], iteration)
                if row["kappa"] is not None:
                    writer.add_scalar(f"eval/tracking/kappa_after_{row['chunks']}_chunks", row["kappa"], iteration)
            for name, source in result.get("gap_sources", {}).items():
                writer.add_scalar(f"eval/success_once_{name}", source["success_once"], iteration)
                if source["kappa"] is not None:
                    writer.add_scalar(f"eval/kappa_{name}", source["kappa"], iteration)
            if result.get("gap_sources"):
                for name, step in gap_steps(result).items():  # per task: where imagination is faithful, and where RL moved it
                    for task, kappa in (step.get("per_task_kappa") or {}).items():
                        if kappa["kappa"] is not None:
                            writer.add_scalar(f"eval/{task}/kappa_{name}", kappa["kappa"], iteration)
            if result.get("tracking"):
                line += "\n  " + tracking_line(result["tracking"])
            if result.get("gap_sources"):
                line += "\n  " + sources_line(result)
            for warning in (imagination_gap_diagnosis(result), imagination_tracking_diagnosis(result),
                            world_model_exploited_diagnosis(evaluations[0], result), imagined_only_gain_diagnosis(evaluations[0], result)):  # fmt: skip
                if warning:
                    warn(iteration, warning)
        since = since_first_line(evaluations[0], result)
        if since:  # the criterion's numbers on the console (and so in the log) at every check, not only in results.json
            line += "\n  " + since
        eval_seconds = result["seconds"] = time.perf_counter() - began
        writer.add_scalar("time/eval", eval_seconds, iteration)
        # every check so far, kept as soon as it is made: a run cut short (a lease's end) keeps them, per-episode verdicts included
        atomic_write_json(out / "evaluations.json", {"evaluations": evaluations, "warnings": warnings})
        if console:
            tqdm.write(line)

    def held_or_fallen(iteration: int) -> dict[str, Any] | None:
        """rl.stop_when_real_falls_se: where this evaluation's real success fell below the first's, why; else its weights are held."""
        if rl.stop_when_real_falls_se <= 0:
            return None
        fallen = real_success_fall(evaluations[0], evaluations[-1], rl.stop_when_real_falls_se)
        if not fallen:
            with atomic_path(held_path) as tmp:
                torch.save({"iteration": iteration, "policy": policy.state_dict()}, tmp)
            return None
        # none held: a run resumed with the option that began without it; its final policy is then this one
        held = torch.load(held_path, map_location="cpu", weights_only=True)["iteration"] if held_path.is_file() else iteration
        warn(iteration, f"{REAL_FELL} at iteration {iteration}: {'; '.join(fallen)} against iteration {evaluations[0]['iteration']}; "
                        f"training stops and the final policy is iteration {held}'s (rl.stop_when_real_falls_se={rl.stop_when_real_falls_se:g})",
             once=False)  # fmt: skip
        return {"iteration": iteration, "fallen": fallen, "policy_from": held}

    def dropped_tasks() -> dict[int | str, int]:
        """rl.drop_imagined_only: each training task that a reality check found gaining in imagination alone -> the
        iteration of the first such check (from the evaluations alone: a resumed run finds the same)."""
        dropped: dict[int | str, int] = {}
        for result in evaluations[1:] if rl.drop_imagined_only else []:
            for task in imagined_only_tasks(evaluations[0], result):
                task = training_task_of(task) if training_task_of is not None else task
                if task in tasks:
                    dropped.setdefault(task, result["iteration"])
        return dropped

    def still_training(iteration: int) -> list[int | str]:
        """The training tasks left after this evaluation; a task dropped at it is said."""
        dropped = dropped_tasks()
        new = [task for task, at in dropped.items() if at == iteration]
        left = [task for task in tasks if task not in dropped]
        if new:
            rest = f"training goes on with {', '.join(map(str, left))}" if left else "no task is left: training stops"
            warn(iteration, f"{DROPPED} at iteration {iteration}: {', '.join(map(str, new))} (success rising in imagination only; "
                            f"rl.drop_imagined_only); {rest}", once=False)  # fmt: skip
        return left

    run_began = time.perf_counter()  # rl.time_limit_min counts from here, the first evaluation included
    slowest_iteration = max((h["time/iteration"] for h in history), default=0.0)
    if reality_check is not None and start == 0:
        evaluate(0)
        held_or_fallen(0)
    training_tasks = [task for task in tasks if task not in dropped_tasks()]

    end = start if fell or not training_tasks else rl.iterations  # a run that stopped stays stopped when rerun
    progress = tqdm(range(start, end), initial=start, total=rl.iterations, desc="rl", disable=not (console and progress_bar))
    for iteration in progress:
        began = time.perf_counter()
        metrics: dict[str, float] = {}

        # 1. Collect G rollouts per initial state at the training temperature.
        policy.eval()
        task_ids, seeds = group_starts(training_tasks, rl.num_groups, group_size, iteration, seed)
        first = env.reset(task_ids, seeds)
        rollout = collect(policy, env, first, temperature=rl.train_temperature)
        num_chunks = rollout.rewards.shape[1]
        if ppo and rollout.values is None:
            raise ValueError("rl.algorithm=ppo needs a policy with a value head (train or build it with policy.value_head=true)")
        metrics["time/rollout"] = time.perf_counter() - began

        # 2. Scores over the valid chunks: up to and including the first success (or the end of the episode).
        mask = loss_mask(rollout.done | rollout.success, rl.mask_after_success)  # (N, T)
        scores = trajectory_scores(rollout.rewards, mask)  # (N,)
        if rl.reward_control == "shuffled":  # the control run: the same groups' scores, each credited to another member
            scores = shuffled_within_groups(scores, group_size, torch.Generator().manual_seed(seed * 1_000_003 + iteration))

        # 3. Advantages: group-relative (GRPO) or GAE (PPO); groups that all fail or all succeed carry no signal.
        if ppo:
            advantages, returns = gae(rollout.rewards, rollout.values, rollout.terminated, rollout.last_values, rl.gamma, rl.gae_lambda)
            keep = torch.ones(num_envs, dtype=torch.bool, device=device)
        else:
            advantages = grpo_advantages(scores, group_size)[:, None].expand(-1, num_chunks)  # (N, T)
            keep = informative_groups(scores, group_size) if rl.filter_groups else torch.ones(num_envs, dtype=torch.bool, device=device)
        weights = sample_weights(mask, keep, rl.length_normalise)  # (N, T), sums to 1: each trajectory / its valid length

        # 4-5. Update: epochs of shuffled minibatches over the valid chunks; masked, length-normalised clipped loss.
        update_began = time.perf_counter()
        samples = weights.flatten().nonzero().squeeze(1)
        losses: dict[str, list[float]] = {}
        metrics["actor/lr"] = scheduler.get_last_lr()[0]  # at this iteration's first step (it rises within the warm-up)
        update_steps, stopped = 0, False
        # As many trajectories per minibatch as with every group kept: dropped groups mean fewer steps, not
        # as many steps on fewer samples (each a full-size AdamW step on noisier data).
        minibatches = minibatches_per_epoch(rl.num_minibatches, keep.float().mean().item())
        policy.train()
        for _ in range(rl.update_epochs if len(samples) else 0):
            for batch in samples[torch.randperm(len(samples)).to(device)].chunk(minibatches):
                env_index, chunk_index = batch // num_chunks, batch % num_chunks
                weight = weights[env_index, chunk_index]
                weight = weight / weight.sum()
                images = rollout.images[env_index, chunk_index]
                instructions = [rollout.instructions[i] for i in env_index.tolist()]
                tokens = rollout.tokens[env_index, chunk_index]
                with autocast(device):
                    new = policy.evaluate(images, instructions, tokens, temperature=rl.train_temperature)
                policy_loss, stats = clipped_policy_loss(
                    new.log_probs.float(), rollout.log_probs[env_index, chunk_index], advantages[env_index, chunk_index], weight, rl.clip_low, rl.clip_high
                )
                entropy = entropy_bonus(new.entropy.float(), weight)
                loss = policy_loss - rl.entropy_coef * entropy
                if ppo:
                    value_loss = clipped_value_loss(
                        new.values.float(), rollout.values[env_index, chunk_index], returns[env_index, chunk_index], weight, rl.value_clip
                    )
                    loss = loss + rl.value_coef * value_loss
                    _append(losses, "critic/value_loss", value_loss)
                if reference is not None:
                    with torch.no_grad(), autocast(device):
                        reference_log_probs = reference.evaluate(images, instructions, tokens, temperature=rl.train_temperature).log_probs
                    kl = kl_penalty(new.log_probs.float(), reference_log_probs.float(), weight)
                    loss = loss + rl.kl_coef * kl
                    _append(losses, "actor/kl_loss", kl)

                if "actor/approx_kl_before_update" not in metrics:
                    # The same weights that sampled the rollout: ~0 unless rollout and update compute log-probs differently.
                    metrics["actor/approx_kl_before_update"] = float(stats["approx_kl"])
                for name, value in (
                    ("actor/policy_loss", policy_loss),
                    ("actor/approx_kl", stats["approx_kl"]),
                    ("actor/clip_fraction", stats["clip_fraction"]),
                    ("actor/entropy", entropy),
                ):
                    _append(losses, name, value)
                # target_kl: this minibatch's approx_kl is measured before its own step, so stopping here, without
                # its step, leaves the policy where that measure was taken (CleanRL steps the whole epoch, then checks);
                # its measurements above stay in the iteration's means, which then show how far the update went.
                # The first minibatch always steps: before any step, approx_kl is only the rollout-vs-update numerics.
                if rl.target_kl is not None and update_steps and float(stats["approx_kl"]) > rl.target_kl:
                    stopped = True
                    break
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(parameters, rl.max_grad_norm)
                optimizer.step()
                scheduler.step()  # per optimizer step taken: a stopped update's skipped steps do not advance the warm-up
                update_steps += 1
                _append(losses, "actor/grad_norm", grad_norm)
            if stopped:
                break
        metrics["actor/update_steps"] = float(update_steps)
        metrics["time/update"] = time.perf_counter() - update_began

        # 6. The world model learns what the updated policy really does, before RL can exploit what it renders wrongly.
        if refining and (iteration + 1) % rl.refine_every == 0:
            metrics |= refiner(policy, iteration + 1)

        # Metrics of this iteration.
        used_advantages = advantages[keep[:, None] & mask] if ppo else advantages[keep, 0]  # PPO: per chunk; GRPO: per trajectory
        metrics |= {
            "env/success_once": rollout.success_once.float().mean().item(),
            "env/return": scores.mean().item(),
            "env/episode_len": rollout.elapsed.float().mean().item(),
            "rollout/kept_groups": keep.float().mean().item(),
            "rollout/valid_chunks": float(len(samples)),
            "rollout/training_tasks": float(len(training_tasks)),
        }
        group_success = rollout.success_once.view(-1, group_size)
        metrics["rollout/groups_all_success"] = group_success.all(dim=1).float().mean().item()
        metrics["rollout/groups_all_fail"] = (~group_success).all(dim=1).float().mean().item()
        silent = silent + 1 if not ppo and not bool(keep.any()) else 0
        if silent == SILENT_ITERATIONS:
            warn(iteration + 1, silence_diagnosis(metrics, SILENT_ITERATIONS), once=False)
        if hasattr(env, "started_from_keyframe"):  # the imagined env: the share of KIR starts, and how each kind of start fared
            from_keyframe = env.started_from_keyframe.to(rollout.success_once.device)
            metrics["rollout/keyframe_starts"] = from_keyframe.float().mean().item()
            for name, starts in (("keyframe", from_keyframe), ("first_frame", ~from_keyframe)):
                if starts.any():  # absent, not NaN, when an iteration had no such start
                    metrics[f"env/success_once_{name}"] = rollout.success_once[starts].float().mean().item()
        if used_advantages.numel():
            metrics |= {
                "rollout/advantages_mean": used_advantages.mean().item(),
                "rollout/advantages_std": used_advantages.std().item() if used_advantages.numel() > 1 else 0.0,
                "rollout/advantages_max": used_advantages.max().item(),
                "rollout/advantages_min": used_advantages.min().item(),
            }
        metrics |= {name: sum(values) / len(values) for name, values in losses.items()}
        jump = update_diagnosis(metrics, iteration + 1)
        if jump:
            warn(iteration + 1, jump)
        if ppo:
            metrics["critic/explained_variance"] = explained_variance(rollout.values, returns, weights)
        metrics["time/iteration"] = time.perf_counter() - began
        for name, value in metrics.items():
            writer.add_scalar(name, value, iteration + 1)
        history.append({"iteration": iteration + 1} | metrics)
        if console:
            shown = ("env/success_once", "env/return", "env/episode_len", "rollout/kept_groups", "actor/policy_loss", "actor/approx_kl_before_update",
                     "actor/approx_kl", "actor/clip_fraction", "actor/entropy", "actor/grad_norm", "actor/update_steps",
                     "critic/value_loss", "world_model/refine_real_success", "world_model/refine_loss_new_before",
                     "world_model/refine_loss_new_after", "time/iteration")  # fmt: skip
            tqdm.write(f"it {iteration + 1}: " + " ".join(f"{name} {metrics[name]:.4g}" for name in shown if name in metrics))

        # 7. The reality check and atomic checkpoints.
        done_iterations = iteration + 1
        slowest_iteration = max(slowest_iteration, metrics["time/iteration"])
        evaluating = reality_check is not None and bool(rl.eval_every) and done_iterations % rl.eval_every == 0
        out_of_time = time_is_up(time.perf_counter() - run_began, slowest_iteration, eval_seconds if reality_check is not None else 0.0,
                                 evaluating, rl.time_limit_min)  # fmt: skip
        last = done_iterations == rl.iterations or out_of_time
        if reality_check is not None and (last or evaluating):
            evaluate(done_iterations)
            fell = held_or_fallen(done_iterations)
            training_tasks = still_training(done_iterations)
        if last or fell or not training_tasks or done_iterations % rl.checkpoint_every == 0:
            save_checkpoint(out, done_iterations, modules, stateful,
                            {"history": history, "evaluations": evaluations, "refining": refining, "stopped": fell, "warnings": warnings, "silent": silent},
                            keep=rl.keep_checkpoints)  # fmt: skip
        if out_of_time and console:
            tqdm.write(f"rl: time limit of {rl.time_limit_min} min reached after {done_iterations} iterations")
        if out_of_time or fell or not training_tasks:
            break
    writer.close()

    policy.eval()
    if fell and fell["policy_from"] != fell["iteration"]:  # the weights of the last evaluation at which real success held
        policy.load_state_dict(torch.load(held_path, map_location=policy_device(policy), weights_only=True)["policy"])
    policy.save_pretrained(out / "policy")
    if refining:
        refiner.save(out / "world_model")
    results = {"iterations": len(history), "algorithm": rl.algorithm, "reward_control": rl.reward_control, "history": history,
               "evaluations": evaluations, "warnings": warnings,
               "stopped": fell, "dropped_tasks": {str(task): at for task, at in dropped_tasks().items()}}  # fmt: skip
    atomic_write_json(out / "results.json", results)
    stop_line = "" if not fell else (f"\nStopped at iteration {fell['iteration']}: real success fell ({'; '.join(fell['fallen'])}); "
                                     f"the final policy is iteration {fell['policy_from']}'s.\n")  # fmt: skip
    control = ("A control run (rl.reward_control=shuffled): each rollout was credited with another's score from its group.\n\n"
               if rl.reward_control == "shuffled" else "")  # fmt: skip
    atomic_write_text(out / "results.md", control + results_table(evaluations, history) + stop_line)
    plot_curves(results, out / "curves.png")
    return results


SILENT_ITERATIONS = 5  # GRPO iterations without a single informative group before the run says why
OPTIMISTIC = "the imagined environment is optimistic"
PESSIMISTIC = "the imagined environment is pessimistic"
UNTRACKED = "the imagined environment does not track reality per episode"
EXPLOITED = "the policy exploits the world model"
IMAGINED_ONLY = "success rose in imagination only"
DROPPED = "dropped from training"
REAL_FELL = "real success fell"
LARGE_UPDATE = "an update moved the policy far"
LARGE_UPDATE_KL = 0.3  # healthy iterations of the H200 runs: approx_kl 0.01-0.07; the jumps: 0.54 and 1.43


def time_is_up(elapsed_s: float, iteration_s: float, eval_s: float, evaluating: bool, limit_min: float) -> bool:
    """rl.time_limit_min: whether one more iteration (``iteration_s``), the evaluation now due (where ``evaluating``)
    and the final one (each ``eval_s``) would end past the limit, ``elapsed_s`` into the run; never with no limit (0).
    The final evaluation counts because a run stopped from outside before it writes no results at all."""
    if limit_min <= 0:
        return False
    return elapsed_s + iteration_s + eval_s * (1 + evaluating) > 60 * limit_min


def minibatches_per_epoch(num_minibatches: int, kept_fraction: float) -> int:
    """rl.num_minibatches scaled by the fraction of groups kept, at least one: ceil(M * kept)."""
    return max(1, math.ceil(num_minibatches * kept_fraction - 1e-9))


def update_diagnosis(metrics: dict[str, float], iteration: int) -> str:
    """A warning when one iteration's update moved the policy far from the one that collected its
    rollouts (mean approx_kl above ``LARGE_UPDATE_KL``): the clipped ratio no longer holds it near."""
    kl = metrics.get("actor/approx_kl", 0.0)
    if kl <= LARGE_UPDATE_KL:
        return ""
    return (f"{LARGE_UPDATE}: in iteration {iteration}, approx_kl {kl:.2f} and clip fraction {metrics.get('actor/clip_fraction', 0.0):.2f} "
            "(healthy updates stay below ~0.05). A confident policy under a fresh optimizer does this in the first iterations "
            "(docs/results.md, eighth H200 session): raise rl.lr_warmup_steps, lower rl.lr or stop the update early with "
            "rl.target_kl")  # fmt: skip


def silence_diagnosis(metrics: dict[str, float], iterations: int) -> str:
    """Why GRPO has had nothing to learn from for ``iterations`` iterations, and what to check."""
    if metrics["rollout/groups_all_success"] == 1.0:
        return (f"for {iterations} iterations every rollout of every group succeeded, so GRPO filtered them all and took no step. "
                "In imagination this usually means the judge fires on world-model frames: read `calibrate-reward --world-model` "
                "(its false-positive rate on imagined frames), train the judge with `train-reward --world-model`, or raise its threshold")  # fmt: skip
    if metrics["rollout/groups_all_fail"] == 1.0:
        return (f"for {iterations} iterations no rollout succeeded, so GRPO filtered every group and took no step: start from a "
                "stronger base policy, add KIR keyframes nearer success, raise rl.train_temperature or rl.max_steps")  # fmt: skip
    return f"for {iterations} iterations every group was all-success or all-failure, so GRPO filtered them all and took no step"


def imagination_gap_diagnosis(result: dict[str, Any], margin: float = 0.2) -> str:
    """A warning when, from the same initial states, the imagined success differs from the real one by
    more than ``margin`` and 3 standard errors. Optimistic: the reward RL maximises pays for failures.
    Pessimistic: RL rarely sees the successes it should reinforce."""
    real, imagined = result["real"], result["imagined"]
    gap = imagined["success_once"] - real["success_once"]
    if abs(gap) <= margin or abs(gap) <= 3 * math.hypot(real["stderr"], imagined["stderr"]):
        return ""
    says = f"from the same initial states it says {imagined['success_once']:.2f}, the real simulator {real['success_once']:.2f}"
    source = gap_source(result, margin)
    says += f" ({source})" if source else ""
    if gap > 0:
        return (f"{OPTIMISTIC}: {says}, so RL is paid for failures. Watch the real | replay | imagined videos (OUT/videos) to see "
                "whether the world model moves the scene without the policy doing it (train it on the policy's own rollouts too) "
                "or the judge passes failures (`calibrate-reward --world-model` on those rollouts)")  # fmt: skip
    return (f"{PESSIMISTIC}: {says}, so RL rarely sees the successes it should reinforce. Watch the real | replay | imagined videos "
            "(OUT/videos) to see whether the world model loses the scene (`eval-wm` against copy-last-frame, on the policy's "
            "rollouts too) or the judge misses imagined successes (its recall on imagined frames in `calibrate-reward "
            "--world-model`; rl.success_chunks > 1 asks more of it)")  # fmt: skip


SOURCES = {"judged_real": "the judge on the real frames", "replayed": "the world model replaying the real actions", "imagined": "closed loop"}
"""The steps from reality to imagination, in order: the imagined environment's judge on the real episodes'
frames; the world model driven open loop by the real action chunks, judged; the policy acting in it."""


def gap_source(result: dict[str, Any], margin: float = 0.2) -> str:
    """Which step of ``SOURCES`` first moves the success rate away from the real one, in the direction of
    the gap, by more than ``margin`` and 3 standard errors, in words; '' without the reality check's gap sources."""
    sources = result.get("gap_sources")
    if not sources:
        return ""
    real = result["real"]
    direction = math.copysign(1.0, result["imagined"]["success_once"] - real["success_once"])
    for name in ("judged_real", "replayed"):
        if name not in sources:
            continue
        rate, stderr = sources[name]["success_once"], sources[name]["stderr"]
        if direction * (rate - real["success_once"]) > max(margin, 3 * math.hypot(real["stderr"], stderr)):
            return f"it starts at {SOURCES[name]}, which already says {rate:.2f}"
    near = ", ".join(f"{SOURCES[name]} {sources[name]['success_once']:.2f}" for name in ("judged_real", "replayed") if name in sources)
    return f"{near}, near the real rate: the gap arises in the closed loop, where the policy acts on imagined frames"


def gap_steps(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The reality check's steps in ``SOURCES`` order, each a success summary with its kappa against the simulator
    (overall and ``per_task_kappa``); the closed loop's kappa sits at the result's top level."""
    closed_loop = {key: result.get(key) for key in ("kappa", "kappa_stderr", "per_task_kappa")}
    return dict(result["gap_sources"]) | {"imagined": result["imagined"] | closed_loop}


def sources_line(result: dict[str, Any]) -> str:
    """'success and kappa against the simulator: the judge on the real frames 0.400 ± 0.035 (n=200) (kappa 0.81 ± 0.05),
    the world model replaying the real actions 0.600 ± 0.035 (n=200) (kappa 0.30 ± 0.07), closed loop 0.700 ± 0.032 (n=200) (kappa ...)'."""
    parts = []
    for name, step in gap_steps(result).items():
        kappa = format_kappa(step["kappa"], step["kappa_stderr"]) if step.get("kappa") is not None else "-"
        parts.append(f"{SOURCES[name]} {_rate(step)} (kappa {kappa})")
    return "success and kappa against the simulator: " + ", ".join(parts)


def sources_by_task_rows(result: dict[str, Any]) -> list[str]:
    """Markdown rows '| iteration | task | real | judge on real | replay | closed loop |', each step's success with
    its kappa against the simulator within the task: where one task's imagination is faithful and another's is not."""
    steps = gap_steps(result)
    rows = []
    for task, real in result["real"]["per_task"].items():
        cells = [f"{real['success_once']:.2f}"]
        for name in SOURCES:
            if name not in steps:  # no judge on the real frames without a judge
                cells.append("-")
                continue
            step = steps[name]
            kappa = (step.get("per_task_kappa") or {}).get(task, {}).get("kappa")
            cells.append(f"{step['per_task'][task]['success_once']:.2f} ({'-' if kappa is None else f'{kappa:.2f}'})")
        rows.append(f"| {result['iteration']} | {task} | " + " | ".join(cells) + " |")
    return rows


def world_model_exploited_diagnosis(first: dict[str, Any], result: dict[str, Any], slight: float = 0.2) -> str:
    """A warning when, on some task, the world model replaying the policy's real actions agreed with the
    simulator per episode at the ``first`` evaluation (kappa >= ``slight``) and no longer does (down by more
    than 2 standard errors) while saying more than the simulator: RL has moved the policy to actions the world
    model renders as successes and reality does not (the thirteenth H200 session, door-open: kappa 0.50 -> -0.20,
    replay 0.59 against real 0.13)."""
    before = (first.get("gap_sources") or {}).get("replayed", {}).get("per_task_kappa") or {}
    now = (result.get("gap_sources") or {}).get("replayed", {})
    for task, then in before.items():
        later = (now.get("per_task_kappa") or {}).get(task)
        if then["kappa"] is None or then["kappa"] < slight or later is None:
            continue
        kappa = later["kappa"] if later["kappa"] is not None else 0.0  # constant verdicts: no agreement beyond chance
        spread = math.hypot(then["kappa_stderr"], later["kappa_stderr"] or 0.0)
        replayed, real = now["per_task"][task]["success_once"], result["real"]["per_task"][task]["success_once"]
        if then["kappa"] - kappa > 2 * spread and replayed > real:
            return (f"{EXPLOITED} on {task}: replaying the policy's real action chunks, the world model's verdicts agreed with the "
                    f"simulator's at kappa {format_kappa(then['kappa'], then['kappa_stderr'])} at iteration {first['iteration']} and "
                    f"{'-' if later['kappa'] is None else format_kappa(later['kappa'], later['kappa_stderr'])} at iteration {result['iteration']}, "
                    f"and it now says {replayed:.2f} where the simulator says {real:.2f}: RL has moved the policy to actions that the "
                    "world model renders as successes and reality does not. Hold the policy near the actions the world model knows "
                    "(rl.kl_coef > 0, a lower rl.lr, fewer iterations) or refine the world model on the evolved policy's real rollouts "
                    "(rl.refine_every within this run, or PACE between runs: `worldloop loop`)")  # fmt: skip
    return ""


def imagined_only_tasks(first: dict[str, Any], result: dict[str, Any], z: float = 3.0) -> dict[str, str]:
    """The tasks whose closed-loop imagined success has risen by more than ``z`` paired standard errors since the
    ``first`` evaluation while the real one, on the same initial states, has not risen by even one, each with
    its two changes in words ('imagined ..., real ...'); empty without per-episode verdicts."""
    imagined, real = paired_changes(first, result, "imagined"), paired_changes(first, result, "real")
    if imagined is None or real is None:
        return {}
    found = {}
    for task, change in imagined["per_task"].items():
        reality = real["per_task"].get(task)
        if reality is None or change["stderr"] == 0 or change["difference"] <= z * change["stderr"]:
            continue
        if reality["difference"] < max(reality["stderr"], 1e-12):
            found[task] = f"imagined {format_paired(change)}, real {format_paired(reality)}"
    return found


def imagined_only_gain_diagnosis(first: dict[str, Any], result: dict[str, Any], z: float = 3.0) -> str:
    """A warning when, on some task, the closed-loop imagined success has risen by more than ``z`` paired standard
    errors since the ``first`` evaluation while the real one has not risen by even one (:func:`imagined_only_tasks`):
    RL found a way of acting that the world model and the judge call success and the simulator does not
    (drawer-open in the seventeenth, twentieth, twenty-second and twenty-third H200 sessions: +6.5, +8.9, +26.7 and
    +4.1 paired SE in imagination, real flat). The replay's kappa (:func:`world_model_exploited_diagnosis`) need not fall for this."""
    found = imagined_only_tasks(first, result, z)
    if not found:
        return ""
    changes = "; ".join(f"{task} {change}" for task, change in found.items())
    return (f"{IMAGINED_ONLY} on {', '.join(found)}: from iteration {first['iteration']} to {result['iteration']}, {changes} "
            "on the same initial states: RL has found actions that the world model and the judge call success and the simulator "
            "does not. Its gains there are not real: leave the task out of training (rl.drop_imagined_only=true does so as soon "
            "as this is seen, or rl.train_tasks), hold the policy nearer the base one (rl.kl_coef), or refine the world model on "
            "the policy's real rollouts (rl.refine_every); the real | replay | imagined videos show what it imagines")  # fmt: skip


def imagination_tracking_diagnosis(result: dict[str, Any], slight: float = 0.2, min_episodes: int = 20) -> str:
    """A warning when, per episode, the imagined verdicts agree with the real ones little beyond chance
    (Cohen's kappa below ``slight``): the rates may match, but RL's reward then barely says which of
    the policy's own actions really succeed (the sixth H200 session: rates 0.325 vs 0.370, kappa -0.02); or,
    where it tracks overall, when one task with ``min_episodes`` or more does not."""
    kappa = result.get("kappa")
    if kappa is None or result["real"]["episodes"] < min_episodes:
        return ""
    if kappa >= slight:  # faithful overall, but a task may still be blind (the thirteenth H200 session: 0.50 and 0.05)
        per_task = {task: k for task, k in (result.get("per_task_kappa") or {}).items() if result["real"]["per_task"][task]["episodes"] >= min_episodes}
        blind = [task for task, k in per_task.items() if k["kappa"] is not None and k["kappa"] < slight]
        if not blind:
            return ""
        kappas = ", ".join(f"{task} {format_kappa(k['kappa'], k['kappa_stderr'])}" for task, k in per_task.items() if k["kappa"] is not None)
        return (f"{UNTRACKED} on {', '.join(blind)}: per task, kappa against the simulator {kappas}, so there RL's reward says little "
                "about which rollouts really succeed. Train on the tasks it tracks (--tasks), or look at that task's replays "
                "(`calibrate-reward --world-model`) and the world model's per-task rows (`eval-wm`)")  # fmt: skip
    return (f"{UNTRACKED}: per episode its verdicts agree with the real simulator's {result['agreement']:.2f} of the time, "
            f"{result['agreement_by_chance']:.2f} by chance alone (kappa {format_kappa(kappa, result['kappa_stderr'])}), so RL's reward "
            "says little about which rollouts really succeed. Look at the world model's action dPSNR (`eval-wm` on the policy's rollouts: "
            "does it follow the actions?) and the judge's false successes on those rollouts' replays (`calibrate-reward --world-model`)")  # fmt: skip


def real_success_fall(first: dict[str, Any], result: dict[str, Any], threshold_se: float) -> list[str]:
    """The real success rates of ``result`` (overall, then each task) that lie below ``first``'s by more than
    ``threshold_se`` standard errors of the difference, as 'name before -> after (z SE)'. The evaluations share
    their initial states, so where both kept their per-episode verdicts the difference is paired episode by
    episode (only flipped episodes count: tighter); otherwise unpaired, sqrt(se_first^2 + se^2)."""
    before, after = first["real"], result["real"]
    paired = paired_changes(first, result) or {"per_task": {}}
    pairs = [("overall", before, after, paired.get("stderr"))]
    pairs += [(task, before["per_task"][task], rates, paired["per_task"].get(task, {}).get("stderr"))
              for task, rates in after["per_task"].items() if task in before["per_task"]]  # fmt: skip
    fallen = []
    for name, then, now, paired_stderr in pairs:
        drop = then["success_once"] - now["success_once"]
        stderr = math.hypot(then["stderr"], now["stderr"]) if paired_stderr is None else paired_stderr
        if drop > 0 and drop > threshold_se * stderr:
            z = f"{-drop / stderr:+.1f} {'paired ' if paired_stderr is not None else ''}SE" if stderr > 0 else "every episode"
            fallen.append(f"{name} {then['success_once']:.3f} -> {now['success_once']:.3f} ({z})")
    return fallen


def group_starts(tasks: list[int | str], num_groups: int, group_size: int, iteration: int, seed: int) -> tuple[list, list[int]]:
    """Task and seed of every env: group g of iteration i takes task (i * num_groups + g) mod |tasks|
    and seed ``seed * 10**6 + i * num_groups + g``; its G members share both (one initial state)."""
    task_ids, seeds = [], []
    for g in range(num_groups):
        index = iteration * num_groups + g
        task_ids += [tasks[index % len(tasks)]] * group_size
        seeds += [seed * 1_000_000 + index] * group_size
    return task_ids, seeds


def results_table(evaluations: list[dict[str, Any]], history: list[dict[str, Any]] = ()) -> str:
    """Markdown: real and imagined success (± standard error) at each evaluation; with ``history`` of a run with
    rl.refine_every, its world-model refinement rounds."""
    real = "real success_once" + (" (observed through the VAE)" if any(r.get("real_through_codec") for r in evaluations) else "")
    lines = [f"| iteration | {real} | imagined success_once | agreement (chance, kappa) |", "|---|---|---|---|"]
    for result in evaluations:
        imagined = _rate(result["imagined"]) if "imagined" in result else "-"
        agreement = _agreement(result) if "agreement" in result else "-"
        lines.append(f"| {result['iteration']} | {_rate(result['real'])} | {imagined} | {agreement} |")
    lines += paired_change_rows(evaluations)
    tracked = [result for result in evaluations if result.get("tracking")]
    if tracked:
        lines += ["", "From the same initial states, how long imagination follows the real trajectory:", ""]
        lines += [f"- iteration {result['iteration']}: {tracking_line(result['tracking'])}" for result in tracked]
    sourced = [result for result in evaluations if result.get("gap_sources")]
    if sourced:
        lines += ["", "Where the gap comes from, from the same initial states (per episode against the simulator's verdicts):", ""]
        lines += [f"- iteration {result['iteration']}: {sources_line(result)}" for result in sourced]
        lines += ["", "Per task: success, and in brackets the per-episode kappa against the simulator within the task:", "",
                  "| iteration | task | real | judge on real | replay | closed loop |", "|---|---|---|---|---|---|"]
        lines += [row for result in sourced for row in sources_by_task_rows(result)]
    acted = [result for result in evaluations if result.get("imagined_actions_in_reality")]
    if acted:
        lines += ["", "The simulator driven open loop by the closed-loop imagined episodes' actions, from the same initial states:", ""]
        lines += [f"- iteration {result['iteration']}: {imagined_actions_line(result['imagined_actions_in_reality'])}" for result in acted]
    repeated = [result for result in evaluations if result.get("imagination_repeat")]
    if repeated:
        lines += ["", "The imagined episodes' actions in imagination again, from the same frames under other world-model noise:", ""]
        lines += [f"- iteration {result['iteration']}: {imagination_repeat_line(result['imagination_repeat'])}" for result in repeated]
    rounds = [h for h in history if "world_model/refine_real_success" in h]
    if rounds:
        judged = any("world_model/judge_threshold" in h for h in rounds)  # rl.judge_threshold=replay: chosen again each round
        columns = ["iteration", "real episodes so far", "their real success this round", "loss before", "loss after", "seconds"]
        lines += ["", "World-model refinement on the policy's real rollouts (rl.refine_every): the DiT's loss on each round's new clips,",
                  "on the same noise, before and after the round" + (", and the judge's threshold chosen again on the calibration's" if judged else ":")]
        if judged:
            lines.append("episodes replayed in the refined world model (kappa against the simulator):")
            columns.append("judge threshold (kappa)")
        lines += ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for h in rounds:
            before, after = h.get("world_model/refine_loss_new_before"), h.get("world_model/refine_loss_new_after")  # absent: no clip this round
            row = (f"| {h['iteration']} | {h['world_model/refine_real_episodes']:.0f} | {h['world_model/refine_real_success']:.3f} | "
                   f"{'-' if before is None else f'{before:.4f}'} | {'-' if after is None else f'{after:.4f}'} | {h['time/refine']:.0f} |")
            if judged:
                threshold, kappa = h.get("world_model/judge_threshold"), h.get("world_model/judge_replay_kappa", math.nan)
                row += " - |" if threshold is None else f" {threshold:.3f} ({'-' if math.isnan(kappa) else f'{kappa:.2f}'}) |"
            lines.append(row)
    return "\n".join(lines) + "\n"


def paired_change_rows(evaluations: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: real and imagined success (and imagined from KIR keyframes, when measured) from the first
    evaluation to the last, paired episode by episode over their shared initial states, overall and per task (none
    when the evaluations kept no per-episode verdicts)."""
    if len(evaluations) < 2:
        return []
    first, last = evaluations[0], evaluations[-1]
    changes = {source: paired_changes(first, last, source) for source in ("real", "imagined", "imagined_keyframes")}
    if changes["real"] is None:
        return []
    sources = [source for source, change in changes.items() if change is not None]
    lines = ["", f"Change from iteration {first['iteration']} to {last['iteration']}, paired over the same initial states:", "",
             "| task | " + " | ".join(sources) + " |", "|---|" + "---|" * len(sources)]  # fmt: skip
    lines.append("| overall | " + " | ".join(format_paired(changes[source]) for source in sources) + " |")
    for task in changes["real"]["per_task"]:
        cells = [format_paired(changes[source]["per_task"][task]) if task in changes[source]["per_task"] else "-" for source in sources]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return lines


def _agreement(result: dict[str, Any]) -> str:
    """'0.58 (chance 0.59, kappa -0.02 ± 0.09)'; the agreement alone where kappa is undefined (both verdicts
    constant and equal) or was not measured (runs from before it)."""
    if result.get("kappa") is None:
        return f"{result['agreement']:.2f}"
    kappa = format_kappa(result["kappa"], result["kappa_stderr"])
    return f"{result['agreement']:.2f} (chance {result['agreement_by_chance']:.2f}, kappa {kappa})"


def imagined_actions_line(acted: dict[str, Any]) -> str:
    """The simulator driven by the imagined episodes' actions: its success, overall and per task, beside its agreement
    with the imagined verdicts (kappa '-' where a task's verdicts are all alike)."""
    line = (f"the imagined episodes' actions done in the simulator: {_rate(acted)}, against the imagined verdicts kappa {_kappa(acted)}; "
            f"per task {_per_task_rates(acted)}")
    versus = acted.get("versus_closed_loop")
    if versus:  # absent in runs from before it
        line += f"\n  those actions against the policy's own in the simulator: {format_paired(versus)}; per task {_per_task_changes(versus)}"
    return line


def imagination_repeat_line(again: dict[str, Any]) -> str:
    """The imagined episodes' actions in imagination again under other noise: its success, and its kappa against the
    first imagined verdicts, overall and per task ('-' where a task's verdicts are all alike)."""
    return (f"the imagined episodes' actions in imagination again, other world-model noise: {_rate(again)}, against the first "
            f"imagined verdicts kappa {_kappa(again)} (near 1: the actions decide them; near 0: the noise does); per task {_per_task_rates(again)}")


def since_first_line(first: dict[str, Any], result: dict[str, Any]) -> str:
    """Real and closed-loop imagined success since the ``first`` evaluation, paired over the same initial states,
    overall and per task ('' for the first evaluation itself, or without per-episode verdicts)."""
    if result is first:
        return ""
    parts = []
    for source in ("real", "imagined"):
        change = paired_changes(first, result, source)
        if change is not None:
            parts.append(f"{source} {format_paired(change)}; per task {_per_task_changes(change)}")
    return f"since iteration {first['iteration']}, paired: " + " | ".join(parts) if parts else ""


def _per_task_rates(summary: dict[str, Any]) -> str:
    """'door-open-v3 0.59 (kappa -0.10 ± 0.09), ...': each task's success and its kappa."""
    return ", ".join(f"{task} {numbers['success_once']:.2f} (kappa {_kappa(summary['per_task_kappa'][task])})" for task, numbers in summary["per_task"].items())


def _per_task_changes(change: dict[str, Any]) -> str:
    """'door-open-v3 +0.133 (paired SE 0.046, +2.9 SE; 24 gained, 8 lost), ...': each task's paired change."""
    return ", ".join(f"{task} {format_paired(numbers)}" for task, numbers in change["per_task"].items())


def _kappa(numbers: dict[str, Any]) -> str:
    """'0.19 ± 0.09', or '-' where the verdicts were all alike (no kappa)."""
    return "-" if numbers["kappa"] is None else format_kappa(numbers["kappa"], numbers["kappa_stderr"])


def _rate(summary: dict[str, Any]) -> str:
    return f"{summary['success_once']:.3f} ± {summary['stderr']:.3f} (n={summary['episodes']})"


def _append(store: dict[str, list[float]], name: str, value: torch.Tensor | float) -> None:
    value = float(value.detach() if isinstance(value, torch.Tensor) else value)
    if math.isfinite(value):
        store.setdefault(name, []).append(value)

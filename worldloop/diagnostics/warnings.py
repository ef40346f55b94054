"""What a run's reality checks and updates can go wrong with, in words: each diagnosis is a pure function of the
evaluation results or an iteration's metrics, returning a warning ('' when all is well), and the stop rules' tests."""

from __future__ import annotations

import math
from typing import Any

from worldloop.rl.summary import SOURCES, paired_changes
from worldloop.utils.stats import format_kappa, format_paired


SILENT_ITERATIONS = 5  # GRPO iterations without a single informative group before the run says why
OPTIMISTIC = "the imagined environment is optimistic"
PESSIMISTIC = "the imagined environment is pessimistic"
UNTRACKED = "the imagined environment does not track reality per episode"
EXPLOITED = "the policy exploits the world model"
IMAGINED_ONLY = "success rose in imagination only"
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


def update_diagnosis(metrics: dict[str, float], iteration: int) -> str:
    """A warning when one iteration's update moved the policy far from the one that collected its
    rollouts (mean approx_kl above ``LARGE_UPDATE_KL``): the clipped ratio no longer holds it near."""
    kl = metrics.get("actor/approx_kl", 0.0)
    if kl <= LARGE_UPDATE_KL:
        return ""
    return (f"{LARGE_UPDATE}: in iteration {iteration}, approx_kl {kl:.2f} and clip fraction {metrics.get('actor/clip_fraction', 0.0):.2f} "
            "(healthy updates stay below ~0.05). A confident policy under a fresh optimizer does this in the first iterations "
            "(docs/experiments/2026-12-01-first-rl-update-too-large.md; the learning rate warms up over "
            "worldloop.rl.trainer.LR_WARMUP_STEPS optimizer steps): lower rl.lr")  # fmt: skip


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


def world_model_exploited_diagnosis(first: dict[str, Any], result: dict[str, Any], slight: float = 0.2) -> str:
    """A warning when, on some task, the world model replaying the policy's real actions agreed with the
    simulator per episode at the ``first`` evaluation (kappa >= ``slight``) and no longer does (down by more
    than 2 standard errors) while saying more than the simulator: RL has moved the policy to actions the world
    model renders as successes and reality does not (the 2026-12-02 replay-calibrated-judge run, door-open: kappa 0.50 -> -0.20,
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
                    "(rl.refine.every within this run, or PACE between runs: `worldloop loop`)")  # fmt: skip
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
    (drawer-open in four H200 runs of 2026-12-02 and 2026-12-03: +6.5, +8.9, +26.7 and
    +4.1 paired SE in imagination, real flat). The replay's kappa (:func:`world_model_exploited_diagnosis`) need not fall for this."""
    found = imagined_only_tasks(first, result, z)
    if not found:
        return ""
    changes = "; ".join(f"{task} {change}" for task, change in found.items())
    return (f"{IMAGINED_ONLY} on {', '.join(found)}: from iteration {first['iteration']} to {result['iteration']}, {changes} "
            "on the same initial states: RL has found actions that the world model and the judge call success and the simulator "
            "does not. Its gains there are not real: leave the task out of training (rl.train_tasks, --tasks), hold the policy nearer the "
            "base one (rl.kl_coef), or refine the world model on "
            "the policy's real rollouts (rl.refine.every); the real | replay | imagined videos show what it imagines")  # fmt: skip


def imagination_tracking_diagnosis(result: dict[str, Any], slight: float = 0.2, min_episodes: int = 20) -> str:
    """A warning when, per episode, the imagined verdicts agree with the real ones little beyond chance
    (Cohen's kappa below ``slight``): the rates may match, but RL's reward then barely says which of
    the policy's own actions really succeed (the 2026-12-01 rates-match-verdicts-do-not run: rates 0.325 vs 0.370, kappa -0.02); or,
    where it tracks overall, when one task with ``min_episodes`` or more does not."""
    kappa = result.get("kappa")
    if kappa is None or result["real"]["episodes"] < min_episodes:
        return ""
    if kappa >= slight:  # faithful overall, but a task may still be blind (the 2026-12-02 replay-calibrated-judge run: 0.50 and 0.05)
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

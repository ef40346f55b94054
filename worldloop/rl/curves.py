"""One PNG of an RL run (``OUT/curves.png``): what the real simulator and the imagined environment say
at each evaluation, per task, what training saw in imagination at every iteration, and how far each
update moved the policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_curves(results: dict[str, Any], path: str | Path) -> Path:
    """Left: real success_once per task (± standard error) at each evaluation, imagined from the same
    initial states dashed (from KIR keyframes dotted, when measured), the judge on the real frames (^) and the
    world model replaying the real actions (x).
    Right: per training iteration, the imagined success_once (overall, and from first frames and from KIR
    keyframes apart), the share of groups kept by GRPO and the share that were all-success (the signal RL
    had); with rl.refine.every, the real success of each refinement round's rollouts (diamonds). Third:
    approx_kl, clip_fraction and approx_kl before the update (rollout vs update numerics) per iteration, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from worldloop.utils.io import save_figure

    evaluations, history = results["evaluations"], results["history"]
    fig, (left, right, update) = plt.subplots(1, 3, figsize=(15, 3.8))
    tasks = list(evaluations[0]["real"]["per_task"]) if evaluations else []
    for index, task in enumerate(tasks):
        colour = f"C{index}"
        iterations = [e["iteration"] for e in evaluations]
        real = [e["real"]["per_task"][task] for e in evaluations]
        left.errorbar(iterations, [r["success_once"] for r in real], yerr=[r["stderr"] for r in real], fmt="o-", color=colour, capsize=2,
                      label=f"{task}: real (n={real[0]['episodes']})")  # fmt: skip
        if all("imagined" in e for e in evaluations):
            imagined = [e["imagined"]["per_task"][task]["success_once"] for e in evaluations]
            left.plot(iterations, imagined, "s--", color=colour, label=f"{task}: imagined")
        if all("imagined_keyframes" in e for e in evaluations):  # from KIR keyframes of the task
            from_keyframes = [e["imagined_keyframes"]["per_task"][task]["success_once"] for e in evaluations]
            left.plot(iterations, from_keyframes, "d:", color=colour, label=f"{task}: imagined from keyframes")
        for name, marker in (("judged_real", "^"), ("replayed", "x")):  # where the gap comes from (RealityCheck)
            if all(name in e.get("gap_sources", {}) for e in evaluations):
                rates = [e["gap_sources"][name]["per_task"][task]["success_once"] for e in evaluations]
                left.plot(iterations, rates, marker, color=colour, linestyle="none", label=f"{task}: {name}")
    left.set(xlabel="RL iteration", ylabel="success_once", ylim=(-0.03, 1.03), title="evaluations")
    if tasks:
        left.legend(fontsize=7)
    if history:
        steps = [h["iteration"] for h in history]
        for name, style in (("env/success_once", "-"), ("rollout/kept_groups", "-"), ("rollout/groups_all_success", ":")):
            if all(name in h for h in history):
                right.plot(steps, [h[name] for h in history], style, label=name)
        for name, style in (("env/success_once_first_frame", "--"), ("env/success_once_keyframe", "-.")):  # by kind of start (KIR)
            points = [(h["iteration"], h[name]) for h in history if name in h]
            if points:
                right.plot(*zip(*points), style, linewidth=0.8, label=name)
        rounds = [h for h in history if "world_model/refine_real_success" in h]  # rl.refine.every: the same policy in reality
        if rounds:
            right.plot([h["iteration"] for h in rounds], [h["world_model/refine_real_success"] for h in rounds], "D", color="k",
                       label="refinement rollouts: real success (training temperature)")  # fmt: skip
        right.legend(fontsize=7)
    right.set(xlabel="RL iteration", ylim=(-0.03, 1.03), title="training rollouts (in the training environment)")
    for name in ("actor/approx_kl", "actor/clip_fraction", "actor/approx_kl_before_update"):
        points = [(h["iteration"], h[name]) for h in history if h.get(name, 0) > 0]
        if points:
            update.plot(*zip(*points), "o-", markersize=2, label=name)
    update.set(xlabel="RL iteration", yscale="log", title="update size")
    if update.lines:
        update.legend(fontsize=7)
    return save_figure(fig, path, dpi=110)

"""One PNG of an RL run (``OUT/curves.png``): what the real simulator and the imagined environment say
at each evaluation, per task, and what training saw in imagination at every iteration."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_curves(results: dict[str, Any], path: str | Path) -> Path:
    """Left: real success_once per task (± standard error) at each evaluation, imagined from the same
    initial states dashed. Right: per training iteration, the imagined success_once, the share of
    groups kept by GRPO and the share that were all-success (the signal RL had)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from worldloop.utils.io import atomic_path

    evaluations, history = results["evaluations"], results["history"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
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
    left.set(xlabel="RL iteration", ylabel="success_once", ylim=(-0.03, 1.03), title="evaluations")
    if tasks:
        left.legend(fontsize=7)
    if history:
        steps = [h["iteration"] for h in history]
        for name, style in (("env/success_once", "-"), ("rollout/kept_groups", "-"), ("rollout/groups_all_success", ":")):
            if all(name in h for h in history):
                right.plot(steps, [h[name] for h in history], style, label=name)
        right.legend(fontsize=7)
    right.set(xlabel="RL iteration", ylim=(-0.03, 1.03), title="training rollouts (in the training environment)")
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path

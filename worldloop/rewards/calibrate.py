"""Calibrating a judge on labelled windows of real trajectories (``worldloop calibrate-reward``).

Every fourth labelled frame of each episode ends one window (labels.py, scoring.WINDOW_STRIDE); the judge
scores all windows in batches. Reported in ``OUT/metrics.json``:

- ``auroc``: does the score rank success windows above failure windows;
- ``at_threshold``: precision, recall and trigger rate (share of windows judged success) at the
  judge's own threshold, i.e. how often it would end an imagined episode;
- ``suggested_threshold``: the probabilities that maximise F1 and Youden's J on these windows;
- ``value_order_correlation``: Spearman between score and time within successful episodes
  (TOPReward's VOC; a progress-aware judge rises along a successful trajectory);
- ``OUT/histogram.png``: P(success) of success vs failure windows, with the threshold marked;
- with a world model (``--world-model``): the same episodes replayed in it and judged on the
  imagined frames, against the simulator's labels (``world_model`` in metrics.json, agreement.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from worldloop.rewards.agreement import judge_in_imagination
from worldloop.rewards.metrics import kappa_curve
from worldloop.rewards.scoring import WINDOW_STRIDE, calibration_metrics, score_windows  # noqa: F401  (score_windows: re-exported)
from worldloop.rewards.protocol import Judge
from worldloop.utils.io import atomic_path, atomic_write_json, save_figure


def plot_histogram(table: dict[str, np.ndarray], threshold: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    probability, labels = table["probability"], table["success"].astype(bool)
    figure, axis = plt.subplots(figsize=(6, 3.5), dpi=120)
    bins = np.linspace(0.0, 1.0, 41)
    axis.hist(probability[~labels], bins=bins, alpha=0.6, label=f"failure windows (n={int((~labels).sum())})", color="tab:red")
    axis.hist(probability[labels], bins=bins, alpha=0.6, label=f"success windows (n={int(labels.sum())})", color="tab:green")
    axis.axvline(threshold, color="black", linestyle="--", label=f"threshold {threshold:.2f}")
    axis.set_xlabel("judge P(success)")
    axis.set_ylabel("windows")
    axis.set_yscale("log")
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=7)
    save_figure(figure, path)


def plot_kappa_by_threshold(scores: Sequence[float], success: Sequence[bool], tasks: Sequence[str], marks: dict[str, float], path: Path,
                            title: str, task_marks: dict[str, float | None] | None = None) -> None:  # fmt: skip
    """Per-episode agreement with the simulator beyond chance (Cohen's kappa) at every threshold: overall, with
    chance within tasks, and each task's own; ``marks`` (label -> threshold) as vertical lines, ``task_marks``
    (task -> its own threshold, None: none) in the task's colour. Where every curve stays at or under 0, no
    threshold lets the judge tell successes from failures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def clip(threshold):  # the logit axis excludes 0 and 1
        return np.clip(threshold, 1e-6, 1 - 1e-6)

    scores, success, tasks = np.asarray(scores, dtype=np.float64), np.asarray(success, dtype=bool), np.asarray(tasks)
    figure, axis = plt.subplots(figsize=(7, 3.8), dpi=120)
    curves = [("overall", np.ones(len(scores), dtype=bool))] + [(task, tasks == task) for task in dict.fromkeys(tasks.tolist())]
    colour = {}
    for name, mine in curves:
        candidates, verdicts = kappa_curve(scores[mine], success[mine], tasks[mine])
        kappa = np.array([np.nan if v["kappa"] is None else v["kappa"] for v in verdicts])
        (line,) = axis.plot(clip(candidates), kappa, drawstyle="steps-post", linewidth=2.0 if name == "overall" else 1.0,
                            color="black" if name == "overall" else None, label=f"{name} (n={int(mine.sum())})")  # fmt: skip
        colour[name] = line.get_color()
    for (label, threshold), style in zip(marks.items(), ("--", ":", "-.")):
        axis.axvline(clip(threshold), color="gray", linestyle=style, label=f"{label} {threshold:.4f}")
    for task, threshold in (task_marks or {}).items():
        if threshold is not None and task in colour:
            axis.axvline(clip(threshold), color=colour[task], linestyle=":", linewidth=1.0, label=f"{task}'s own {threshold:.4f}")
    axis.axhline(0.0, color="gray", linewidth=0.5)
    axis.set_xscale("logit")
    axis.set_xlabel("threshold on the episode's replay score")
    axis.set_ylabel("kappa against the simulator")
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=6)
    save_figure(figure, path)


def calibrate(
    judge: Judge, episodes: Iterable[Any], out: str | Path, judge_name: str, world_model: Any = None, seed: int = 0, stride: int = WINDOW_STRIDE
) -> dict:
    """Score, measure, plot; writes ``out/metrics.json`` and ``out/histogram.png``. With a
    ``world_model``, the same episodes replayed in it are judged too (agreement.py): the result
    goes under ``metrics["world_model"]``, the histogram to ``out/histogram_imagined.png``. ``stride``: frames
    between judged windows (1: every frame, as the tests' short episodes need)."""
    out = Path(out)
    if world_model is not None:
        episodes = list(episodes)  # judged twice: real, then replayed (otherwise streamed once)
    start = time.perf_counter()
    table = score_windows(judge, episodes, stride)
    seconds = time.perf_counter() - start
    metrics = {"judge": judge_name, "window": judge.window, **calibration_metrics(table, judge.threshold)}
    metrics["windows_per_second"] = metrics["windows"] / seconds
    auc = "n/a" if metrics["auroc"] is None else f"{metrics['auroc']:.3f}"
    plot_histogram(table, judge.threshold, out / "histogram.png", f"{judge_name}  AUROC {auc}")
    if world_model is not None:
        metrics["world_model"], imagined = judge_in_imagination(judge, world_model, episodes, table, seed, stride)
        auc = metrics["world_model"]["imagined"]["auroc"]
        title = f"{judge_name} on imagined frames  AUROC {'n/a' if auc is None else f'{auc:.3f}'}"
        plot_histogram(imagined, judge.threshold, out / "histogram_imagined.png", title)
    with atomic_path(out / "scores.npz") as tmp, open(tmp, "wb") as handle:
        np.savez_compressed(handle, **table)
    atomic_write_json(out / "metrics.json", metrics)
    return metrics

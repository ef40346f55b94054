"""A judge's scores on labelled windows, and how well they separate success from failure (calibrate-reward)."""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from worldloop.rewards.labels import labelled_windows
from worldloop.rewards.metrics import at_threshold, auroc, suggest_thresholds, value_order_correlation
from worldloop.rewards.protocol import Judge


WINDOW_STRIDE = 4
"""Frames between consecutive judged windows within an episode (the last labelled frame always ends one)."""
JUDGE_BATCH = 64
"""Windows scored per judge call (TOPReward splits them further at reward.topreward.max_batch), and episodes replayed
at once in a world model (`calibrate-reward --world-model`)."""


def score_windows(judge: Judge, episodes: Iterable[Any], stride: int = WINDOW_STRIDE) -> dict[str, np.ndarray]:
    """Score the labelled windows that end at every ``stride``-th labelled frame of each episode; returns per-window
    arrays (score, probability, label, episode, time)."""
    from tqdm import tqdm

    columns: dict[str, list] = {"score": [], "probability": [], "success": [], "episode": [], "time": [], "episode_success": []}
    for batch in tqdm(labelled_windows(episodes, judge.window, stride, JUDGE_BATCH), desc="calibrate-reward", unit="batch"):
        scores = judge.score(batch.windows.to(judge.device), batch.instructions)
        columns["score"].append(scores.float().cpu().numpy())
        columns["probability"].append(judge.probability(scores).float().cpu().numpy())
        columns["success"].append(batch.success.numpy())
        columns["episode"].append(batch.episode.numpy())
        columns["time"].append(batch.time.numpy())
        columns["episode_success"].append(batch.episode_success.numpy())
    if not columns["score"]:
        raise ValueError("calibrate-reward: the episodes hold no labelled window")
    return {key: np.concatenate(values) for key, values in columns.items()}


def calibration_metrics(table: dict[str, np.ndarray], threshold: float) -> dict:
    probability, labels = table["probability"], table["success"].astype(bool)
    successful = table["episode_success"].astype(bool)
    return {
        "windows": int(len(labels)),
        "success_windows": int(labels.sum()),
        "episodes": int(len(np.unique(table["episode"]))),
        "auroc": auroc(probability, labels),
        "at_threshold": at_threshold(probability, labels, threshold),
        "suggested_threshold": suggest_thresholds(probability, labels),
        "value_order_correlation": value_order_correlation(table["score"][successful], table["time"][successful], table["episode"][successful]),
        "probability_mean": {
            "success": float(probability[labels].mean()) if labels.any() else None,
            "failure": float(probability[~labels].mean()) if (~labels).any() else None,
        },
    }

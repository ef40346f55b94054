"""How far a judge can be trusted: ranking, decisions at a threshold, order within episodes.

Plain numpy (no scikit-learn or scipy needed on the GPU host).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from worldloop.utils.stats import agreement_beyond_chance, kappa_above_chance


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties sharing their mean rank."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    first = np.r_[True, sorted_values[1:] != sorted_values[:-1]]  # start of each tie group
    group = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(values)]
    mean_rank = (starts + ends + 1) / 2.0  # mean of ranks start+1 .. end
    ranks = np.empty(len(values))
    ranks[order] = mean_rank[group]
    return ranks


def auroc(probabilities: np.ndarray, labels: np.ndarray) -> float | None:
    """Area under the ROC curve (Mann-Whitney U / (n_pos n_neg)); None when one class is absent."""
    labels = np.asarray(labels, dtype=bool)
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        return None
    ranks = average_ranks(probabilities)
    return float((ranks[labels].sum() - positives * (positives + 1) / 2.0) / (positives * negatives))


def at_threshold(probabilities: np.ndarray, labels: np.ndarray, threshold: float) -> dict[str, float | None]:
    """Precision, recall, F1, trigger rate (share judged success) and false-positive rate at ``threshold``."""
    labels = np.asarray(labels, dtype=bool)
    fired = np.asarray(probabilities) >= threshold
    true_positive = int((fired & labels).sum())
    precision = true_positive / int(fired.sum()) if fired.any() else None
    recall = true_positive / int(labels.sum()) if labels.any() else None
    f1 = 2 * precision * recall / (precision + recall) if precision and recall else 0.0
    return {
        "threshold": float(threshold),
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "trigger_rate": float(fired.mean()) if len(fired) else None,
        "false_positive_rate": float((fired & ~labels).sum() / (~labels).sum()) if (~labels).any() else None,
    }


def suggest_thresholds(probabilities: np.ndarray, labels: np.ndarray) -> dict[str, float | None]:
    """Thresholds (among the observed probabilities) that maximise F1 and Youden's J = TPR - FPR."""
    labels = np.asarray(labels, dtype=bool)
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        return {"max_f1": None, "youden": None}
    probabilities = np.asarray(probabilities, dtype=np.float64)
    order = np.argsort(-probabilities, kind="mergesort")
    p, y = probabilities[order], labels[order]
    last_of_value = np.r_[p[1:] != p[:-1], True]  # "fire when >= p[i]" includes all ties of p[i]
    true_pos = np.cumsum(y)[last_of_value]
    fired = (np.arange(1, len(p) + 1))[last_of_value]
    thresholds = p[last_of_value]
    precision, recall = true_pos / fired, true_pos / positives
    f1 = 2 * precision * recall / np.maximum(precision + recall, 1e-12)
    youden = recall - (fired - true_pos) / negatives
    return {"max_f1": float(thresholds[np.argmax(f1)]), "youden": float(thresholds[np.argmax(youden)])}


def per_episode(episode: np.ndarray, scores: np.ndarray, success: np.ndarray, scored: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """Frames or windows grouped by ``episode`` id: the sorted ids, each item's position among them, and per
    episode the highest of ``scores`` over the ``scored`` items (all by default; 0 where none is) and
    whether any item is a ``success``. Vectorised: no loop over episodes."""
    ids, number = np.unique(episode, return_inverse=True)
    scores = np.asarray(scores)
    scored = np.ones(len(scores), dtype=bool) if scored is None else scored
    best = np.zeros(len(ids), dtype=scores.dtype)
    np.maximum.at(best, number[scored], scores[scored])
    succeeded = np.zeros(len(ids), dtype=bool)
    np.logical_or.at(succeeded, number, np.asarray(success, dtype=bool))
    return ids, number, best, succeeded


def streak_scores(probabilities: Sequence[Sequence[float]], success_chunks: int) -> np.ndarray:
    """Per episode (its verdicts' P(success) in order), the highest threshold at which ``success_chunks`` consecutive
    verdicts all pass (the best over its windows of their lowest P; 0 for an episode with fewer verdicts): judged a
    success at threshold t iff score >= t. One high verdict alone makes no success when ``success_chunks`` > 1."""
    scores = np.zeros(len(probabilities))
    for i, verdicts in enumerate(probabilities):
        p = np.asarray(verdicts, dtype=np.float64)
        if len(p) >= success_chunks:
            scores[i] = np.lib.stride_tricks.sliding_window_view(p, success_chunks).min(axis=1).max()
    return scores


def episode_verdict_metrics(success: np.ndarray, judged: np.ndarray, strata: list) -> dict[str, Any]:
    """Per-episode success_once verdicts against the simulator's: both rates, agreement, the agreement chance
    gives within each stratum (task), Cohen's kappa, and the false successes (what RL would be paid for)
    and missed ones."""
    success, judged = np.asarray(success, dtype=bool), np.asarray(judged, dtype=bool)
    beyond_chance = agreement_beyond_chance(success, judged, strata)
    return {
        "count": int(len(success)),
        "real_success_once": float(success.mean()),
        "judged_success_once": float(judged.mean()),
        **{key: beyond_chance[key] for key in ("agreement", "chance", "kappa", "kappa_stderr")},
        "false_success": int((judged & ~success).sum()),
        "missed_success": int((success & ~judged).sum()),
    }


def kappa_curve(scores: np.ndarray, success: np.ndarray, strata) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Every observed score as a threshold (ascending) and, at each, how the verdicts ``score >= threshold``
    agree with ``success`` beyond chance within each stratum (:func:`agreement_beyond_chance`)."""
    scores = np.asarray(scores, dtype=np.float64)
    candidates = np.unique(scores)
    return candidates, [agreement_beyond_chance(success, scores >= candidate, list(strata)) for candidate in candidates]


def max_kappa_threshold(scores: np.ndarray, success: np.ndarray, strata: np.ndarray, tolerance_se: float = 0.0,
                        significance_se: float = 0.0) -> float | None:  # fmt: skip
    """The threshold (among the observed per-episode ``scores``) whose verdicts ``score >= threshold``
    agree with the episodes' ``success`` most beyond chance: Cohen's kappa, with chance taken within
    each stratum (task). Of thresholds whose kappa lies within ``tolerance_se`` standard errors of the
    best one's, the highest (the one-standard-error rule with 1.0): the fewest false successes, which
    RL would be paid for, among those the data cannot tell apart.

    Only thresholds whose kappa is above 0 by more than ``significance_se`` of its standard errors take
    part: where none agrees beyond chance, the highest threshold (the judge passes one episode, kappa
    near 0) would otherwise be the best and be chosen, and the judge would never say success again (the
    2026-12-02 judge-never-says-success run: kappa -0.13 at the trained threshold, 0.999 chosen, no success judged even on
    real frames). None then, and when the episodes all succeed or all fail (judging them all alike agrees
    perfectly but has no kappa, and any other threshold only looks as good by chance)."""
    scores, success = np.asarray(scores, dtype=np.float64), np.asarray(success, dtype=bool)
    if success.all() or not success.any():
        return None
    candidates, verdicts = kappa_curve(scores, success, strata)
    beyond_chance = [(float(c), v["kappa"], v["kappa_stderr"]) for c, v in zip(candidates, verdicts)
                     if kappa_above_chance(v["kappa"], v["kappa_stderr"], significance_se)]  # fmt: skip
    if not beyond_chance:
        return None
    _, best_kappa, best_stderr = max(beyond_chance, key=lambda d: (d[1], d[0]))
    floor = best_kappa - tolerance_se * best_stderr
    return max(candidate for candidate, kappa, _ in beyond_chance if kappa >= floor - 1e-12)


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman rank correlation; None when either side is constant."""
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = np.sqrt((rx**2).sum() * (ry**2).sum())
    return float((rx * ry).sum() / denominator) if denominator > 0 else None


def value_order_correlation(scores: np.ndarray, times: np.ndarray, episodes: np.ndarray) -> dict[str, float | None]:
    """Value-Order Correlation: Spearman between score and time within each episode, averaged over
    episodes (a judge that tracks progress rises along a successful episode: VOC near 1)."""
    values = []
    for episode in np.unique(episodes):
        mask = episodes == episode
        if mask.sum() >= 3:
            value = spearman(scores[mask], times[mask])
            if value is not None:
                values.append(value)
    if not values:
        return {"mean": None, "std": None, "episodes": 0}
    return {"mean": float(np.mean(values)), "std": float(np.std(values)), "episodes": len(values)}

"""Does the judge agree with reality on world-model frames? (``calibrate-reward --world-model``)

In imagination the judge sees generated frames, and its verdicts end episodes and pay rewards. So
the number that matters is not its AUROC on real frames but how its verdicts on *imagined* frames
compare with the real simulator's labels for the same actions. Each labelled real episode is
replayed open loop in the world model (its real first frame, then its recorded actions; no real
frame fed back, as in ``eval-wm``), the imagined copy keeps the real labels and instruction, and
both copies are scored window by window (same episode, same time). Reported:

- ``imagined``: the calibration metrics of the imagined windows against the simulator's labels;
- ``window_verdict_agreement``: share of windows where the verdict (probability >= threshold) on
  the imagined frames equals the verdict on the real ones;
- ``episodes``: per episode, success_once as the simulator says and as the judge says on the
  imagined frames: agreement, the agreement that chance alone gives at those rates within each task
  and Cohen's kappa, false successes (the judge would pay for a failure: what RL learns to exploit)
  and missed successes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from worldloop.rewards.scoring import JUDGE_BATCH, WINDOW_STRIDE, calibration_metrics, score_windows
from worldloop.rewards.metrics import episode_verdict_metrics, per_episode
from worldloop.rewards.protocol import Judge


def imagined_episodes(model: Any, episodes: Sequence[Any], batch: int = JUDGE_BATCH, seed: int = 0) -> list[Any]:
    """Each episode with its frames 1.. replaced by the world model's open-loop replay of its actions."""
    from worldloop.worldmodel.evaluate import open_loop

    imagined = []
    for start in range(0, len(episodes), batch):
        group = episodes[start : start + batch]
        horizon = max(len(e.frames) - 1 for e in group)
        if horizon < 1:
            imagined += list(group)
            continue
        _, generated, _, _ = open_loop(model, group, horizon, seed + start)
        for i, episode in enumerate(group):
            first = np.asarray(episode.frames[:1])
            frames = np.concatenate([first, generated[i, : len(episode.frames) - 1].numpy()])
            imagined.append(dataclasses.replace(episode, frames=frames))
    return imagined


def episode_verdicts(table: dict[str, np.ndarray], threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The episode ids (sorted) and, per episode, the simulator's success and whether any window crossed the threshold."""
    ids, _, best, real = per_episode(table["episode"], table["probability"], table["episode_success"])
    return ids, real, best >= threshold


def agreement_metrics(
    real: dict[str, np.ndarray], imagined: dict[str, np.ndarray], threshold: float, tasks: dict[int, str] | None = None
) -> dict[str, Any]:
    """Compare the judge on imagined windows with its verdicts on the real ones and with the simulator;
    ``tasks`` (episode index -> instruction) makes chance agreement per task, else over all episodes."""
    if not (np.array_equal(real["episode"], imagined["episode"]) and np.array_equal(real["time"], imagined["time"])):
        raise ValueError("real and imagined windows must be the same (episode, time) pairs in the same order")
    verdict_real, verdict_imagined = real["probability"] >= threshold, imagined["probability"] >= threshold
    ids, success, judged = episode_verdicts(imagined, threshold)
    episodes = episode_verdict_metrics(success, judged, [tasks[int(i)] for i in ids] if tasks else [""] * len(ids))
    episodes["imagined_judged_success_once"], episodes["agreement_by_chance"] = episodes.pop("judged_success_once"), episodes.pop("chance")
    return {
        "threshold": threshold,
        "imagined": calibration_metrics(imagined, threshold),
        "window_verdict_agreement": float((verdict_real == verdict_imagined).mean()),
        "episodes": episodes,
    }


def judge_in_imagination(
    judge: Judge, model: Any, episodes: Sequence[Any], real: dict[str, np.ndarray], seed: int = 0, stride: int = WINDOW_STRIDE
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Replay ``episodes`` in ``model`` and score the imagined windows (every ``stride``-th, as ``real``); returns the
    comparison with ``real`` (the same episodes' real window scores) and the imagined windows' table."""
    imagined = score_windows(judge, imagined_episodes(model, episodes, seed=seed), stride)
    tasks = {int(episode.index): episode.instruction for episode in episodes}
    return agreement_metrics(real, imagined, judge.threshold, tasks), imagined

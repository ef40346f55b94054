"""The fidelity gate (``worldloop gate``, before RL in the loop): does the world model, read by the judge, agree with
the simulator, task by task? Measured so that a skeptic accepts the verdict:

    per task, N real episodes of the starting policy (initial states apart from every evaluation's)
    -> the judge's P(success) at every chunk's end, on the real frames and on the episode replayed open loop in the
       world model (its real first frame, then its own action chunks)
    -> each task's episodes dealt alternately into a calibration half and an evaluation half (never both)
    -> the episode rule (success once ``success_chunks`` consecutive verdicts pass) and its threshold(s), chosen on
       the calibration half: one for every task, or each task its own (``per_task``)
    -> on the evaluation half alone: per task, Cohen's kappa of the replays' verdicts against the simulator's with a
       bootstrap 95 % interval, the AUROC of the replays' scores, imagined against real success; the judge's kappa on
       the real frames (the judge alone)
    -> a task passes when its kappa is at least ``min_kappa`` and its interval's lower bound above ``min_lower``.

Every per-chunk probability is kept (gate_episodes.json), so the verdicts, and the comparison of the other episode
rules (:func:`compare_rules`: what the chosen rule beat, or lost to), how the judge ranks each task's episodes
(:func:`ranking`) and where the replays part from the real frames (:func:`replays_by_chunk`) are rebuilt from the
folder's small files by ``worldloop analyse GATE`` without a GPU. RL in the loop then trains on the passing tasks with exactly this judge, rule
and threshold(s) (``worldloop rl --gate GATE``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from worldloop.rewards.metrics import auroc, max_kappa_threshold, streak_scores as episode_scores
from worldloop.utils.io import atomic_write_json, atomic_write_text, read_json
from worldloop.utils.stats import agreement_beyond_chance, fixed, format_kappa, rate_with_stderr

CALIBRATION, EVALUATION = "calibration", "evaluation"
RESAMPLES = 2000
"""Bootstrap resamples of a task's evaluation episodes for the 95 % intervals of its kappa and AUROC."""
CALIBRATE_ON = ("replays", "real_frames")
RATE_TOLERANCE = 0.10
"""How far the base policy's success judged on replays may lie from its real success on a task that meets the bar
(gate.md says how many do): a gate a skeptic accepts puts imagination's success rate within it."""
RULES_COMPARED = ((2, False, "real_frames"), (2, True, "real_frames"),
                  (1, False, "replays"), (2, False, "replays"), (3, False, "replays"), (4, False, "replays"),
                  (1, True, "replays"), (2, True, "replays"), (3, True, "replays"))  # fmt: skip
"""(success_chunks, per_task, calibrate_on) of the episode rules every gate also scores on the same split, beside its own."""


@dataclass
class GateEpisodes:
    """Per real episode of the gate: its task, the simulator's verdict, and the judge's P(success) at the end of every
    chunk the episode ran, on the world model's replay and on the real frames."""

    task: list[str]
    real: list[bool]
    replay: list[list[float]]
    frames: list[list[float]]

    def __post_init__(self):
        if not len(self.task) == len(self.real) == len(self.replay) == len(self.frames):
            raise ValueError(f"gate episodes: {len(self.task)} tasks, {len(self.real)} verdicts, {len(self.replay)} replays, {len(self.frames)} real")

    def save(self, path: str | Path) -> None:
        atomic_write_json(path, asdict(self))

    @classmethod
    def load(cls, path: str | Path) -> GateEpisodes:
        saved = read_json(path)
        return cls(list(saved["task"]), [bool(r) for r in saved["real"]], saved["replay"], saved["frames"])


@dataclass(frozen=True)
class GateRule:
    """How the gate reads an episode and when a task passes."""

    success_chunks: int = 1
    """An episode is judged a success once this many consecutive chunk-end verdicts pass (rl.success_chunks)."""
    per_task: bool = False
    """Each task's calibration episodes choose its own threshold (the one for all where they cannot)."""
    min_kappa: float | None = 0.6
    """A task's evaluation kappa must reach this; None: the gate measures and every task passes."""
    min_lower: float = 0.3
    """... and the lower bound of its bootstrap 95 % interval must lie above this."""
    tolerance_se: float = 1.0
    """The threshold: the highest whose calibration kappa lies within this many SE of the best (reward.calibrate)."""
    significance_se: float = 2.0
    """... among those more than this many SE above chance (reward.calibrate)."""
    calibrate_on: str = "replays"
    """The calibration episodes' scores the threshold(s) are chosen on: their replays' (what RL reads) or their real
    frames' ("real_frames": the judge's own threshold, read on replays all the same)."""

    def __post_init__(self):
        if self.calibrate_on not in CALIBRATE_ON:
            raise ValueError(f"the gate's thresholds are chosen on {' or '.join(CALIBRATE_ON)}, not {self.calibrate_on!r}")


def split(tasks: Sequence[str]) -> list[str]:
    """Each episode's half: within each task, its episodes in order go calibration, evaluation, calibration, ... so
    both halves hold every task and no episode is in both."""
    seen: dict[str, int] = {}
    halves = []
    for task in tasks:
        halves.append(CALIBRATION if seen.get(task, 0) % 2 == 0 else EVALUATION)
        seen[task] = seen.get(task, 0) + 1
    return halves


def bootstrap_kappa(real: Sequence[bool], judged: Sequence[bool], resamples: int | None = RESAMPLES, seed: int = 0,
                    level: float = 0.95) -> tuple[float, float] | None:  # fmt: skip
    """The percentile bootstrap interval of Cohen's kappa over episodes resampled with replacement (``resamples`` of
    them, seeded; None: every one of the n**n resamples, exact for small n). A resample whose kappa is undefined (both
    verdicts constant and equal) is left out; None when every one is. The bounds are the empirical quantiles
    (inverted CDF) at (1 - level) / 2 and (1 + level) / 2."""
    real, judged = np.asarray(real, dtype=bool), np.asarray(judged, dtype=bool)
    n = len(real)
    if n == 0:
        return None
    if resamples is None:
        index = np.stack(np.meshgrid(*[np.arange(n)] * n, indexing="ij"), axis=-1).reshape(-1, n)
    else:
        index = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    a, b = real[index], judged[index]
    agreement = (a == b).mean(axis=1)
    p, q = a.mean(axis=1), b.mean(axis=1)
    chance = p * q + (1 - p) * (1 - q)
    defined = chance < 1.0 - 1e-12
    if not defined.any():
        return None
    kappa = (agreement[defined] - chance[defined]) / (1.0 - chance[defined])
    low, high = np.quantile(kappa, [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")
    return float(low), float(high)


def bootstrap_auroc(scores: Sequence[float], real: Sequence[bool], resamples: int = RESAMPLES, seed: int = 0,
                    level: float = 0.95) -> tuple[float, float] | None:  # fmt: skip
    """The percentile bootstrap interval of the AUROC of ``scores`` against ``real`` over episodes resampled with
    replacement, as :func:`bootstrap_kappa` (a resample with one class only is left out; None when every one is)."""
    scores, real = np.asarray(scores, dtype=np.float64), np.asarray(real, dtype=bool)
    if len(real) == 0:
        return None
    index = np.random.default_rng(seed).integers(0, len(real), size=(resamples, len(real)))
    s, r = scores[index], real[index]
    pairs = r[:, :, None] & ~r[:, None, :]  # (resample, success i, failure j)
    wins = ((s[:, :, None] > s[:, None, :]) + 0.5 * (s[:, :, None] == s[:, None, :])) * pairs
    count = pairs.sum(axis=(1, 2))
    defined = count > 0
    if not defined.any():
        return None
    low, high = np.quantile(wins.sum(axis=(1, 2))[defined] / count[defined], [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")
    return float(low), float(high)


def ranking(episodes: GateEpisodes, gate: dict[str, Any], seed: int = 0) -> dict[str, dict[str, Any]]:
    """Per task, how the judge ranks the evaluation episodes by their episode scores (the gate's rule): the AUROC on the
    replays and on the real frames, each with its bootstrap 95 % interval. A judge that ranks real episodes right but
    not their replays is let down by the world model, not by its threshold; a reward that needs a ranking only (a
    group-relative advantage) can use what these intervals show."""
    chunks = gate["rule"]["success_chunks"]
    tasks, real = np.asarray(episodes.task), np.asarray(episodes.real, dtype=bool)
    evaluating = np.asarray(split(episodes.task)) == EVALUATION
    scores = {"replays": episode_scores(episodes.replay, chunks), "real_frames": episode_scores(episodes.frames, chunks)}
    rows = {}
    for task in dict.fromkeys(episodes.task):
        mine = evaluating & (tasks == task)
        rows[task] = {f"{name}_{key}": value for name, score in scores.items()
                      for key, value in (("auroc", auroc(score[mine], real[mine])), ("auroc_interval", bootstrap_auroc(score[mine], real[mine], seed=seed)))}  # fmt: skip
    return rows


def choose_thresholds(scores: np.ndarray, real: np.ndarray, tasks: np.ndarray, rule: GateRule, fallback: float) -> tuple[float, dict[str, float], str]:
    """The threshold for every task and, with ``rule.per_task``, each task's own, chosen on these (calibration)
    episodes by :func:`~worldloop.rewards.metrics.max_kappa_threshold`; ``fallback`` (the judge's own) where they
    cannot choose. Returns (threshold, per-task thresholds, how the one for all was chosen)."""
    chosen = max_kappa_threshold(scores, real, tasks, rule.tolerance_se, rule.significance_se)
    how = f"max kappa on {len(scores)} calibration episodes" if chosen is not None else "the judge's own (no calibration threshold agrees beyond chance)"
    threshold = fallback if chosen is None else chosen
    own = {}
    if rule.per_task:
        for task in dict.fromkeys(tasks.tolist()):
            mine = tasks == task
            value = max_kappa_threshold(scores[mine], real[mine], tasks[mine], rule.tolerance_se, rule.significance_se)
            if value is not None:
                own[task] = value
    return float(threshold), own, how


def gate_verdicts(episodes: GateEpisodes, rule: GateRule, fallback_threshold: float, seed: int = 0) -> dict[str, Any]:
    """The gate's result: thresholds chosen on the calibration half, every task measured on the evaluation half, and
    whether it passes and why not. ``fallback_threshold``: the judge's own threshold."""
    tasks, real = np.asarray(episodes.task), np.asarray(episodes.real, dtype=bool)
    halves = np.asarray(split(episodes.task))
    calibrating, evaluating = halves == CALIBRATION, halves == EVALUATION
    replay, frames = episode_scores(episodes.replay, rule.success_chunks), episode_scores(episodes.frames, rule.success_chunks)
    chosen_on = replay if rule.calibrate_on == "replays" else frames
    threshold, own, how = choose_thresholds(chosen_on[calibrating], real[calibrating], tasks[calibrating], rule, fallback_threshold)
    if rule.calibrate_on == "real_frames" and how.startswith("max kappa"):
        how += "' real frames"
    at = np.array([own.get(task, threshold) for task in episodes.task])
    judged, judged_frames = replay >= at, frames >= at
    rows = {}
    for task in dict.fromkeys(episodes.task):
        mine = evaluating & (tasks == task)
        r, j = real[mine], judged[mine]
        agreement = agreement_beyond_chance(r, j, [task] * int(mine.sum()))
        kappa, stderr = agreement["kappa"], agreement["kappa_stderr"]
        if r.all() or not r.any():  # every real episode alike: agreement beyond chance means nothing
            kappa, stderr, interval = None, None, None
        else:
            interval = bootstrap_kappa(r, j, seed=seed)
        on_frames = agreement_beyond_chance(r, judged_frames[mine], [task] * int(mine.sum()))["kappa"] if kappa is not None else None
        bar = bar_kappa(rule)  # not enforced: measured against the default bar all the same, and every task passes
        if kappa is None:
            meets, why = False, f"kappa undefined: all {int(mine.sum())} evaluation episodes {'succeeded' if r.all() else 'failed'}"
        elif kappa < bar:
            meets, why = False, f"kappa {format_kappa(kappa, stderr)} is below {bar:g}"
        elif interval is None or interval[0] <= rule.min_lower:
            meets, why = False, f"its 95 % interval's lower bound {interval[0] if interval else float('nan'):.2f} is not above {rule.min_lower:g}"
        else:
            meets, why = True, ""
        passed = meets or rule.min_kappa is None
        (real_rate, real_se), (judged_rate, judged_se) = rate_with_stderr(r.tolist()), rate_with_stderr(j.tolist())
        rows[task] = {"calibration_episodes": int((calibrating & (tasks == task)).sum()), "episodes": int(mine.sum()),
                      "real": real_rate, "real_stderr": real_se, "judged": judged_rate, "judged_stderr": judged_se,
                      "kappa": kappa, "kappa_stderr": stderr, "kappa_interval": interval, "auroc": auroc(replay[mine], r),
                      "kappa_on_real_frames": on_frames, "threshold": own.get(task, threshold), "meets_bar": meets, "passed": passed,
                      "why_not": why}  # fmt: skip
    overall = agreement_beyond_chance(real[evaluating], judged[evaluating], tasks[evaluating].tolist())
    on_frames = agreement_beyond_chance(real[evaluating], judged_frames[evaluating], tasks[evaluating].tolist())
    return {"rule": asdict(rule), "threshold": threshold, "task_thresholds": own, "threshold_chosen_by": how,
            "calibrated": how.startswith("max kappa"), "min_kappa": rule.min_kappa, "min_lower": rule.min_lower,
            "episodes": {"calibration": int(calibrating.sum()), "evaluation": int(evaluating.sum())},
            "replays": {"kappa": overall["kappa"], "kappa_stderr": overall["kappa_stderr"]},
            "real_frames": {"kappa": on_frames["kappa"], "kappa_stderr": on_frames["kappa_stderr"],
                            "found": int((judged_frames & real & evaluating).sum()), "successes": int((real & evaluating).sum()),
                            "false_successes": int((judged_frames & ~real & evaluating).sum())},
            "tasks": rows, "passed": [task for task, row in rows.items() if row["passed"]]}  # fmt: skip


def compare_rules(episodes: GateEpisodes, rule: GateRule, fallback_threshold: float,
                  rules: Sequence[tuple[int, bool, str]] = RULES_COMPARED) -> list[dict[str, Any]]:  # fmt: skip
    """Every episode rule of ``rules`` (success_chunks, per_task, calibrate_on) scored as the gate scores its own, on the
    same split: the evaluation half's kappa on replays and on real frames, the tasks passing. The designs that lost,
    measured."""
    compared = []
    own = (rule.success_chunks, rule.per_task, rule.calibrate_on)
    for chunks, per_task, calibrate_on in dict.fromkeys([*rules, own]):
        variant = GateRule(**{**asdict(rule), "success_chunks": chunks, "per_task": per_task, "calibrate_on": calibrate_on})
        result = gate_verdicts(episodes, variant, fallback_threshold)
        compared.append({"success_chunks": chunks, "per_task": per_task, "calibrate_on": calibrate_on, "chosen": (chunks, per_task, calibrate_on) == own,
                         "replay_kappa": result["replays"]["kappa"], "replay_kappa_stderr": result["replays"]["kappa_stderr"],
                         "real_frames_kappa": result["real_frames"]["kappa"], "threshold": result["threshold"],
                         "passed": sum(row["meets_bar"] for row in result["tasks"].values())})  # fmt: skip
    return compared


def replays_by_chunk(episodes: GateEpisodes, gate: dict[str, Any]) -> list[dict[str, Any]]:
    """Where the replays part from the real frames: after each chunk, the evaluation episodes' verdicts so far (success
    once ``success_chunks`` consecutive verdicts of the chunks until then pass the gate's threshold(s); an episode that
    ended keeps its last) on the replays and on the real frames of the same episodes, read by the same judge. Replays
    that part after the contact with an object, not only at long horizons, point at the world model's fidelity there
    rather than its drift."""
    chunks = gate["rule"]["success_chunks"]
    at = np.array([gate["task_thresholds"].get(task, gate["threshold"]) for task in episodes.task])
    evaluating = np.asarray(split(episodes.task)) == EVALUATION
    real = np.asarray(episodes.real, dtype=bool)[evaluating]
    replay = [p for p, e in zip(episodes.replay, evaluating) if e]
    frames = [p for p, e in zip(episodes.frames, evaluating) if e]
    at = at[evaluating]
    rows = []
    for chunk in range(1, max((len(p) for p in replay), default=0) + 1):
        on_replay = episode_scores([p[:chunk] for p in replay], chunks) >= at
        on_frames = episode_scores([p[:chunk] for p in frames], chunks) >= at
        rows.append({"chunk": chunk, "running": sum(len(p) >= chunk for p in replay), "episodes": len(replay),
                     "judged_on_frames": float(on_frames.mean()), "judged_on_replays": float(on_replay.mean()),
                     "agreeing": float((on_frames == on_replay).mean()), "replay_only": int((on_replay & ~on_frames).sum()),
                     "frames_only": int((on_frames & ~on_replay).sum()), "replay_only_real_failures": int((on_replay & ~on_frames & ~real).sum())})  # fmt: skip
    return rows


def bar_kappa(rule: GateRule | dict[str, Any]) -> float:
    """The kappa a task must reach: the rule's, or where the gate is not enforced the default bar it is measured against."""
    value = rule.min_kappa if isinstance(rule, GateRule) else rule["min_kappa"]
    return GateRule.min_kappa if value is None else value


def _kappa(value: float | None, stderr: float | None = None) -> str:
    if value is None:
        return "undefined"
    return fixed(value) if stderr is None else format_kappa(value, stderr)


def _auroc(value: float | None, interval: Sequence[float] | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if interval is None else f"{value:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]"


def gate_table(gate: dict[str, Any]) -> str:
    """The gate as Markdown: the rule, one row per task (evaluation half), the judge on real frames, the rules compared."""
    rule = gate["rule"]
    bar = f"kappa >= {bar_kappa(gate):g} with its 95 % interval's lower bound above {gate['min_lower']:g}"
    enforced = (f"a task passes at {bar}" if gate["min_kappa"] is not None else
                f"not enforced (loop.gate_min_kappa: null): RL trains on every task, and each is measured against {bar}")  # fmt: skip
    own = f"; each task its own where its calibration episodes choose one ({len(gate['task_thresholds'])} did)" if rule["per_task"] else ""
    episodes = gate["episodes"]
    lines = [f"Fidelity gate ({enforced}). The base policy's real episodes, replayed open loop in the world model and judged: an episode is a "
             f"success once {rule['success_chunks']} consecutive chunk verdicts pass threshold {gate['threshold']:.3f} ({gate['threshold_chosen_by']}{own}). "
             f"Thresholds chosen on {episodes['calibration']} calibration episodes; every number below from the other {episodes['evaluation']}.",
             "", "| task | episodes | real success | judged on replays | kappa | 95 % interval | AUROC | kappa on real frames | RL trains on it |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    for task, row in gate["tasks"].items():
        interval = "-" if row["kappa_interval"] is None else f"[{fixed(row['kappa_interval'][0])}, {fixed(row['kappa_interval'][1])}]"
        ranking = "-" if row.get("auroc") is None else f"{row['auroc']:.2f}"
        verdict = "yes" if row["passed"] else f"no: {row['why_not']}"
        if gate["min_kappa"] is None:  # a gate.json written before 2026-12-06 has no meets_bar
            meets = row.get("meets_bar")
            verdict = "yes, not enforced" + ("" if meets is None else "; it meets the bar" if meets else f"; below the bar: {row['why_not']}")
        lines.append(f"| {task} | {row['episodes']} | {row['real']:.2f} ± {row['real_stderr']:.2f} | {row['judged']:.2f} ± {row['judged_stderr']:.2f} | "
                     f"{_kappa(row['kappa'], row['kappa_stderr'])} | {interval} | {ranking} | {_kappa(row['kappa_on_real_frames'])} | {verdict} |")  # fmt: skip
    meeting = [(task, row["judged"] - row["real"]) for task, row in gate["tasks"].items() if row.get("meets_bar", row["passed"])]
    if meeting:  # how far imagination would put the base policy's success on the tasks RL may train on
        within = sum(abs(gap) <= RATE_TOLERANCE + 1e-9 for _, gap in meeting)
        lines += ["", f"Judged on replays less real success, on the tasks meeting the bar ({within} of {len(meeting)} within "
                  f"{RATE_TOLERANCE:.2f}): " + ", ".join(f"{task} {gap:+.2f}" for task, gap in meeting) + "."]  # fmt: skip
    frames = gate["real_frames"]
    lines += ["", f"The judge alone, on the same evaluation episodes' real frames: kappa {_kappa(frames['kappa'], frames['kappa_stderr'])} (chance within "
              f"tasks); it found {frames['found']} of {frames['successes']} real successes and called {frames['false_successes']} failures successes.",
              "AUROC: how often a real success's replay scores above a real failure's (0.5: chance; '-': outcomes all alike). "
              "'undefined': every evaluation episode of the task alike, where agreement beyond chance means nothing."]  # fmt: skip
    if gate.get("ranking"):
        lines += ["", "How the judge ranks each task's evaluation episodes (AUROC of their episode scores, with its bootstrap 95 % interval; '-': "
                  "outcomes all alike):", "", "| task | AUROC on replays | AUROC on real frames |", "| --- | ---: | ---: |"]  # fmt: skip
        for task, row in gate["ranking"].items():
            lines.append(f"| {task} | {_auroc(row['replays_auroc'], row['replays_auroc_interval'])} | "
                         f"{_auroc(row['real_frames_auroc'], row['real_frames_auroc_interval'])} |")  # fmt: skip
    if gate.get("replays_by_chunk"):
        lines += ["", "Where the replays part from the real frames (the evaluation episodes' verdicts so far, after each chunk, the same judge and "
                  "threshold(s); an episode that ended keeps its last):", "",
                  "| after chunk | episodes running | judged on real frames | judged on replays | agreeing | replay only (of them real failures) | "
                  "real frames only |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
        for row in gate["replays_by_chunk"]:
            lines.append(f"| {row['chunk']} | {row['running']} / {row['episodes']} | {row['judged_on_frames']:.2f} | {row['judged_on_replays']:.2f} | "
                         f"{row['agreeing']:.2f} | {row['replay_only']} ({row['replay_only_real_failures']}) | {row['frames_only']} |")  # fmt: skip
    if gate.get("rules_compared"):
        lines += ["", "Episode rules on the same split (calibrated on one half, scored on the other):", "",
                  "| consecutive verdicts | thresholds | chosen on | kappa on replays | kappa on real frames | tasks meeting the bar |",
                  "| ---: | --- | --- | ---: | ---: | ---: |"]  # fmt: skip
        for row in gate["rules_compared"]:
            mark = " (the gate's)" if row["chosen"] else ""
            chosen_on = row.get("calibrate_on", "replays").replace("_", " ")  # a gate.json of before 2026-12-07: replays
            lines.append(f"| {row['success_chunks']}{mark} | {'per task' if row['per_task'] else 'one for all'} | {chosen_on} | "
                         f"{_kappa(row['replay_kappa'], row['replay_kappa_stderr'])} | {_kappa(row['real_frames_kappa'])} | {row['passed']} |")  # fmt: skip
    return "\n".join(lines)


def write_gate(folder: str | Path, episodes: GateEpisodes, rule: GateRule, fallback_threshold: float, judge: str) -> dict[str, Any]:
    """gate_episodes.json, gate.json and gate.md into ``folder``; returns the gate's result."""
    folder = Path(folder)
    episodes.save(folder / "gate_episodes.json")
    result = gate_verdicts(episodes, rule, fallback_threshold) | {"judge": judge, "judge_threshold": fallback_threshold}
    result["rules_compared"] = compare_rules(episodes, rule, fallback_threshold)
    result["replays_by_chunk"] = replays_by_chunk(episodes, result)
    result["ranking"] = ranking(episodes, result)
    atomic_write_json(folder / "gate.json", result)
    atomic_write_text(folder / "gate.md", gate_table(result) + "\n")
    return result


def evaluation_verdicts(folder: str | Path) -> tuple[GateEpisodes, np.ndarray, np.ndarray]:
    """A gate folder's episodes, which of them the evaluation half holds, and each episode's verdict on its replay under
    the rule and threshold(s) its gate.json records."""
    gate, episodes = read_json(Path(folder) / "gate.json"), GateEpisodes.load(Path(folder) / "gate_episodes.json")
    scores = episode_scores(episodes.replay, gate["rule"]["success_chunks"])
    at = np.array([gate["task_thresholds"].get(task, gate["threshold"]) for task in episodes.task])
    return episodes, np.asarray(split(episodes.task)) == EVALUATION, scores >= at


def compare_judges(folders: Sequence[str | Path]) -> dict[str, Any]:
    """Gates of several judges (or rules) on the same real episodes, against the first: each one's replay and
    real-frame kappa and tasks passing, and, paired by evaluation episode, those whose replay verdict agrees with the
    simulator under one and not the other, with the exact sign (McNemar) test."""
    from worldloop.utils.stats import sign_test_p

    first, evaluating, reference = evaluation_verdicts(folders[0])
    rows = []
    for folder in folders:
        episodes, _, judged = evaluation_verdicts(folder)
        if episodes.task != first.task or episodes.real != first.real:
            raise ValueError(f"{folder} and {folders[0]} hold other real episodes: judges compare on the same ones (the same policy, "
                             "initial states and world-model noise)")  # fmt: skip
        real = np.asarray(episodes.real)
        right, right_first = (judged == real)[evaluating], (reference == real)[evaluating]
        gate = read_json(Path(folder) / "gate.json")
        gained, lost = int((right & ~right_first).sum()), int((~right & right_first).sum())
        rows.append({"gate": str(folder), "judge": gate["judge"], "replay_kappa": gate["replays"]["kappa"],
                     "replay_kappa_stderr": gate["replays"]["kappa_stderr"], "real_frames_kappa": gate["real_frames"]["kappa"],
                     "passed": len(gate["passed"]) if gate["min_kappa"] is not None else sum(r["meets_bar"] for r in gate["tasks"].values()),
                     "agreeing": int(right.sum()), "episodes": int(evaluating.sum()), "right_where_first_wrong": gained,
                     "wrong_where_first_right": lost, "sign_test_p": sign_test_p(gained, lost) if gained + lost else None})  # fmt: skip
    return {"against": str(folders[0]), "gates": rows}


def comparison_table(result: dict[str, Any]) -> str:
    """compare_judges' result as Markdown."""
    lines = [f"Judges on the same real episodes, each gate's evaluation half, against {result['against']}:", "",
             "| gate | kappa on replays | kappa on real frames | tasks meeting the bar | replays agreeing | right where the first is wrong | "
             "wrong where the first is right | exact sign test p |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for row in result["gates"]:
        p = "-" if row["sign_test_p"] is None else f"{row['sign_test_p']:.3g}"
        lines.append(f"| {row['gate']} | {_kappa(row['replay_kappa'], row['replay_kappa_stderr'])} | {_kappa(row['real_frames_kappa'])} | "
                     f"{row['passed']} | {row['agreeing']} / {row['episodes']} | {row['right_where_first_wrong']} | {row['wrong_where_first_right']} | {p} |")  # fmt: skip
    return "\n".join(lines)


def rebuild_gate(folder: str | Path) -> str:
    """gate.json and gate.md of a gate folder again, from its gate_episodes.json and the rule and judge its gate.json
    records (a committed folder, without the models); returns the table."""
    folder = Path(folder)
    before = read_json(folder / "gate.json")
    write_gate(folder, GateEpisodes.load(folder / "gate_episodes.json"), GateRule(**before["rule"]), before["judge_threshold"], before["judge"])
    return gate_table(read_json(folder / "gate.json"))


def measure(config: Any, tasks: Sequence[str], policy: Any, world_model: Any, judge: Any, dataset: Any, device: Any,
            first_episode: int, progress: bool = True) -> GateEpisodes:  # fmt: skip
    """loop.gate_episodes_per_task real episodes per task of ``policy`` from the eval verb's initial states (episode
    numbers from ``first_episode`` on), in waves of eval.num_envs environments, each judged at every chunk's end on its
    real frames and replayed open loop in ``world_model`` (from its real first frame, with its own action chunks;
    world-model noise seeded by the episode's number), judged there too."""
    import math

    from tqdm import tqdm

    from worldloop.envs.judging import JudgedEnv
    from worldloop.rl.envs import imagined_env
    from worldloop.rl.evaluate import eval_seed
    from worldloop.diagnostics.tracking import chunks_run, replay
    from worldloop.rl.rollout import collect
    from worldloop.sims import make_env

    per_task = config.loop.gate_episodes_per_task
    jobs = [(task, eval_seed(task, first_episode + e)) for task in tasks for e in range(per_task)]
    wave = min(len(jobs), config.eval.num_envs)
    episodes = GateEpisodes([], [], [], [])
    real_env = make_env(config, wave, tasks=list(tasks))
    previous = judge.threshold, dict(getattr(judge, "task_thresholds", {}))
    judge.threshold, judge.task_thresholds = math.inf, {}  # no replay ends on a verdict: every chunk the real episode ran is scored
    try:
        horizon = -(-real_env.max_steps // world_model.chunk_size) * world_model.chunk_size
        imagined = imagined_env(config, world_model, judge, dataset, None, wave, 1, horizon, device, kir_ratio=0.0)
        judged = JudgedEnv(real_env, judge)
        for start in tqdm(range(0, len(jobs), wave), desc="gate", unit="wave", disable=not progress):
            batch = jobs[start : start + wave]
            padded = batch + [batch[-1]] * (wave - len(batch))  # the last wave's spare environments repeat its last episode
            first = judged.reset([task for task, _ in padded], [seed for _, seed in padded])
            real = collect(policy, judged, first, 1.0, config.eval.greedy)
            on_frames = judged.probability.cpu()
            replayed = replay(imagined, first, real, noise_seeds=list(range(start, start + wave))).probability.cpu()
            ran = chunks_run(real.done).sum(dim=1).cpu()
            success = real.success_once.cpu()
            for i, (task, _) in enumerate(batch):
                n = int(ran[i])
                episodes.task.append(task)
                episodes.real.append(bool(success[i]))
                episodes.replay.append([round(float(p), 6) for p in replayed[i, :n]])
                episodes.frames.append([round(float(p), 6) for p in on_frames[i, :n]])
    finally:
        judge.threshold, judge.task_thresholds = previous
        real_env.close()
    return episodes


def gate_rule(config: Any) -> GateRule:
    """The gate's rule as the configuration says: the episode rule of RL's imagined environment (rl.success_chunks),
    the pass rule (loop.gate_*) and the threshold's rules (reward.calibrate)."""
    loop, calibrate = config.loop, config.reward.calibrate
    return GateRule(config.rl.success_chunks, calibrate.threshold_per_task, loop.gate_min_kappa, loop.gate_min_kappa_lower,
                    calibrate.threshold_tolerance_se, calibrate.threshold_significance_se)  # fmt: skip

"""The fidelity gate as it was until 2026-12-06, to read the run folders it wrote (their judge_calibration.json): the
judge's threshold chosen on the same replays that every kappa was then measured on. ``worldloop analyse`` rebuilds
such a folder's gate.json and gate.md with it; new gates are held out (:mod:`worldloop.diagnostics.gate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from worldloop.rewards.metrics import auroc
from worldloop.utils.io import atomic_write_json, atomic_write_text, read_json
from worldloop.utils.stats import format_kappa, kappa_above_chance


def gate_verdicts(calibration: dict[str, Any], min_kappa: float | None, significance_se: float) -> dict[str, Any]:
    """Each task's verdict from a judge calibration on replays (``calibrate_threshold``'s result): its real success,
    the replays' judged success and kappa at the chosen threshold, whether it passes and why not. ``min_kappa``
    None: the gate reports and every task passes (a preset too small for fidelity to mean anything)."""
    real, judged = calibration["real"]["per_task"], calibration["replayed_after"]["per_task"]
    kappas = calibration["replayed_after"]["per_task_kappa"]
    rankings = replay_auroc(calibration)
    rows = {}
    for task, numbers in real.items():
        kappa, stderr = kappas[task]["kappa"], kappas[task]["kappa_stderr"]
        if numbers["success_once"] in (0.0, 1.0):  # every real episode alike: agreement beyond chance means nothing
            kappa, stderr = None, None
        if min_kappa is None:
            passed, why = True, "the gate is not enforced (loop.gate_min_kappa: null)"
        elif kappa is None:
            passed, why = False, f"kappa undefined: all {numbers['episodes']} real episodes {'succeeded' if numbers['success_once'] else 'failed'}"
        elif kappa < min_kappa:
            passed, why = False, f"kappa {format_kappa(kappa, stderr)} is below {min_kappa:g}"
        elif not kappa_above_chance(kappa, stderr, significance_se):
            passed, why = False, f"kappa {format_kappa(kappa, stderr)} is not {significance_se:g} SE above chance"
        else:
            passed, why = True, ""
        rows[task] = {"episodes": numbers["episodes"], "real": numbers["success_once"], "real_stderr": numbers["stderr"],
                      "judged": judged[task]["success_once"], "judged_stderr": judged[task]["stderr"],
                      "kappa": kappa, "kappa_stderr": stderr, "auroc": rankings.get(task), "passed": passed, "why_not": why}  # fmt: skip
    return {"threshold": calibration["threshold"], "calibrated": calibration["calibrated"], "min_kappa": min_kappa,
            "significance_se": significance_se, "tasks": rows, "passed": [task for task, row in rows.items() if row["passed"]]}  # fmt: skip


def replay_auroc(calibration: dict[str, Any]) -> dict[str, float | None]:
    """Per task, the chance that the judge scores the replay of a real success above the replay of a real failure
    (None when the task's real outcomes are all alike): whether any threshold could read the task's replays right,
    where kappa reads them at the one threshold chosen for every task."""
    episodes = calibration.get("per_episode") or {}
    if not {"score", "real", "task"} <= episodes.keys():
        return {}
    scores, real, tasks = np.asarray(episodes["score"]), np.array([c == "1" for c in episodes["real"]]), np.asarray(episodes["task"])
    return {task: auroc(scores[tasks == task], real[tasks == task]) for task in dict.fromkeys(episodes["task"])}


def gate_table(gate: dict[str, Any]) -> str:
    """The gate as a Markdown table, one row per task."""
    rule = "not enforced" if gate["min_kappa"] is None else f"kappa >= {gate['min_kappa']:g} and > {gate['significance_se']:g} SE above chance"
    lines = [f"Fidelity gate ({rule}; judge threshold {gate['threshold']:.3f}): the base policy's real episodes replayed in the world model.",
             "", "| task | episodes | real success | judged on replays | kappa | AUROC | RL trains on it |", "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    for task, row in gate["tasks"].items():
        kappa = "undefined" if row["kappa"] is None else format_kappa(row["kappa"], row["kappa_stderr"])
        ranking = "-" if row.get("auroc") is None else f"{row['auroc']:.2f}"
        verdict = "yes" if row["passed"] else f"no: {row['why_not']}"
        lines.append(f"| {task} | {row['episodes']} | {row['real']:.2f} ± {row['real_stderr']:.2f} | "
                     f"{row['judged']:.2f} ± {row['judged_stderr']:.2f} | {kappa} | {ranking} | {verdict} |")  # fmt: skip
    lines += ["", "AUROC: how often the judge scores a real success's replay above a real failure's (0.5: chance; '-': outcomes all alike)."]
    return "\n".join(lines)


def rebuild_gate(folder: str | Path) -> str:
    """gate.json and gate.md of a gate folder again, from its judge_calibration.json and the rule its gate.json
    records (a committed folder, without the models); returns the table."""
    folder = Path(folder)
    before = read_json(folder / "gate.json")
    result = gate_verdicts(read_json(folder / "judge_calibration.json"), before["min_kappa"], before["significance_se"])
    atomic_write_json(folder / "gate.json", result)
    atomic_write_text(folder / "gate.md", gate_table(result) + "\n")
    return gate_table(result)

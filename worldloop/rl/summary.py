"""Evaluation results in words and tables: real and imagined success, where their gap comes from, paired changes.

Pure functions of the reality checks' result dicts (:mod:`worldloop.diagnostics`), used by the trainer's
results.md, the ``rl`` command and ``worldloop report``.
"""

from __future__ import annotations

import math
from typing import Any

from worldloop.utils.stats import format_kappa, format_paired, paired_difference


SOURCES = {"judged_real": "the judge on the real frames", "replayed": "the world model replaying the real actions", "imagined": "closed loop"}
"""The steps from reality to imagination, in order: the imagined environment's judge on the real episodes'
frames; the world model driven open loop by the real action chunks, judged; the policy acting in it."""


def paired_changes(first: dict[str, Any], later: dict[str, Any], source: str = "real", later_source: str | None = None) -> dict[str, Any] | None:
    """How ``source``'s verdicts (real, imagined, ...) changed between two reality checks of the same episodes,
    overall and per task, paired episode by episode (:func:`worldloop.utils.stats.paired_difference`); None
    when either check kept no per-episode verdicts of ``source`` or they are of different episodes.
    ``later_source`` compares ``later``'s verdicts of another source instead (one check against itself: the
    closed loop in reality against the imagined episodes' actions done there)."""
    before = first.get("per_episode", {}).get(source)
    after = later.get("per_episode", {}).get(later_source or source)
    layout = [[(task, numbers["episodes"]) for task, numbers in result["real"]["per_task"].items()] for result in (first, later)]
    if before is None or after is None or len(before) != len(after) or len(after) < 2 or layout[0] != layout[1]:
        return None  # not the same episodes: other tasks, or as many episodes split otherwise
    per_task, start = {}, 0
    for task, numbers in first["real"]["per_task"].items():  # the check's episodes are task-major, in this order
        end = start + numbers["episodes"]
        if numbers["episodes"] >= 2:
            per_task[task] = paired_difference([c == "1" for c in before[start:end]], [c == "1" for c in after[start:end]])
        start = end
    return paired_difference([c == "1" for c in before], [c == "1" for c in after]) | {"per_task": per_task}


def tracking_line(rows: list[dict[str, Any]]) -> str:
    """'imagined vs real after 1/2/4 chunks: PSNR 31.2/27.5/22.0 dB (initial frame 28.0/24.1/21.5),
    same action tokens 0.91/0.62/0.40 (0.2/1.9/4.0 bins apart), success-by-then kappa 0.40/0.21/-'."""
    def joined(key: str, pattern: str = "{:.1f}") -> str:
        return "/".join("-" if row.get(key) is None else pattern.format(row[key]) for row in rows)

    return (f"imagined vs real after {joined('chunks', '{}')} chunks: PSNR {joined('psnr')} dB "
            f"(initial frame {joined('psnr_initial_frame')}), same action tokens {joined('token_agreement', '{:.2f}')} "
            f"({joined('token_distance')} bins apart)"
            + (f" (on the real frames through the VAE {joined('token_agreement_reconstructed', '{:.2f}')}, {joined('token_distance_reconstructed')} bins apart; "
               f"those against the imagined frames' {joined('token_agreement_reconstructed_imagined', '{:.2f}')})"
               if any("token_agreement_reconstructed" in r for r in rows) else "")
            + ", "
            f"success-by-then kappa {joined('kappa', '{:.2f}')}")


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
        parts.append(f"{SOURCES[name]} {rate_text(step)} (kappa {kappa})")
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


def results_table(evaluations: list[dict[str, Any]], history: list[dict[str, Any]] = ()) -> str:
    """Markdown: real and imagined success (± standard error) at each evaluation; with ``history`` of a run with
    rl.refine.every, its world-model refinement rounds."""
    real = "real success_once" + (" (observed through the VAE)" if any(r.get("real_through_codec") for r in evaluations) else "")
    lines = [f"| iteration | {real} | imagined success_once | agreement (chance, kappa) |", "|---|---|---|---|"]
    for result in evaluations:
        imagined = rate_text(result["imagined"]) if "imagined" in result else "-"
        agreement = agreement_text(result) if "agreement" in result else "-"
        lines.append(f"| {result['iteration']} | {rate_text(result['real'])} | {imagined} | {agreement} |")
    lines += paired_change_rows(evaluations)
    lines += _per_check(evaluations, "tracking", "From the same initial states, how long imagination follows the real trajectory:", tracking_line)
    sourced = [result for result in evaluations if result.get("gap_sources")]
    if sourced:
        lines += ["", "Where the gap comes from, from the same initial states (per episode against the simulator's verdicts):", ""]
        lines += [f"- iteration {result['iteration']}: {sources_line(result)}" for result in sourced]
        lines += ["", "Per task: success, and in brackets the per-episode kappa against the simulator within the task:", "",
                  "| iteration | task | real | judge on real | replay | closed loop |", "|---|---|---|---|---|---|"]
        lines += [row for result in sourced for row in sources_by_task_rows(result)]
    lines += _per_check(evaluations, "imagined_actions_in_reality",
                        "The simulator driven open loop by the closed-loop imagined episodes' actions, from the same initial states:", imagined_actions_line)
    rounds = [h for h in history if "world_model/refine_real_success" in h]
    if rounds:
        judged = any("world_model/judge_threshold" in h for h in rounds)  # rl.judge_threshold=replay: chosen again each round
        columns = ["iteration", "real episodes so far", "their real success this round", "loss before", "loss after", "seconds"]
        lines += ["", "World-model refinement on the policy's real rollouts (rl.refine.every): the DiT's loss on each round's new clips,",
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


def _per_check(evaluations: list[dict[str, Any]], key: str, heading: str, describe) -> list[str]:
    """Markdown lines: ``heading``, then '- iteration i: ' and ``describe(result[key])`` for each check that has ``key``."""
    checks = [result for result in evaluations if result.get(key)]
    return ["", heading, ""] + [f"- iteration {result['iteration']}: {describe(result[key])}" for result in checks] if checks else []


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


def agreement_text(result: dict[str, Any]) -> str:
    """'0.58 (chance 0.59, kappa -0.02 ± 0.09)'; the agreement alone where kappa is undefined (both verdicts
    constant and equal) or was not measured (runs from before it)."""
    if result.get("kappa") is None:
        return f"{result['agreement']:.2f}"
    kappa = format_kappa(result["kappa"], result["kappa_stderr"])
    return f"{result['agreement']:.2f} (chance {result['agreement_by_chance']:.2f}, kappa {kappa})"


def imagined_actions_line(acted: dict[str, Any]) -> str:
    """The simulator driven by the imagined episodes' actions: its success, overall and per task, beside its agreement
    with the imagined verdicts (kappa '-' where a task's verdicts are all alike)."""
    line = (f"the imagined episodes' actions done in the simulator: {rate_text(acted)}, against the imagined verdicts kappa {_kappa(acted)}; "
            f"per task {_per_task_rates(acted)}")
    versus = acted.get("versus_closed_loop")
    if versus:  # absent in runs from before it
        line += f"\n  those actions against the policy's own in the simulator: {format_paired(versus)}; per task {_per_task_changes(versus)}"
    return line


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


def rate_text(summary: dict[str, Any]) -> str:
    return f"{summary['success_once']:.3f} ± {summary['stderr']:.3f} (n={summary['episodes']})"

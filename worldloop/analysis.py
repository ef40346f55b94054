"""``worldloop analyse``: an experiment's verdicts (RUN/verdicts.json) -> RUN/analysis.json and RUN/analysis.md.

The primary endpoint is the final policy's real success_once on the simulator's own frames, against the base policy's on
the same initial states; success observed through the world model's VAE is secondary. A claim rests on seeds: one
RL run's paired change conditions on one trained policy, so it cannot tell a reward-driven gain from the noise of an RL
update; the spread of the change across seeds can. The tests (:mod:`worldloop.utils.stats`):

- per arm and seed: the paired change from the base policy, its normal z, and the exact sign test on the episodes whose
  outcome flipped (McNemar's exact test);
- per arm: the mean change across seeds, its SE across seeds, and an exact sign-flip permutation test over seeds;
- each other arm against the full arm: the difference of their mean changes, SE sqrt(SE_a^2 + SE_full^2) (independent
  seeds), and an exact two-sample permutation test over the seeds' changes;
- per task, the same, with Holm's step-down correction across tasks within each arm or comparison;
- imagined against real per arm: RL's own first and last checks (the same policy in the world model and in the simulator).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from worldloop.utils.io import atomic_write_json, atomic_write_text, read_json
from worldloop.utils.stats import holm, mean_with_stderr, paired_test, permutation_p, sign_flip_p

FULL = "full"
ENDPOINTS = {"real": "real success_once on the simulator's own frames", "through_vae": "real success_once, the policy observing the simulator through the world model's VAE"}


def analyse(verdicts: dict[str, Any]) -> dict[str, Any]:
    """Every number of the analysis, from an experiment's verdicts (:func:`worldloop.experiment.gather_verdicts`)."""
    result: dict[str, Any] = {"tasks": verdicts["tasks"], "episodes_per_task": verdicts["episodes_per_task"], "endpoints": {}}
    for endpoint in ENDPOINTS:
        if endpoint in verdicts["base"]:
            runs = {arm: {seed: block[endpoint] for seed, block in seeds.items() if block.get(endpoint)} for arm, seeds in verdicts["arms"].items()}
            result["endpoints"][endpoint] = endpoint_analysis(verdicts["base"][endpoint], {arm: r for arm, r in runs.items() if r})
    result["imagined_vs_real"] = imagined_vs_real(verdicts["arms"])
    return result


def endpoint_analysis(base: dict[str, str], arms: dict[str, dict[str, dict[str, str]]]) -> dict[str, Any]:
    """One endpoint: ``base`` and each arm's seeds' verdicts, ``{task: '0101..'}``."""
    tasks = list(base)
    per_seed = {arm: {seed: seed_change(base, run) for seed, run in seeds.items()} for arm, seeds in arms.items()}
    per_arm = {arm: across_seeds({seed: row["overall"]["difference"] for seed, row in seeds.items()},
                                 {task: {seed: row["per_task"][task]["difference"] for seed, row in seeds.items()} for task in tasks})
               for arm, seeds in per_seed.items()}  # fmt: skip
    for arm, row in per_arm.items():
        row["success_once"] = sum(s["success_once"] for s in per_seed[arm].values()) / len(per_seed[arm])
    versus = {}
    if FULL in per_seed:
        full = per_seed[FULL]
        for arm, seeds in per_seed.items():
            if arm != FULL:
                versus[arm] = difference_of_arms(seeds, full, tasks)
    return {"base": {"success_once": _rate(base), "episodes": sum(len(v) for v in base.values())}, "per_seed": per_seed, "per_arm": per_arm,
            "versus_full": versus}  # fmt: skip


def seed_change(base: dict[str, str], run: dict[str, str]) -> dict[str, Any]:
    """One arm and seed against the base, paired by initial state: overall and per task (Holm across tasks)."""
    tasks = list(base)
    overall = paired_test(_flat(base, tasks), _flat(run, tasks))
    per_task = {task: paired_test(_flat(base, [task]), _flat(run, [task])) if len(base[task]) >= 2 else
                {"difference": _rate({task: run[task]}) - _rate({task: base[task]}), "p_exact": None} for task in tasks}  # fmt: skip
    for task, adjusted in zip(tasks, holm([per_task[t]["p_exact"] for t in tasks])):
        per_task[task]["p_exact_holm"] = adjusted
    return {"success_once": _rate(run), "overall": overall, "per_task": per_task}


def across_seeds(overall: dict[str, float], per_task: dict[str, dict[str, float]]) -> dict[str, Any]:
    """An arm's change, one value per seed: its mean, SE across seeds and exact sign-flip p, overall and per task (Holm)."""
    row = _seed_summary(list(overall.values()))
    tasks = {task: _seed_summary(list(values.values())) for task, values in per_task.items()}
    for task, adjusted in zip(tasks, holm([t["p_seeds"] for t in tasks.values()])):
        tasks[task]["p_seeds_holm"] = adjusted
    return row | {"seeds": len(overall), "per_seed": overall, "per_task": tasks}


def difference_of_arms(arm: dict[str, Any], full: dict[str, Any], tasks: list[str]) -> dict[str, Any]:
    """An arm's seeds' changes against the full arm's: difference of means, its SE and the exact permutation p; per task (Holm)."""

    def compare(mine: list[float], theirs: list[float]) -> dict[str, Any]:
        (a, se_a), (b, se_b) = mean_with_stderr(mine), mean_with_stderr(theirs)
        stderr = None if se_a is None or se_b is None else math.hypot(se_a, se_b)
        return {"difference": a - b, "stderr": stderr, "p_exact": permutation_p(mine, theirs)}

    row = compare([s["overall"]["difference"] for s in arm.values()], [s["overall"]["difference"] for s in full.values()])
    per_task = {task: compare([s["per_task"][task]["difference"] for s in arm.values()], [s["per_task"][task]["difference"] for s in full.values()])
                for task in tasks}  # fmt: skip
    for task, adjusted in zip(tasks, holm([per_task[t]["p_exact"] for t in tasks])):
        per_task[task]["p_exact_holm"] = adjusted
    return row | {"seeds": [len(arm), len(full)], "per_task": per_task}


def imagined_vs_real(arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per arm: RL's first and last checks' real and imagined success, their means across seeds, and the changes' SE."""
    rows = {}
    for arm, seeds in arms.items():
        checks = [block["rl"] for block in seeds.values() if block.get("rl")]
        if not checks:
            continue
        last = checks[0]["last"]
        row: dict[str, Any] = {"seeds": len(checks), "episodes": last["episodes"], "read_at": f"{last['stage']} @ {last['iteration']}"}
        for source in ("real", "imagined"):
            pairs = [(c["first"][source], c["last"][source]) for c in checks if c["first"][source] is not None and c["last"][source] is not None]
            if pairs:
                change, stderr = mean_with_stderr([last - first for first, last in pairs])
                row[source] = {"first": sum(p[0] for p in pairs) / len(pairs), "last": sum(p[1] for p in pairs) / len(pairs), "change": change, "stderr": stderr}
        rows[arm] = row
    return rows


def _seed_summary(values: list[float]) -> dict[str, Any]:
    mean, stderr = mean_with_stderr(values)
    return {"change": mean, "stderr": stderr, "p_seeds": sign_flip_p(values)}


def _flat(verdicts: dict[str, str], tasks: list[str]) -> list[bool]:
    return [c == "1" for task in tasks for c in verdicts[task]]


def _rate(verdicts: dict[str, str]) -> float:
    outcomes = _flat(verdicts, list(verdicts))
    return sum(outcomes) / len(outcomes)


# --------------------------------------------------------------------------------------------
# The report


def write_analysis(run: str | Path) -> Path:
    """RUN/analysis.json and RUN/analysis.md from RUN/verdicts.json (gathered again first when the experiment's folders are
    there, so a committed folder with only verdicts.json is analysed as it was); returns analysis.md's path."""
    from worldloop.experiment import ARMS_DIR, write_verdicts

    run = Path(run)
    if (run / ARMS_DIR).is_dir() and (run / "experiment.json").is_file():
        write_verdicts(run)
    if not (run / "verdicts.json").is_file():
        raise FileNotFoundError(f"{run / 'verdicts.json'}: not an experiment folder (`worldloop experiment --out {run}` writes it)")
    verdicts = read_json(run / "verdicts.json")
    result = analyse(verdicts)
    atomic_write_json(run / "analysis.json", result)
    atomic_write_text(run / "analysis.md", render(result, verdicts.get("arm_about", {})))
    return run / "analysis.md"


def render(result: dict[str, Any], about: dict[str, str]) -> str:
    n_tasks, per_task = len(result["tasks"]), result["episodes_per_task"]
    lines = ["# Experiment analysis", "",
             f"Every number is also in `analysis.json`, recomputed from `verdicts.json` by `worldloop analyse`. Each arm's final policy and "
             f"the base policy were evaluated on the same {n_tasks * per_task} initial states ({n_tasks} tasks x {per_task} episodes); "
             "changes are paired episode by episode. A claim rests on the spread across seeds (the per-arm tables); a single seed's "
             "paired SE conditions on one trained policy.", ""]  # fmt: skip
    if about:
        lines += ["Arms: " + "; ".join(f"**{arm}**: {text}" for arm, text in about.items()) + ".", ""]
    for index, (endpoint, block) in enumerate(result["endpoints"].items()):
        kind = "Primary" if index == 0 and endpoint == "real" else "Secondary"
        lines += [f"## {kind} endpoint: {ENDPOINTS[endpoint]}", "", f"Base policy: {block['base']['success_once']:.3f} (n={block['base']['episodes']}).", ""]
        lines += ["### Per arm, across seeds (exact p: sign-flip permutation over seeds, smallest 2/2^seeds)", "",
                  "| arm | seeds | success_once | change from base | SE across seeds | exact p |", "| --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
        for arm, row in block["per_arm"].items():
            lines.append(f"| {arm} | {row['seeds']} | {row['success_once']:.3f} | {row['change']:+.3f} | {_se(row['stderr'])} | {row['p_seeds']:.3g} |")
        if block["versus_full"]:
            lines += ["", "### Each arm against the full arm (exact p: two-sample permutation over the seeds' changes)", "",
                      "| arm | seeds (arm, full) | difference | SE | exact p |", "| --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
            for arm, row in block["versus_full"].items():
                lines.append(f"| {arm} - full | {row['seeds'][0]}, {row['seeds'][1]} | {row['difference']:+.3f} | {_se(row['stderr'])} | {row['p_exact']:.3g} |")
        lines += ["", "### Per task (Holm's correction across tasks)", "", "| arm | task | change from base | SE across seeds | exact p | Holm p |"
                  + (" against full | exact p | Holm p |" if block["versus_full"] else ""),
                  "| --- | --- | ---: | ---: | ---: | ---: |" + (" ---: | ---: | ---: |" if block["versus_full"] else "")]  # fmt: skip
        for arm, row in block["per_arm"].items():
            for task, t in row["per_task"].items():
                line = f"| {arm} | {task} | {t['change']:+.3f} | {_se(t['stderr'])} | {t['p_seeds']:.3g} | {_p(t['p_seeds_holm'])} |"
                if block["versus_full"]:
                    v = block["versus_full"].get(arm, {}).get("per_task", {}).get(task)
                    line += " - | - | - |" if v is None else f" {v['difference']:+.3f} | {v['p_exact']:.3g} | {_p(v['p_exact_holm'])} |"
                lines.append(line)
        lines += ["", "### Per arm and seed, paired by initial state (exact p: sign test on the flipped episodes, McNemar)", "",
                  "| arm | seed | success_once | change | paired SE | z | normal p | gained | lost | exact p |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
        for arm, seeds in block["per_seed"].items():
            for seed, row in seeds.items():
                c = row["overall"]
                z = "-" if c["z"] is None else f"{c['z']:+.2f}"
                lines.append(f"| {arm} | {seed} | {row['success_once']:.3f} | {c['difference']:+.3f} | {c['stderr']:.3f} | {z} | {_p(c['p_normal'])} | "
                             f"{c['gained']} | {c['lost']} | {c['p_exact']:.3g} |")  # fmt: skip
        lines.append("")
    if result["imagined_vs_real"]:
        lines += ["## Imagined against real (RL's own checks: the same policy and initial states in the world model and the simulator)", "",
                  "| arm | seeds | last check | real first -> last | real change ± SE | imagined first -> last | imagined change ± SE |",
                  "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
        for arm, row in result["imagined_vs_real"].items():
            cells = [f"{s['first']:.3f} -> {s['last']:.3f} | {s['change']:+.3f} ± {_se(s['stderr'])}" if s else "- | -" for s in (row.get("real"), row.get("imagined"))]
            lines.append(f"| {arm} | {row['seeds']} | {row['read_at']} | {cells[0]} | {cells[1]} |")
        lines.append("")
    return "\n".join(lines)


def _se(stderr: float | None) -> str:
    return "-" if stderr is None else f"{stderr:.3f}"


def _p(p: float | None) -> str:
    return "-" if p is None else f"{p:.3g}"

"""Fidelity against GPU-minutes: how far a world model trained M minutes agrees with the simulator.

    the loop's data stages (demonstrations, base policy, its evaluation and rollouts) and its VAE, shared
    -> for each budget of M minutes: train-wm for M minutes (a schedule of its own) -> eval-wm -> judge -> gate
    -> RUN/fidelity.md + fidelity.json + fidelity.png

Each budget is a world model a user would get by giving train-wm those minutes (``world_model.time_limit_s``): the
learning rate warms up and decays within them, unlike a snapshot of one longer run. Read per budget: the PSNR margin
over copy-last-frame at 8/32/64/128 frames on held-out base-policy rollouts, the action ΔPSNR, the VAE alone, and
the fidelity gate's kappa on every task whose base success lies in 10-90 % (where kappa can say something).
The stages are the loop's (``worldloop.loop.run_stages``): a rerun skips what is done and rewrites the tables from
the files, so a committed run folder's small files are enough to rebuild them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from worldloop.config import Config
from worldloop.loop import Inputs, Stage, judge_and_gate, plan, run_stages
from worldloop.utils.io import read_json

HORIZONS = ("8", "32", "64", "128")


def budget_name(minutes: float) -> str:
    return f"{minutes:g}min"


def plan_fidelity(config: Config, run: Path, minutes: Sequence[float]) -> list[Stage]:
    """The loop's stages up to its VAE, then train-wm, eval-wm, the judge and the gate for each budget."""
    stages, p = plan(config, run, Inputs())
    stages = stages[: [stage.name for stage in stages].index("vae") + 1]
    train_judge = not config.loop.judge.startswith("topreward:")
    for m in minutes:
        name = budget_name(m)
        wm, judge = str(run / f"wm_{name}"), str(run / f"judge_{name}") if train_judge else p["judge"]
        stages += [
            Stage(f"wm_{name}", ["train-wm", "--dataset", p["demos"], p["rollouts_base"], "--vae", p["vae"], "--out", wm],
                  [f"world_model.time_limit_s={60 * m:g}"]),
            Stage(f"eval_wm_{name}", ["eval-wm", "--world-model", wm, "--dataset", p["rollouts_base"], "--out", str(run / f"eval_wm_{name}")]),
            *judge_and_gate(config, p, wm, judge, str(run / f"gate_{name}"), train_judge, suffix=f"_{name}"),
        ]  # fmt: skip
    return stages


def fidelity_results(run: Path, minutes: Sequence[float], low: float = 0.1, high: float = 0.9) -> dict[str, Any]:
    """Every budget's numbers from the run folder's files: training time and steps, the eval-wm margins, the gate."""
    base = read_json(run / "eval_base" / "results.json")["per_task"]
    between = [task for task, row in base.items() if low <= row["success_once"] <= high]
    rows = []
    for m in minutes:
        name = budget_name(m)
        trained = read_json(run / f"wm_{name}" / "results.json")
        horizons = read_json(run / f"eval_wm_{name}" / "metrics.json")["horizons"]
        gate = read_json(run / f"gate_{name}" / "gate.json")
        rows.append({
            "minutes": m, "train_seconds": trained["train_seconds_this_run"], "steps": trained["steps"],
            "horizons": {h: {"margin": r["psnr"] - r["copy_last_frame_psnr"], "margin_stderr": r["psnr_margin_stderr"],
                             "action_delta_psnr": r.get("action_delta_psnr"), "vae_psnr": r.get("vae_psnr"), "episodes": r["episodes"]}
                         for h, r in horizons.items()},
            "kappa": {task: {"kappa": gate["tasks"][task]["kappa"], "kappa_stderr": gate["tasks"][task]["kappa_stderr"],
                             "auroc": gate["tasks"][task].get("auroc")} for task in between},
            "passed": [task for task in gate["passed"] if task in between],
        })  # fmt: skip
    return {"tasks_between": between, "base_success": {task: base[task]["success_once"] for task in between}, "budgets": rows,
            "vae_seconds": read_json(run / "stages" / "vae.json")["seconds"],
            "vae_held_out_psnr": (read_json(run / "vae" / "metrics.json").get("held_out") or {}).get("psnr") if (run / "vae" / "metrics.json").is_file() else None}  # fmt: skip


def fidelity_table(results: dict[str, Any]) -> str:
    """fidelity.md: the margins by budget, then the gate's kappa per task by budget."""

    def cell(value: float | None, stderr: float | None = None, digits: int = 2) -> str:
        if value is None:
            return "-"
        return f"{value:+.{digits}f} ± {stderr:.{digits}f}" if stderr is not None else f"{value:.{digits}f}"

    vae = results.get("vae_held_out_psnr")
    lines = [f"World-model fidelity against the DiT's training minutes (the VAE: {results['vae_seconds']:.0f} s, shared"
             + ("" if vae is None else f"; held-out PSNR {vae:.2f} dB") + ").", "",
             "PSNR margin over copy-last-frame (± paired SE over held-out base-policy rollouts) and action ΔPSNR at 8 frames:", "",
             "| DiT minutes | steps | " + " | ".join(f"margin @ {h}" for h in HORIZONS) + " | action ΔPSNR @ 8 | the VAE alone @ 8 |",
             "| ---: | ---: | " + " | ".join("---:" for _ in HORIZONS) + " | ---: | ---: |"]  # fmt: skip
    for row in results["budgets"]:
        at = row["horizons"]
        margins = [cell(at[h]["margin"], at[h]["margin_stderr"]) if h in at else "-" for h in HORIZONS]
        eight = at.get("8", {})
        lines.append(f"| {row['minutes']:g} | {row['steps']} | " + " | ".join(margins) + f" | {cell(eight.get('action_delta_psnr'))} | {cell(eight.get('vae_psnr'))} |")
    tasks = results["tasks_between"]
    lines += ["", "Fidelity gate: kappa (± SE) of the replays' verdicts against the simulator's, on the tasks with base success in 10-90 %,",
              "and in brackets the AUROC of the replays' scores (how often a real success's replay scores above a real failure's):", "",
              "| DiT minutes | " + " | ".join(f"{t} ({results['base_success'][t]:.2f})" for t in tasks) + " | passed |",
              "| ---: | " + " | ".join("---:" for _ in tasks) + " | ---: |"]  # fmt: skip
    for row in results["budgets"]:
        kappas = [(cell(row["kappa"][t]["kappa"], row["kappa"][t]["kappa_stderr"]) if row["kappa"][t]["kappa"] is not None else "undefined")
                  + ("" if row["kappa"][t].get("auroc") is None else f" ({row['kappa'][t]['auroc']:.2f})") for t in tasks]
        lines.append(f"| {row['minutes']:g} | " + " | ".join(kappas) + f" | {len(row['passed'])} of {len(tasks)} |")
    return "\n".join(lines) + "\n"


def fidelity_plot(results: dict[str, Any], path: Path) -> None:
    """fidelity.png: the margin at each horizon against the DiT's minutes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for h in HORIZONS:
        points = [(row["minutes"], row["horizons"][h]) for row in results["budgets"] if h in row["horizons"]]
        if points:
            ax.errorbar([m for m, _ in points], [r["margin"] for _, r in points], yerr=[r["margin_stderr"] for _, r in points],
                        marker="o", capsize=3, label=f"{h} frames")  # fmt: skip
    ax.axhline(0, color="grey", lw=0.8)
    ax.set(xlabel="DiT training minutes", ylabel="PSNR margin over copy-last-frame (dB)", xscale="log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_fidelity(config: Config, run: Path, minutes: Sequence[float], preset: str, overrides: list[str], verb=None) -> dict[str, Any]:
    """Every unfinished stage, then RUN/fidelity.md, .json and .png; returns the results."""
    from worldloop.config import save_config
    from worldloop.utils.io import atomic_write_json, atomic_write_text

    run.mkdir(parents=True, exist_ok=True)
    save_config(config, run)
    stages = plan_fidelity(config, run, minutes)
    gate = run / f"gate_{budget_name(minutes[0])}"  # no stage here is gated: RL does not run
    run_stages(config, run, stages, gate, preset, overrides, verb, label="fidelity")
    results = fidelity_results(run, minutes)
    atomic_write_json(run / "fidelity.json", results)
    atomic_write_text(run / "fidelity.md", fidelity_table(results))
    fidelity_plot(results, run / "fidelity.png")
    return results

"""The loop's report: RUN/results.json (every number) and RUN/report.md (the same numbers, with
PNG plots and links to videos). The Markdown is rendered from results.json, so the two agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from worldloop.utils.io import atomic_write_json, atomic_write_text, read_json
from worldloop.utils.stats import format_kappa

POLICY_STAGES = {"base": "eval_base", "stage1": "eval_rl1", "stage2": "eval_rl2"}
RL_STAGES = {"stage1": "rl1", "stage2": "rl2"}


def collect_results(run: Path, paths: dict[str, str], stage_seconds: dict[str, float]) -> dict[str, Any]:
    """Gather the numbers the stages wrote into one mapping."""
    evaluations = {name: read_json(run / folder / "results.json") for name, folder in POLICY_STAGES.items() if (run / folder / "results.json").is_file()}
    tasks = next(iter(evaluations.values()))["per_task"].keys() if evaluations else []
    per_task = {
        task: {name: _rate(result["per_task"][task]) for name, result in evaluations.items() if task in result["per_task"]} for task in tasks
    }
    overall = {name: _rate(result) for name, result in evaluations.items()}
    imagination = {}
    for name, key in RL_STAGES.items():
        file = Path(paths[key]) / "results.json"
        if file.is_file():
            rl = read_json(file)
            imagination[name] = {
                "evaluations": [
                    {"iteration": e["iteration"], "real": _with_tasks(e["real"]), **({"imagined": _with_tasks(e["imagined"])} if "imagined" in e else {}),
                     **({"kappa": e["kappa"], "kappa_stderr": e["kappa_stderr"]} if e.get("kappa") is not None else {}),
                     **({"per_task_kappa": e["per_task_kappa"]} if e.get("per_task_kappa") else {}),
                     **({"tracking": e["tracking"]} if e.get("tracking") else {}),
                     **({"gap_sources": {name: _with_tasks(step) | {"kappa": step["kappa"], "kappa_stderr": step["kappa_stderr"]}
                                         for name, step in e["gap_sources"].items()}} if e.get("gap_sources") else {})}  # fmt: skip
                    for e in rl["evaluations"]
                ],
                "train_success": [h.get("env/success_once") for h in rl["history"]],
            }
    world_model = {}
    for name, folder in (("base", "eval_wm_base"),):
        file = run / folder / "metrics.json"
        if file.is_file():
            world_model[name] = read_json(file)["horizons"]
    gate = run / "gate" / "gate.json"
    markers = {p.stem: read_json(p) for p in sorted((run / "stages").glob("*.json"))}
    skipped = {stage: marker["skipped"] for stage, marker in markers.items() if "skipped" in marker}
    return {
        "gate": read_json(gate) if gate.is_file() else None,
        "skipped_stages": skipped,
        "overall": overall,
        "per_task": per_task,
        "imagination_vs_reality": imagination,
        "world_model": world_model,
        "stage_seconds": stage_seconds,
        "paths": paths,
    }


def write_report(run: Path, paths: dict[str, str], stage_seconds: dict[str, float]) -> Path:
    results = collect_results(run, paths, stage_seconds)
    atomic_write_json(run / "results.json", results)
    plots = write_plots(run, results)
    atomic_write_text(run / "report.md", render_markdown(run, results, plots))
    print(f"loop: report at {run / 'report.md'}")
    return run / "report.md"


def render_markdown(run: Path, results: dict[str, Any], plots: list[str]) -> str:
    names = [n for n in POLICY_STAGES if n in results["overall"]]
    lines = ["# worldloop report", "", f"Run folder: `{run}`. Every number below is also in `results.json`.", ""]
    lines += small_run_note(results)
    if results.get("gate"):
        from worldloop.diagnostics.gate import gate_table
        from worldloop.diagnostics.gate_in_sample import gate_table as in_sample_gate_table

        if "rule" not in results["gate"]:  # a run of before 2026-12-06
            gate_table = in_sample_gate_table

        lines += ["## Fidelity gate: does imagination agree with the simulator, task by task?", "", gate_table(results["gate"]), ""]
    for why in dict.fromkeys(results.get("skipped_stages", {}).values()):
        lines += [f"Skipped ({why}): " + ", ".join(stage for stage, reason in results["skipped_stages"].items() if reason == why) + ".", ""]
    lines += ["## Real-simulator success (success_once ± standard error, episodes)", ""]
    lines += ["| task | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
    for task, row in results["per_task"].items():
        lines.append(f"| {task} | " + " | ".join(_cell(row.get(n)) for n in names) + " |")
    lines.append("| **overall** | " + " | ".join(_cell(results["overall"][n]) for n in names) + " |")
    if results["imagination_vs_reality"]:
        lines += ["", "## Imagination vs reality (same policy, same initial states)", ""]
        lines += ["Kappa: how far, episode by episode, the imagined verdict agrees with the real one beyond what each task's", "success rate explains (0: RL's reward is noise; 1: every episode agrees).", ""]
        lines += ["| RL stage | iteration | real | imagined | kappa |", "| --- | ---: | ---: | ---: | ---: |"]
        for stage, block in results["imagination_vs_reality"].items():
            for e in block["evaluations"]:
                kappa = format_kappa(e["kappa"], e["kappa_stderr"]) if "kappa" in e else "-"
                lines.append(f"| {stage} | {e['iteration']} | {_cell(e['real'])} | {_cell(e.get('imagined'))} | {kappa} |")
        tracked = [(stage, e) for stage, block in results["imagination_vs_reality"].items() for e in block["evaluations"] if e.get("tracking")]
        if tracked:
            from worldloop.rl.summary import tracking_line

            lines += ["", "How long imagination follows the real trajectory (PSNR of the imagined against the real observation,",
                      "beside the initial frame's; the share of equal action tokens; the kappa of \"succeeded by then\"):", ""]
            lines += [f"- {stage} @ {e['iteration']}: {tracking_line(e['tracking'])}" for stage, e in tracked]
        sourced = [(stage, e) for stage, block in results["imagination_vs_reality"].items() for e in block["evaluations"] if e.get("gap_sources")]
        if sourced:
            from worldloop.rl.summary import sources_by_task_rows, sources_line

            lines += ["", "Where the gap comes from: the judge on the real episodes' frames, the world model replaying their actions",
                      "open loop, then the closed loop (success, and per episode kappa against the simulator):", ""]
            lines += [f"- {stage} @ {e['iteration']}: {sources_line(e)}" for stage, e in sourced]
            lines += ["", "Per task (in brackets: the per-episode kappa against the simulator within the task):", "",
                      "| RL stage | iteration | task | real | judge on real | replay | closed loop |", "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]
            lines += [f"| {stage} {row}" for stage, e in sourced for row in sources_by_task_rows(e)]
    for name, horizons in results["world_model"].items():
        lines += ["", f"## World model ({name}): open-loop replay of held-out trajectories", ""]
        lines += ["| horizon | episodes | PSNR | copy-last-frame PSNR | the VAE alone (ceiling) | SSIM | copy-last-frame SSIM |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for h, m in horizons.items():
            ceiling = f"{m['vae_psnr']:.2f}" if "vae_psnr" in m else "-"
            lines.append(f"| {h} | {m['episodes']} | {m['psnr']:.2f} | {m['copy_last_frame_psnr']:.2f} | {ceiling} | {m['ssim']:.3f} | {m['copy_last_frame_ssim']:.3f} |")
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots]
    videos = sorted(str(p.relative_to(run)) for p in run.glob("eval_*/**/*.mp4"))
    if videos:
        lines += ["", "## Videos", ""] + [f"- [{v}]({v})" for v in videos[:24]]
    lines += ["", "## Stage times (seconds)", ""] + [f"- {name}: {seconds:.0f}" for name, seconds in results["stage_seconds"].items()]
    return "\n".join(lines) + "\n"


def write_plots(run: Path, results: dict[str, Any]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    names = [n for n in POLICY_STAGES if n in results["overall"]]
    if results["per_task"] and names:
        tasks = list(results["per_task"])
        fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(tasks)), 3.5))
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            rows = [results["per_task"][t].get(name, {"success_once": 0.0, "stderr": 0.0}) for t in tasks]
            xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(tasks))]
            ax.bar(xs, [r["success_once"] for r in rows], width, yerr=[r["stderr"] for r in rows], label=name, capsize=2)
        ax.set_xticks(range(len(tasks)), tasks, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("real success_once")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=8)
        written.append(_save(fig, run / "per_task.png", run))
    blocks = results["imagination_vs_reality"]
    if blocks:
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
        offset = 0
        for stage, block in blocks.items():
            train = [v for v in block["train_success"] if v is not None]
            left.plot(range(offset, offset + len(train)), train, label=f"{stage}: imagined (training)")
            real = block["evaluations"]
            left.errorbar([offset + e["iteration"] for e in real], [e["real"]["success_once"] for e in real], yerr=[e["real"]["stderr"] for e in real], fmt="o", label=f"{stage}: real eval")
            offset += len(train)
            pairs = [e for e in real if "imagined" in e]
            right.errorbar(
                [e["real"]["success_once"] for e in pairs], [e["imagined"]["success_once"] for e in pairs],
                xerr=[e["real"]["stderr"] for e in pairs], yerr=[e["imagined"]["stderr"] for e in pairs], fmt="o", label=stage,
            )  # fmt: skip
        left.set_xlabel("RL iteration")
        left.set_ylabel("success_once")
        left.legend(fontsize=7)
        right.plot([0, 1], [0, 1], "k--", linewidth=0.8)
        right.set_xlabel("real success_once")
        right.set_ylabel("imagined success_once")
        right.legend(fontsize=7)
        written.append(_save(fig, run / "learning_curves.png", run))
    return written


def _save(fig, path: Path, run: Path) -> str:
    from worldloop.utils.io import save_figure

    return str(save_figure(fig, path, dpi=110).relative_to(run))


def _rate(block: dict[str, Any]) -> dict[str, Any]:
    return {"success_once": block["success_once"], "stderr": block["stderr"], "episodes": block["episodes"]}


def _with_tasks(block: dict[str, Any]) -> dict[str, Any]:
    """A success summary with its per-task rates, and its per-task kappas against the simulator where measured."""
    per_task = {"per_task": {task: _rate(rate) for task, rate in block.get("per_task", {}).items()}}
    return _rate(block) | per_task | ({"per_task_kappa": block["per_task_kappa"]} if "per_task_kappa" in block else {})


FEW = 10
"""Episodes below which a rate is marked as too few to mean anything (one success more or less moves it by >= 0.1)."""


def _cell(rate: dict[str, Any] | None) -> str:
    if rate is None:
        return "-"
    few = " (too few)" if rate["episodes"] < FEW else ""
    return f"{rate['success_once']:.3f} ± {rate['stderr']:.3f} (n={rate['episodes']}){few}"


def small_run_note(results: dict[str, Any]) -> list[str]:
    """What a run evaluated on a handful of episodes per task can and cannot show: the report's opening lines."""
    counts = [rate["episodes"] for row in results["per_task"].values() for rate in row.values()]
    if not counts or max(counts) >= FEW:
        return []
    return [f"**A small run.** Each policy was evaluated on {max(counts)} episode(s) per task: a per-task rate is then 0 or 1 or",
            f"close to it and says nothing (cells marked \"too few\", n < {FEW}). A run this size (the tiny-cpu and micro presets)",
            "shows the mechanics, every stage, artifact and this report, not a gain: its models are tiny and briefly trained.",
            "What worldloop measures on a GPU, with enough episodes for standard errors that mean something, is in the",
            "worldloop repository's docs/results.md (`worldloop loop --preset metaworld-gpu`).", ""]  # fmt: skip

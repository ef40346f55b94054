"""The summary of one `worldloop rl` run: rl's results.md, the judge's calibration lines, the first and the last
check side by side, the training rollouts' success and the warnings.

    worldloop rl ... --out OUT/rl > OUT/rl.log 2>&1
    python tools/rl_summary.py OUT      (OUT holds rl/results.json, rl/results.md and rl.log)
"""

import json
import math
import statistics
import sys
from pathlib import Path


def change(a: dict, b: dict) -> str:
    """'a -> b (+d, +x unpaired SE)' between two success_once results; results.md has the paired change."""
    d = b["success_once"] - a["success_once"]
    se = math.hypot(a["stderr"], b["stderr"]) or float("nan")
    return f"{a['success_once']:.3f} -> {b['success_once']:.3f} ({d:+.3f}, {d / se:+.1f} unpaired SE)"


def window_mean(history: list[dict], key: str) -> str:
    """Mean ± SE of `key` over these iterations: one iteration's few initial states swing it far from its trend."""
    values = [h[key] for h in history]
    mean = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return f"{mean:.3f} ± {se:.3f} (iterations {history[0]['iteration']}-{history[-1]['iteration']})"


def summary(out: Path) -> list[str]:
    path, log = out / "rl" / "results.json", out / "rl.log"
    calibration = [line for line in (log.read_text().splitlines() if log.is_file() else [])  # rl.judge_threshold=replay's own lines
                   if line.startswith(("judge threshold", "rl: training on", "worldloop rl: config error"))]
    if not path.is_file():
        return [f"no {path}: rl did not finish (see {out}/rl.log)", *calibration]
    try:
        results = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        return [f"{path} is not valid JSON ({error}): rl was cut while writing it, or the file was damaged"]
    lines = [(out / "rl" / "results.md").read_text(), *calibration]  # results.md: the paired changes from the first check to the last
    evals = results["evaluations"]
    if len(evals) >= 2:
        first, last = evals[0], evals[-1]
        lines.append(f"real success_once: {change(first['real'], last['real'])}")
        lines += [f"  {task}: {change(first['real']['per_task'][task], last['real']['per_task'][task])}" for task in last["real"]["per_task"]]
        if "imagined" in first and "imagined" in last:  # the criterion: both rise, on one task
            lines.append(f"imagined success_once, same initial states: {change(first['imagined'], last['imagined'])}")
            lines += [f"  {task}: {change(first['imagined']['per_task'][task], last['imagined']['per_task'][task])}"
                      for task in last["imagined"]["per_task"]]
    history = results["history"]
    if history:
        quarter = max(1, len(history) // 4)
        lines.append(f"imagined training rollouts' success_once, mean over the first and the last quarter: "
                     f"{window_mean(history[:quarter], 'env/success_once')} -> {window_mean(history[-quarter:], 'env/success_once')}")
        h = history[-1]
        lines.append(f"seconds per iteration: rollout {h['time/rollout']:.1f}, update {h['time/update']:.1f}, total {h['time/iteration']:.1f}")
    lines += [f"warning at iteration {w['iteration']}: {w['message']}" for w in results.get("warnings", [])]
    return lines


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT   (OUT/rl: a worldloop rl run, OUT/rl.log: its output)")
    print(*summary(Path(sys.argv[1])), sep="\n")

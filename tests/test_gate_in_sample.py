"""Gate folders of before 2026-12-06 (in-sample: judge_calibration.json) still rebuild: their committed numbers stay recomputable."""

from __future__ import annotations

import json

from worldloop.diagnostics.gate_in_sample import gate_verdicts


def calibration(per_task: dict[str, tuple[float, float, float | None, float]], threshold: float = 0.9, calibrated: bool = True) -> dict:
    """A judge calibration's result (``calibrate_threshold``) with (real success, judged success, kappa, kappa SE) per task."""
    return {
        "threshold": threshold, "calibrated": calibrated,
        "real": {"per_task": {t: {"success_once": r, "stderr": 0.1, "episodes": 16} for t, (r, _, _, _) in per_task.items()}},
        "replayed_after": {"per_task": {t: {"success_once": j, "stderr": 0.1, "episodes": 16} for t, (_, j, _, _) in per_task.items()},
                           "per_task_kappa": {t: {"kappa": k, "kappa_stderr": se} for t, (_, _, k, se) in per_task.items()}},
    }  # fmt: skip



def test_analyse_rebuilds_an_in_sample_gate_folder_with_each_tasks_auroc(tmp_path, capsys):
    from worldloop.cli import main

    result = calibration({"door-open-v3": (0.5, 0.5, 0.0, 0.2), "window-open-v3": (0.5, 0.5, 0.0, 0.2), "reach-v3": (0.0, 0.0, None, 0.0)})
    result["per_episode"] = {  # door: successes' replays score higher (AUROC 1); window: lower, 1 tie (AUROC 0.125)
        "score": [0.9, 0.8, 0.1, 0.2] + [0.1, 0.3, 0.3, 0.9] + [0.5, 0.6],
        "real": "1100" + "1100" + "00",
        "task": ["door-open-v3"] * 4 + ["window-open-v3"] * 4 + ["reach-v3"] * 2,
    }
    (tmp_path / "judge_calibration.json").write_text(json.dumps(result))
    (tmp_path / "gate.json").write_text(json.dumps(gate_verdicts(calibration({"door-open-v3": (0.5, 0.5, 0.0, 0.2)}), 0.6, 2.0)))
    assert main(["analyse", str(tmp_path)]) == 0  # a committed gate folder: gate.json and gate.md from the replays' scores
    rows = json.loads((tmp_path / "gate.json").read_text())["tasks"]
    assert rows["door-open-v3"]["auroc"] == 1.0 and rows["window-open-v3"]["auroc"] == 0.125 and rows["reach-v3"]["auroc"] is None
    assert "| 0.00 ± 0.20 | 1.00 | no: kappa 0.00 ± 0.20 is below 0.6 |" in (tmp_path / "gate.md").read_text()
    assert "gate.md and gate.json rebuilt from judge_calibration.json" in capsys.readouterr().out



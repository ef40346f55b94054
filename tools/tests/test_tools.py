"""The remote-host helpers (tools/): what a time-limited call runs to bring results back, and rl's summary."""

import json
import subprocess
import sys
import tarfile
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1]
POLL = TOOLS / "poll.sh"


def poll(results: Path, dest: Path, wait_s: int = 60) -> subprocess.CompletedProcess:
    # the timeout only stops a poll that would wait: both cases below must return at once
    return subprocess.run(["bash", str(POLL), str(results), str(dest), str(wait_s), "r1"], capture_output=True, text=True, timeout=30)


def test_poll_on_a_machine_without_the_run_says_so_at_once(tmp_path):
    done = poll(tmp_path / "wl", tmp_path / "out")
    assert done.returncode == 3
    assert "does not exist" in done.stderr and "went back" in done.stderr
    assert not (tmp_path / "out" / "r1.tgz").exists()


def test_poll_packs_a_finished_run_without_waiting(tmp_path):
    results = tmp_path / "wl"
    (results / "rl").mkdir(parents=True)
    (results / "run.log").write_text("stage 1 of 15\nreport: /root/mw/report.md\n")
    (results / "done").write_text("exit 0\n")
    (results / "rl" / "results.json").write_text("{}")
    (results / "rl" / "model.safetensors").write_bytes(b"weights stay on the device")
    (results / "started").write_text("1765000000\n")  # a marker without an extension comes back too
    done = poll(results, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert "report: /root/mw/report.md" in done.stdout and "exit 0" in done.stdout
    with tarfile.open(tmp_path / "out" / "r1.tgz") as archive:
        names = {Path(name).as_posix().lstrip("./") for name in archive.getnames()}
    assert "rl/results.json" in names and "run.log" in names and "started" in names and "done" in names
    assert "rl/model.safetensors" not in names


def rl_summary(out: Path) -> subprocess.CompletedProcess:
    script = TOOLS / "rl_summary.py"
    return subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=60)


def check(rate: float, se: float) -> dict:
    """One reality check's success_once result, on door-open alone."""
    return {"success_once": rate, "stderr": se, "per_task": {"door-open-v3": {"success_once": rate, "stderr": se}}}


def test_rl_summary_averages_the_training_success_over_quarters_and_names_its_standard_errors(tmp_path):
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl.log").write_text("judge threshold 0.5 -> 0.9, chosen on replays\nit 1: noise\n")
    (tmp_path / "rl" / "results.md").write_text("| iteration | real |\n")
    timing = {"time/rollout": 5.0, "time/update": 0.5, "time/iteration": 5.5}
    rates = [0.5, 0.7, 0.9, 0.1, 0.6, 0.6, 0.2, 0.4]  # the last iteration alone (0.4) would read as a fall from 0.5
    (tmp_path / "rl" / "results.json").write_text(json.dumps({
        "evaluations": [{"real": check(0.25, 0.03), "imagined": check(0.5, 0.04)}, {"real": check(0.35, 0.04), "imagined": check(0.55, 0.03)}],
        "history": [{"iteration": i + 1, "env/success_once": r, **timing} for i, r in enumerate(rates)],
        "warnings": [{"iteration": 4, "message": "optimistic"}],
    }))
    done = rl_summary(tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "judge threshold 0.5 -> 0.9, chosen on replays" in lines and "it 1: noise" not in lines
    assert "real success_once: 0.250 -> 0.350 (+0.100, +2.0 unpaired SE)" in lines
    assert "  door-open-v3: 0.250 -> 0.350 (+0.100, +2.0 unpaired SE)" in lines
    assert "imagined success_once, same initial states: 0.500 -> 0.550 (+0.050, +1.0 unpaired SE)" in lines
    assert ("imagined training rollouts' success_once, mean over the first and the last quarter: "
            "0.600 ± 0.100 (iterations 1-2) -> 0.300 ± 0.100 (iterations 7-8)") in lines
    assert "warning at iteration 4: optimistic" in lines


def test_rl_summary_of_an_unfinished_run_says_so(tmp_path):
    done = rl_summary(tmp_path)
    assert done.returncode == 0
    assert "rl did not finish" in done.stdout


def test_rl_summary_names_a_damaged_results_file_and_its_own_usage(tmp_path):
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "results.json").write_text('{"evaluations": [')
    done = rl_summary(tmp_path)
    assert done.returncode == 0 and "results.json is not valid JSON" in done.stdout
    script = TOOLS / "rl_summary.py"
    usage = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 1 and "usage:" in usage.stderr


def test_site_carry_keeps_the_files_the_models_reach_through_includes(tmp_path):
    sys.path.insert(0, str(TOOLS))
    from site_carry import reachable_assets

    (tmp_path / "xyz").mkdir()
    (tmp_path / "objects" / "assets").mkdir(parents=True)
    (tmp_path / "xyz" / "task_a.xml").write_text('<mujoco><include file="../objects/assets/base.xml"/></mujoco>')
    (tmp_path / "xyz" / "task_b.xml").write_text('<mujoco><mesh file="unused.stl"/></mujoco>')
    # an include named relative to the main model's folder, not the including file's
    (tmp_path / "objects" / "assets" / "base.xml").write_text('<mujoco><include file="shared.xml"/><texture file="../t/wood.png"/></mujoco>')
    (tmp_path / "objects" / "shared.xml").write_text('<mujoco><mesh file="arm.stl"/></mujoco>')
    assert reachable_assets(tmp_path, ["task_a.xml"]) == {"task_a.xml", "base.xml", "shared.xml", "wood.png", "arm.stl"}

"""The GPU session's shell helpers (scripts/gpu): what a device call runs to bring results back."""

import subprocess
import tarfile
from pathlib import Path

POLL = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "poll.sh"


def poll(results: Path, dest: Path, wait_s: int = 60) -> subprocess.CompletedProcess:
    # the timeout only stops a poll that would wait: both cases below must return at once
    return subprocess.run(["bash", str(POLL), str(results), str(dest), str(wait_s), "r1"], capture_output=True, text=True, timeout=30)


def test_poll_on_a_machine_without_the_session_says_so_at_once(tmp_path):
    done = poll(tmp_path / "wl", tmp_path / "out")
    assert done.returncode == 3
    assert "does not exist" in done.stderr and "went back" in done.stderr
    assert not (tmp_path / "out" / "r1.tgz").exists()


def test_poll_packs_a_finished_session_without_waiting(tmp_path):
    results = tmp_path / "wl"
    (results / "rl").mkdir(parents=True)
    (results / "progress.txt").write_text("[00:00:01 +0m1s] session start\n[00:20:00 +20m0s] session done\n")
    (results / "rl" / "results.json").write_text("{}")
    (results / "rl" / "model.safetensors").write_bytes(b"weights stay on the device")
    done = poll(results, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert "session done" in done.stdout
    with tarfile.open(tmp_path / "out" / "r1.tgz") as archive:
        names = {Path(name).as_posix().lstrip("./") for name in archive.getnames()}
    assert "rl/results.json" in names and "progress.txt" in names
    assert "rl/model.safetensors" not in names

"""Nothing lost: a long verb killed at a random point resumes to the output of an uninterrupted run,
a folder holds one run (another run's settings are refused and change nothing), a killed loop
leaves no live stage, and expected failures end in one short line."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from _policy_fixtures import TINY
from conftest import TINY_OVERRIDES
from safetensors.torch import load_file

from worldloop.cli import main

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
# one thread in every child, as in this process: the same arithmetic, and the two cores left to the others
ENV = os.environ | {"PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
SFT = [*TINY, "sft.steps=6"]  # a checkpoint (and a held-out evaluation) every quarter of the steps: at 2, 4 and 6


def start(argv: list[str], log: Path) -> subprocess.Popen:
    handle = open(log, "w")
    return subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=ENV, cwd=ROOT)


def worldloop(*args: str) -> list[str]:
    return [sys.executable, "-m", "worldloop", *args]


def wait_for(condition, process: subprocess.Popen | None = None, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the process ended ({process.returncode}) before the condition held")
        if time.time() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


def checkpoint_at_least(folder: Path, step: int):
    return lambda: any(int(p.name.split("_")[1]) >= step for p in (folder / "checkpoints").glob("step_*") if (p / "state.pt").is_file())


def episodes_at_least(folder: Path, count: int):
    def committed() -> bool:
        try:
            return json.loads((folder / "meta" / "info.json").read_text())["total_episodes"] >= count
        except (OSError, ValueError):
            return False

    return committed


def weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every safetensors file under ``folder`` (checkpoints aside), by file and name."""
    files = sorted(p for p in folder.rglob("*.safetensors") if "checkpoints" not in p.parts and not p.name.startswith("."))
    return {f"{p.relative_to(folder)}:{k}": v for p in files for k, v in load_file(p).items()}


def episodes(folder: Path) -> dict[str, torch.Tensor]:
    from worldloop.data.dataset import TrajectoryDataset

    dataset = TrajectoryDataset(folder)
    out = {}
    for i in range(dataset.num_episodes):
        episode = dataset.episode(i)
        out[f"{i}:frames"], out[f"{i}:actions"] = torch.as_tensor(episode.frames), torch.as_tensor(episode.actions)
    return out


RL_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    torch.set_num_threads(1)
    from _rl_fixtures import ToyPolicy
    from test_rl_train import config, imagined
    from worldloop.rl.trainer import train
    torch.manual_seed(0)
    policy = ToyPolicy()
    results = train(policy, imagined(32, 8), config(iterations=6, entropy_coef=0.01, kl_coef=0.1), sys.argv[1], seed=3, console=False)
    print(json.dumps([h["rollout/kept_groups"] for h in results["history"]]))
    """
)


@pytest.fixture(scope="module")
def squares(tmp_path_factory) -> Path:
    """A LeRobot dataset of 6 synthetic 32x32 episodes (a square the actions move): the VAE and the world model train fast on it."""
    from _worldmodel_fixtures import square_episodes

    from worldloop.data.writer import DatasetWriter

    root = tmp_path_factory.mktemp("squares") / "dataset"
    with DatasetWriter(root, fps=10, image_size=32, action_dim=2) as writer:
        for episode in square_episodes(6, seed=1, length=16):
            writer.add_episode(episode.frames, episode.actions, np.zeros(len(episode.frames), bool), "move the square")
    return root


def kill_case(verb: str, tmp_path: Path, tiny_dataset: Path, squares: Path):
    """(command writing into a folder, condition to kill after (given the folder), how to read its output)."""
    if verb == "collect":
        command = lambda out: worldloop("collect", "--out", str(out), "--episodes-per-task", "3", "--no-progress", *TINY_OVERRIDES,  # noqa: E731
                                        "collect.num_envs=1", "sim.max_steps=24")  # fmt: skip
        return command, lambda out: episodes_at_least(out, random.Random(out.name).randint(1, 4)), episodes
    if verb == "sft":
        command = lambda out: worldloop("sft", "--dataset", str(tiny_dataset), "--out", str(out), "--episodes-per-task", "1", *SFT, "sft.steps=8")  # noqa: E731
        return command, lambda out: checkpoint_at_least(out, random.Random(out.name).randint(1, 4)), weights
    if verb == "train-vae":
        command = lambda out: worldloop("train-vae", "--dataset", str(squares), "--out", str(out), "--preset", "micro",  # noqa: E731
                                        "vae.steps=5", "vae.checkpoint_every=1")  # fmt: skip
        return command, lambda out: checkpoint_at_least(out, random.Random(out.name).randint(1, 3)), weights
    if verb == "train-wm":
        from _worldmodel_fixtures import tiny_vae

        vae = tmp_path / "vae"
        tiny_vae().save_pretrained(str(vae), safe_serialization=True)
        command = lambda out: worldloop("train-wm", "--dataset", str(squares), "--vae", str(vae), "--out", str(out), "--preset", "micro",  # noqa: E731
                                        "world_model.steps=6", "world_model.checkpoint_every=1", "world_model.batch_size=2")  # fmt: skip
        return command, lambda out: checkpoint_at_least(out, random.Random(out.name).randint(1, 3)), weights
    if verb == "rl":  # the trainer on the toy world (a perfect world model and judge): groups score apart, the policy moves
        command = lambda out: [sys.executable, "-c", RL_SCRIPT, str(out)]  # noqa: E731
        return command, lambda out: checkpoint_at_least(out, random.Random(out.name).randint(1, 4)), weights
    raise ValueError(verb)


@pytest.mark.parametrize("verb", ["collect", "sft", "train-vae", "train-wm", "rl"])
def test_a_verb_killed_at_a_random_point_resumes_to_the_uninterrupted_output(verb, tmp_path, tiny_dataset, squares):
    command, kill_after, output = kill_case(verb, tmp_path, tiny_dataset, squares)
    straight, interrupted = tmp_path / "straight", tmp_path / f"killed-{random.randrange(1000)}"
    victim = start(command(interrupted), tmp_path / "killed.log")

    def kill() -> None:
        wait_for(kill_after(interrupted), victim)
        time.sleep(random.uniform(0, 0.05))  # anywhere in the step after that checkpoint, or the next
        victim.send_signal(signal.SIGKILL)

    killer = threading.Thread(target=kill)
    killer.start()
    try:  # meanwhile the uninterrupted run, here (a CLI verb in this process: one interpreter start less)
        reference = command(straight)
        if reference[1] == "-m":
            assert main(reference[3:]) == 0
        else:
            subprocess.run(reference, check=True, env=ENV, cwd=ROOT, capture_output=True)
    finally:
        killer.join()
    assert victim.wait() == -signal.SIGKILL, (tmp_path / "killed.log").read_text()

    resumed = subprocess.run(command(interrupted), capture_output=True, text=True, env=ENV, cwd=ROOT)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    if verb == "collect":
        assert "already there" in resumed.stdout
    else:
        assert "resuming from " in resumed.stdout and " at step " in resumed.stdout, resumed.stdout
    expected, got = output(straight), output(interrupted)
    assert expected.keys() == got.keys() and expected
    for name, value in expected.items():
        assert torch.equal(value, got[name]), name
    if verb == "rl":  # real updates after the resume: groups kept (not all filtered), and the policy left its initial weights
        resumed_at = int(resumed.stdout.split(" at step ")[1].split()[0])
        assert sum(json.loads(resumed.stdout.strip().splitlines()[-1])[resumed_at:]) > 0
        torch.manual_seed(0)
        from _rl_fixtures import ToyPolicy

        initial = ToyPolicy().state_dict()
        assert not torch.equal(initial["head.weight"], got["policy/model.safetensors:head.weight"])


def test_sft_into_a_folder_with_another_finished_run_is_refused_and_changes_nothing(tiny_dataset, tmp_path, capsys):
    out = tmp_path / "A"
    assert main(["sft", "--dataset", str(tiny_dataset), "--out", str(out), "--episodes-per-task", "1", *SFT]) == 0
    assert (out / "checkpoints" / "step_000000006").is_dir()  # a checkpoint at the last step too
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()

    assert main(["sft", "--dataset", str(tiny_dataset), "--out", str(out), "--episodes-per-task", "1", *SFT, "sft.steps=4", "sft.lr=0.01"]) == 2
    error = capsys.readouterr().err.strip()
    assert "sft.steps: 6 there, 4 now" in error and "sft.lr:" in error and "--overwrite" in error and len(error.splitlines()) == 1
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before

    # the same settings: the run is complete, and stays as it is
    assert main(["sft", "--dataset", str(tiny_dataset), "--out", str(out), "--episodes-per-task", "1", *SFT]) == 0
    assert "already holds this run" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before

    # --overwrite replaces it with the new run
    assert main(["sft", "--dataset", str(tiny_dataset), "--out", str(out), "--episodes-per-task", "1", *SFT, "sft.steps=4", "--overwrite"]) == 0
    assert json.loads((out / "sft_results.json").read_text())["steps"] == 4
    assert json.loads((out / "run.json").read_text())["settings"]["config"]["sft"]["steps"] == 4


def test_a_held_lock_a_full_disk_and_a_read_only_folder_give_one_line(tiny_dataset, tmp_path, capsys, monkeypatch):
    from worldloop.utils.runfolder import FolderLock

    out = tmp_path / "busy"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", f"import fcntl, time; f = open({str(out / '.writer.lock')!r}, 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["collect", "--out", str(out), "--episodes-per-task", "1", *TINY_OVERRIDES]) == 1
        error = capsys.readouterr().err.strip()
        assert "being written by another process" in error and len(error.splitlines()) == 1
    finally:
        holder.kill()
        holder.wait()
    with FolderLock(out):  # released by the holder's death, however it died
        pass

    # a full disk (or a read-only file system) on the first file written: one line naming the folder
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "full" / ".run.json.x1.tmp"))
    monkeypatch.setattr("tempfile.mkstemp", lambda *a, **k: (_ for _ in ()).throw(full))
    assert main(["sft", "--dataset", str(tiny_dataset), "--out", str(tmp_path / "full"), *SFT]) == 1
    error = capsys.readouterr().err.strip()
    assert error == f"worldloop sft: error: No space left on device: {tmp_path / 'full'}; free some space and rerun to resume"
    monkeypatch.undo()
    from worldloop.utils.runfolder import as_os_error  # safetensors says it in its message, not as an OSError

    assert as_os_error(RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")).errno == errno.ENOSPC

    # a read-only file system (what root meets too, where a chmod-ed folder would not stop it): one line naming the folder
    read_only = OSError(errno.EROFS, "Read-only file system", str(tmp_path / "ro" / ".run.json.x1.tmp"))
    monkeypatch.setattr("tempfile.mkstemp", lambda *a, **k: (_ for _ in ()).throw(read_only))
    assert main(["sft", "--dataset", str(tiny_dataset), "--out", str(tmp_path / "ro"), *SFT]) == 1
    error = capsys.readouterr().err.strip()
    assert "Read-only file system" in error and str(tmp_path / "ro") in error and len(error.splitlines()) == 1, error
    monkeypatch.undo()

    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    locked = tmp_path / "read-only"
    locked.mkdir(mode=0o555)
    try:
        for out in (locked, locked / "model"):  # a read-only --out, or one that cannot be made
            assert main(["sft", "--dataset", str(tiny_dataset), "--out", str(out), "--episodes-per-task", "1", *SFT]) == 1
            error = capsys.readouterr().err.strip()
            assert "Permission denied" in error and str(locked) in error and len(error.splitlines()) == 1, error
        with pytest.raises(PermissionError):  # --debug: the traceback
            main(["sft", "--dataset", str(tiny_dataset), "--out", str(locked), "--debug", *SFT])
    finally:
        os.environ.pop("WORLDLOOP_DEBUG", None)
        locked.chmod(0o755)


@pytest.fixture(scope="module")
def sft_policy(tiny_dataset, tmp_path_factory) -> Path:
    """A finished 6-step `worldloop sft` run of the tiny dataset (it keeps the checkpoints of steps 4 and 6)."""
    out = tmp_path_factory.mktemp("sft") / "policy"
    assert main(["sft", "--dataset", str(tiny_dataset), "--out", str(out), "--episodes-per-task", "1", *SFT]) == 0
    return out


def test_a_damaged_newest_checkpoint_is_named_and_the_one_before_it_resumed(sft_policy, tiny_dataset, tmp_path, capsys):
    from safetensors.torch import save_file

    out = shutil.copytree(sft_policy, tmp_path / "run")
    record = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps(record | {"finished": None}))  # as if killed after its last checkpoint
    newest, previous = out / "checkpoints" / "step_000000006", out / "checkpoints" / "step_000000004"
    (newest / "state.pt").write_bytes((newest / "state.pt").read_bytes()[:1000])  # truncated
    argv = ["sft", "--dataset", str(tiny_dataset), "--out", str(out), "--episodes-per-task", "1", *SFT]
    capsys.readouterr()
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert f"sft: warning: checkpoint file {newest / 'state.pt'} cannot be read" in printed
    assert f"sft: resuming from {previous} at step 4" in printed
    resumed, uninterrupted = weights(out), weights(sft_policy)  # steps 5-6 again: the same policy
    assert resumed.keys() == uninterrupted.keys() and all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)

    # every checkpoint damaged (the one before holds NaN weights): one line naming both, nothing resumed
    (out / "run.json").write_text(json.dumps(record | {"finished": None}))
    (newest / "state.pt").write_bytes((newest / "state.pt").read_bytes()[:1000])
    tensors = load_file(previous / "model.safetensors")
    name = next(k for k, v in tensors.items() if v.is_floating_point())
    save_file(tensors | {name: torch.full_like(tensors[name], float("nan"))}, previous / "model.safetensors")
    assert main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and f"no checkpoint of {out} can be read" in error and "--overwrite" in error
    assert f"{newest / 'state.pt'} cannot be read" in error and f"{previous / 'model.safetensors'} holds weights that are not finite" in error


def test_weights_that_are_not_finite_are_refused_on_load_naming_the_file(sft_policy, tmp_path, capsys):
    """A model file with a valid header and NaN data: the verb stops before it acts, in one line, and leaves no folder."""
    from safetensors.torch import save_file

    policy = shutil.copytree(sft_policy, tmp_path / "policy", ignore=shutil.ignore_patterns("checkpoints"))
    tensors = load_file(policy / "model.safetensors")
    name = next(k for k, v in tensors.items() if v.is_floating_point() and v.numel() > 1)
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("inf")
    save_file(tensors, policy / "model.safetensors")
    capsys.readouterr()
    assert main(["eval", "--policy", str(policy), "--out", str(tmp_path / "eval"), "--episodes-per-task", "1", *TINY_OVERRIDES]) == 2
    error = capsys.readouterr().err.strip()
    assert error == (f"worldloop eval: error: {policy / 'model.safetensors'} holds weights that are not finite (1 of {tensors[name].numel()} "
                     f"values of '{name}' are NaN or infinite); the file is damaged or its training diverged: train it again or restore the file")  # fmt: skip
    assert not (tmp_path / "eval").exists()


def test_train_wm_refuses_frames_its_vae_was_not_trained_on(squares, tiny_dataset, tmp_path, capsys):
    from _worldmodel_fixtures import tiny_vae

    vae = tmp_path / "vae"
    tiny_vae().save_pretrained(str(vae), safe_serialization=True)
    (vae / "metrics.json").write_text(json.dumps({"image_size": 64}))  # as train-vae records the frames it learned
    out = tmp_path / "wm"
    capsys.readouterr()
    assert main(["train-wm", "--dataset", str(squares), "--vae", str(vae), "--out", str(out), "--preset", "micro", "world_model.steps=1"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"worldloop train-wm: error: the VAE {vae} was trained on 64x64 frames, {squares} holds 32x32: train a VAE on these")
    assert len(error.splitlines()) == 1 and not out.exists()
    # datasets of two frame sizes (the squares 32 px, the tiny collection 64 px): a world model learns one
    assert main(["train-wm", "--dataset", str(squares), str(tiny_dataset), "--vae", str(vae), "--out", str(out), "--preset", "micro"]) == 2
    assert f"{squares}: 32px, {tiny_dataset}: 64px" in capsys.readouterr().err and not out.exists()


def test_a_verb_failed_on_a_missing_input_leaves_nothing_and_runs_once_the_input_exists(sft_policy, tmp_path, monkeypatch, capsys):
    from worldloop.config import load_config
    from worldloop.utils.runfolder import RunSpec, run_settings

    monkeypatch.chdir(tmp_path)
    argv = ["eval", "--policy", "pol", "--out", "ev", "--episodes-per-task", "1", *TINY_OVERRIDES]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == "worldloop eval: error: model folder pol does not exist" and not Path("ev").exists()
    shutil.copytree(sft_policy, "pol", ignore=shutil.ignore_patterns("checkpoints"))
    assert main(argv) == 0
    assert json.loads(Path("ev/run.json").read_text())["settings"]["options"]["policy"] == str(tmp_path / "pol")
    # input paths are recorded absolute whether they exist or not; the scripted experts and KIND:PATH judges as given
    options = {"policy": "missing", "judge": "topreward:qwen", "dataset": ["a", "b"], "suite": "libero_spatial", "against": None}
    recorded = run_settings(RunSpec(()), load_config("micro"), options)["options"]
    assert recorded == {"policy": str(tmp_path / "missing"), "judge": "topreward:qwen", "dataset": [str(tmp_path / "a"), str(tmp_path / "b")],
                        "suite": "libero_spatial", "against": None}  # fmt: skip
    assert run_settings(RunSpec(()), load_config("micro"), {"policy": "expert"})["options"] == {"policy": "expert"}


def test_files_are_written_with_the_users_umask(tiny_dataset, tmp_path):
    from worldloop.utils.checkpoint import save_checkpoint
    from worldloop.utils.io import atomic_write_json

    previous = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "a.json", {"a": 1})
        folder = save_checkpoint(tmp_path, 1, {"m": torch.nn.Linear(1, 1)})
        assert main(["sft", "--dataset", str(tiny_dataset), "--out", str(tmp_path / "model"), "--episodes-per-task", "1", *SFT, "sft.steps=1"]) == 0
    finally:
        os.umask(previous)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
    assert folder.stat().st_mode & 0o777 == 0o755 and (folder / "m.safetensors").stat().st_mode & 0o777 == 0o644
    modes = {p.relative_to(tmp_path / "model"): p.stat().st_mode & 0o777 for p in (tmp_path / "model").rglob("*")}
    assert modes and all(mode in (0o644, 0o755) for mode in modes.values()), modes


LOOP_STAGE_SCRIPT = textwrap.dedent(
    """
    import sys
    from worldloop.loop import run_verb
    sys.exit(run_verb(sys.argv[1:]))
    """
)


def test_a_killed_loop_leaves_no_live_stage(tmp_path):
    """The loop's stage (here a collection that would run for minutes) dies with the loop, whether the loop
    is killed (SIGKILL: the kernel's parent-death signal) or terminated (SIGTERM: passed on to the stage)."""
    for sig in (signal.SIGKILL, signal.SIGTERM):
        out = tmp_path / f"stage-{sig.name}"
        loop = start([sys.executable, "-c", LOOP_STAGE_SCRIPT, "collect", "--out", str(out), "--episodes-per-task", "50", "--no-progress",
                      *TINY_OVERRIDES, "collect.num_envs=2", "sim.num_workers=2"], tmp_path / "loop.log")  # fmt: skip
        wait_for(lambda: (out / "run.json").is_file() and len(descendants(loop.pid)) >= 3, loop)  # the stage and its two simulator workers
        tree = descendants(loop.pid)
        loop.send_signal(sig)
        loop.wait()
        wait_for(lambda: not any(alive(pid) for pid in tree), timeout=30)
        assert main(["collect", "--out", str(out), "--episodes-per-task", "1", *TINY_OVERRIDES, "collect.num_envs=1", "--no-progress"]) == 0  # the lock is free


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [child for child, p in parents.items() if p == parent]
        found += kids
        frontier += kids
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

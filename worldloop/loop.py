"""The closed loop (WoVR's PACE) as one resumable pipeline of worldloop verbs.

    expert demos -> SFT base policy -> base-policy rollouts -> VAE + world model (WM Base)
    -> judge -> fidelity gate -> KIR keyframes -> RL stage 1 -> real eval -> evolved-policy rollouts
    -> world-model refinement (WM Evo) -> RL stage 2 -> real eval -> report

The fidelity gate (``worldloop gate``) replays the base policy's real episodes in the world model and
asks the judge: RL trains only on the tasks whose replays agree with the simulator (``loop.gate_min_kappa``),
and when none does, the RL stages are skipped and the report says why. ``loop.time_budget_min`` gives the
RL stages the time the stages before them left.

Each stage is one CLI verb, run as its own process (a clean slate of memory, threads and GL state)
with the loop's preset and overrides; it writes its own folder under RUN/. When a stage returns, a
marker ``RUN/stages/<name>.json`` records it, so a rerun skips finished stages; a stage
interrupted midway resumes through its own checkpoints. Any stage's product can be replaced by the
user's own (``--dataset``, ``--base-policy``, ``--world-model``, ``--judge``): the stages that
would build it are then skipped.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from worldloop.config import Config
from worldloop.utils.io import atomic_write_json, read_json
from worldloop.utils.runfolder import RunError

STAGES_DIR = "stages"


@dataclass
class Stage:
    name: str
    """Short name, also the marker's file name."""
    argv: list[str]
    """The worldloop verb and its arguments (preset and overrides are appended)."""
    overrides: list[str] = field(default_factory=list)
    """Config overrides for this stage only (after the loop's own)."""
    gated: bool = False
    """Runs only when the fidelity gate passed a task (RL and what follows it)."""


@dataclass
class Inputs:
    """Products the user brings instead of having the loop build them."""

    dataset: str | None = None
    base_policy: str | None = None
    world_model: str | None = None
    judge: str | None = None
    base: str | None = None
    """A run folder whose stages before RL (demos .. keyframes, the fidelity gate included) are done, e.g.
    `worldloop experiment`'s RUN/base: only RL and the stages after it run, on that folder's products."""


def plan(config: Config, run: Path, inputs: Inputs) -> tuple[list[Stage], dict[str, str]]:
    """The stages to run, in order, and the paths of everything they produce."""
    lp = config.loop
    base = Path(inputs.base) if inputs.base else run
    paths = {
        "demos": inputs.dataset or str(base / "demos"),
        "policy_base": inputs.base_policy or str(base / "policy_base"),
        "rollouts_base": str(base / "rollouts_base"),
        "vae": str(Path(inputs.world_model) / "vae") if inputs.world_model else str(base / "vae"),  # a world model keeps its VAE in vae/
        "wm_base": inputs.world_model or str(base / "wm_base"),
        "judge": inputs.judge or (lp.judge if lp.judge.startswith("topreward:") else str(base / "judge")),
        "gate": str(base / "gate"),
        "keyframes": str(base / "keyframes"),
        "rl1": str(run / "rl1"),
        "rollouts_evo": str(run / "rollouts_evo"),
        "wm_evo": str(run / "wm_evo"),
        "rl2": str(run / "rl2"),
    }
    p = paths
    ev = ["--episodes-per-task", str(lp.eval_episodes_per_task)]
    stages: list[Stage] = []
    if inputs.dataset is None:
        stages.append(Stage("demos", ["collect", "--out", p["demos"], "--policy", "expert", "--episodes-per-task", str(lp.demo_episodes_per_task), "--no-progress"]))
    if inputs.base_policy is None:
        stages.append(Stage("policy_base", ["sft", "--dataset", p["demos"], "--out", p["policy_base"], "--episodes-per-task", str(lp.sft_episodes_per_task)]))
    stages.append(Stage("eval_base", ["eval", "--policy", p["policy_base"], "--out", str(run / "eval_base"), *ev]))
    stages.append(
        Stage(
            "rollouts_base",
            ["collect", "--out", p["rollouts_base"], "--policy", p["policy_base"], "--episodes-per-task", str(lp.base_rollouts_per_task), "--no-progress"],
        )
    )
    train_judge = inputs.judge is None and not lp.judge.startswith("topreward:")
    if inputs.world_model is None:
        stages.append(Stage("vae", ["train-vae", "--dataset", p["rollouts_base"], "--out", p["vae"]]))
        stages.append(Stage("wm_base", ["train-wm", "--dataset", p["demos"], p["rollouts_base"], "--vae", p["vae"], "--out", p["wm_base"]]))
    stages.append(Stage("eval_wm_base", ["eval-wm", "--world-model", p["wm_base"], "--dataset", p["rollouts_base"], "--out", str(run / "eval_wm_base")]))
    stages += judge_and_gate(config, p, p["wm_base"], p["judge"], p["gate"], train_judge)
    # the base policy's failure states come from its rollouts above (no second rollout)
    stages.append(Stage("keyframes", ["kir", "--dataset", p["rollouts_base"], "--failures", "--out", p["keyframes"]]))
    rl_inputs = ["--judge", p["judge"], "--dataset", p["rollouts_base"], "--keyframes", p["keyframes"], "--no-progress"]
    gated = len(stages)  # from here on, every stage follows RL
    stages.append(Stage("rl1", ["rl", "--policy", p["policy_base"], "--world-model", p["wm_base"], "--out", p["rl1"], *rl_inputs]))
    stages.append(Stage("eval_rl1", ["eval", "--policy", f"{p['rl1']}/policy", "--out", str(run / "eval_rl1"), *ev]))
    if lp.pace:
        stages.append(
            Stage(
                "rollouts_evo",
                ["collect", "--out", p["rollouts_evo"], "--policy", f"{p['rl1']}/policy", "--episodes-per-task", str(config.rl.refine.episodes_per_task), "--no-progress"],
            )
        )
        # RL stage 1 with rl.refine.every already refined the world model on its policy's real rollouts: go on from that one
        start = f"{p['rl1']}/world_model" if config.rl.refine.every > 0 else p["wm_base"]
        stages.append(
            Stage(
                "wm_evo",
                ["train-wm", "--dataset", p["rollouts_base"], p["rollouts_evo"], "--vae", p["vae"], "--init", start, "--out", p["wm_evo"]],
                [f"world_model.steps={config.rl.refine.steps}"],
            )
        )
        stages.append(Stage("rl2", ["rl", "--policy", f"{p['rl1']}/policy", "--world-model", p["wm_evo"], "--out", p["rl2"], *rl_inputs]))
        stages.append(Stage("eval_rl2", ["eval", "--policy", f"{p['rl2']}/policy", "--out", str(run / "eval_rl2"), *ev]))
    stages[gated:] = [replace(stage, gated=True) for stage in stages[gated:]]
    if inputs.base is not None:
        del stages[:gated]  # built in inputs.base
    return stages, paths


def judge_and_gate(config: Config, p: dict[str, str], world_model: str, judge: str, gate: str, train_judge: bool, suffix: str = "") -> list[Stage]:
    """The judge's training (when ``train_judge``) and the fidelity gate of ``world_model``, as stages named judge/gate + ``suffix``."""
    stages = []
    if train_judge:
        # where the gate holds the judge to the world model's replays, it learns them too: the world model's replays join the
        # real frames (one trained on real frames alone passed nearly every failed replay of five MT10 tasks:
        # docs/experiments/2026-12-04-fidelity-recipe.md); a gate that only reports (tiny presets) spares the replays. Replays
        # of base-policy episodes the world model never trained on read the gate no better (kappa 0.26 either way,
        # docs/experiments/2026-12-07-judge-on-unseen-replays.md): the replays are of its training episodes.
        datasets, replays = [p["demos"], p["rollouts_base"]], []
        if config.loop.gate_min_kappa is not None:
            replays = ["--world-model", world_model]
        stages.append(Stage(f"judge{suffix}", ["train-reward", "--dataset", *datasets, *replays, "--out", judge]))
    stages.append(Stage(f"gate{suffix}", ["gate", "--policy", p["policy_base"], "--world-model", world_model, "--judge", judge,
                                          "--dataset", p["rollouts_base"], "--out", gate]))  # fmt: skip
    return stages


def run_loop(
    config: Config,
    run: str | Path,
    inputs: Inputs,
    preset: str,
    overrides: list[str],
    verb: Callable[[list[str]], int] | None = None,
    stop_after: str | None = None,
) -> Path:
    """Run every unfinished stage, then write the report; returns the report's path.
    ``verb`` runs one CLI command (default: ``python -m worldloop ...`` in a child process);
    ``stop_after`` ends the loop after the named stage, with the report of what ran so far."""
    from worldloop.config import save_config
    from worldloop.report import write_report

    run = Path(run)
    run.mkdir(parents=True, exist_ok=True)
    save_config(config, run)
    stages, paths = plan(config, run, inputs)
    run_stages(config, run, stages, Path(paths["gate"]), preset, overrides, verb, stop_after)
    return write_report(run, paths, stage_seconds(run))


def run_stages(
    config: Config,
    run: Path,
    stages: list[Stage],
    gate: Path,
    preset: str,
    overrides: list[str],
    verb: Callable[[list[str]], int] | None = None,
    stop_after: str | None = None,
    label: str = "loop",
) -> None:
    """Run every stage of ``stages`` that has no marker in ``run``/stages yet, in order (a gated one with what the
    fidelity gate in ``gate`` says); ``label`` starts every line printed."""
    verb = verb or run_verb
    if stop_after is not None and stop_after not in [stage.name for stage in stages]:
        raise ValueError(f"--until {stop_after}: not a stage of this loop; its stages: {', '.join(stage.name for stage in stages)}")
    for index, stage in enumerate(stages):
        marker = run / STAGES_DIR / f"{stage.name}.json"
        if marker.is_file():
            print(f"{label}: {stage.name} already complete, skipped")
        else:
            said = gate_arguments(config, gate) if stage.gated else ([], [])
            if said is None:
                print(f"{label}: {stage.name} skipped: no task passed the fidelity gate ({gate}/gate.md)")
                atomic_write_json(marker, {"stage": stage.name, "skipped": "no task passed the fidelity gate", "seconds": 0.0})
                continue
            tasks, settings = said if stage.argv[0] == "rl" else ([], [])  # the gate speaks to the RL stages
            if stage.argv[0] == "rl" and config.loop.time_budget_min:
                settings = [*settings, f"rl.time_limit_min={rl_minutes(config, stages[index:], stage_seconds(run)):.2f}"]
            argv = [*stage.argv, *tasks, "--preset", preset, *overrides, *stage.overrides, *settings]
            print(f"{label}: stage {stage.name}: worldloop {' '.join(argv)}", flush=True)
            began = time.time()
            code = verb(argv)
            if code != 0:
                raise RunError(f"{label}: stage {stage.name} failed with exit code {code}; fix the cause and rerun to resume from it")
            atomic_write_json(marker, {"stage": stage.name, "argv": argv, "seconds": time.time() - began})
        if stop_after == stage.name:
            break


def gate_arguments(config: Config, gate: Path) -> tuple[list[str], list[str]] | None:
    """What the fidelity gate says to a stage after it: (RL's arguments, config overrides), or None when no task passed.
    Only RL stages take them: ``--gate``, so that RL trains on the tasks that passed with exactly the judge, episode rule
    and threshold(s) the gate certified on its held-out episodes. The evaluations after RL keep the base evaluation's
    tasks and initial states."""
    result = read_json(gate / "gate.json")
    if not result["passed"]:
        return None
    return ["--gate", str(gate)], []


def rl_minutes(config: Config, stages: list[Stage], seconds_so_far: dict[str, float]) -> float:
    """An RL stage's share of ``loop.time_budget_min``: the minutes the finished stages left, less one for each
    non-RL stage still to come, split evenly among the RL stages still to come (``stages`` starts at this one);
    at least half a minute, and no more than rl.time_limit_min when that is set."""
    left = 60 * config.loop.time_budget_min - sum(seconds_so_far.values())
    rl_stages = sum(stage.argv[0] == "rl" for stage in stages)
    minutes = max(0.5, (left - 60 * (len(stages) - rl_stages)) / 60 / rl_stages)
    if minutes == 0.5:
        print(f"loop: the time budget ({config.loop.time_budget_min:g} min) is spent: RL gets half a minute")
    return min(minutes, config.rl.time_limit_min) if config.rl.time_limit_min else minutes


def run_verb(argv: list[str], env: dict[str, str] | None = None) -> int:
    """``worldloop ARGV`` in a child process (with the variables ``env`` set in its environment, e.g. the GPU it may
    use); its exit code. The loop and its stage are one process tree:
    the stage runs in its own process group, SIGINT/SIGTERM to the loop are passed on to that group, and
    the stage dies with the loop however the loop dies (Linux: the kernel's parent-death signal)."""
    child = subprocess.Popen([sys.executable, "-m", "worldloop", *argv], preexec_fn=functools.partial(_stage_process_setup, os.getpid(), _prctl()),
                             env={**os.environ, **env} if env else None)  # fmt: skip
    forward = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    received: list[int] = []

    def pass_on(signum, frame):
        received.append(signum)
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    try:
        for sig in forward:
            signal.signal(sig, pass_on)
    except ValueError:  # not the main thread: the child still dies with this process
        forward = {}
    try:
        code = child.wait()
    finally:
        if child.poll() is None:  # the loop itself is failing: take the stage down with it
            os.killpg(child.pid, signal.SIGTERM)
            child.wait()
        for sig, handler in forward.items():
            signal.signal(sig, handler)
    if received:
        raise KeyboardInterrupt  # the stage has ended (it saves what it finished); so does the loop
    return code


def _prctl() -> Callable[..., int] | None:
    """libc's prctl on Linux (looked up before the fork: the child only calls it), else None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _stage_process_setup(loop_pid: int, prctl: Callable[..., int] | None) -> None:
    """In the stage's process, before it runs: a process group of its own, and (Linux) SIGTERM when
    the loop's process dies, even by SIGKILL. Elsewhere a killed loop's stage runs on to its end."""
    os.setpgid(0, 0)
    if prctl is not None:
        PR_SET_PDEATHSIG = 1
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != loop_pid:  # the loop died before the request took effect
            os._exit(1)


def stage_seconds(run: Path) -> dict[str, float]:
    return {p.stem: read_json(p)["seconds"] for p in sorted((run / STAGES_DIR).glob("*.json"))}

"""Evidence a skeptic accepts: declared arms x seeds of the closed loop on shared base artifacts (``worldloop experiment``).

    RUN/base/                  the loop's stages before RL, run once (demos .. keyframes, the fidelity gate, the base policy's eval)
    RUN/arms/<arm>/seed<k>/    one arm's stages from RL on (the loop's stage folders and markers), with the arm's config
                               overrides and config ``seed`` = the preset's seed + k (RL's sampling and updates, and the
                               sampling of the arm's evaluations and rollouts); the base artifacts stay the same across seeds
    RUN/experiment.json        what was declared: the arms with their overrides, the seeds, the real-episode budget
    RUN/verdicts.json          every evaluation's per-episode real verdicts (and, with --through-vae, through the VAE) and RL's
                               own first and last imagined-against-real checks: small, what `worldloop analyse` reads

Every evaluation runs the eval verb on the loop's eval episodes, which start from the same initial states (fixed by task
and episode number: :func:`worldloop.rl.evaluate.eval_seed`), so each arm's final policy is compared with the base
policy episode by episode. Each arm and seed resumes through its own stage markers, like the loop.

With several GPUs visible, the arm x seed runs go side by side, each on a GPU of its own (its stages see only that one,
through CUDA_VISIBLE_DEVICES); with one GPU or none, one after another unless ``--parallel`` says otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import queue
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from worldloop.config import Config, load_config, save_config
from worldloop.loop import Inputs, Stage, plan, run_loop, run_stages, run_verb
from worldloop.utils.io import atomic_write_json, read_json

BASE_DIR, ARMS_DIR = "base", "arms"
SEED_KEY = "seed"
"""The config key each seed sets (the stages' global seed)."""


@dataclass(frozen=True)
class Arm:
    overrides: tuple[str, ...]
    """Config overrides of the arm's stages (after the experiment's own)."""
    about: str
    """What the arm is, for --help and analysis.md."""
    env: str = "imagined"
    """Where RL's training episodes run: 'imagined' (the world model) or 'real' (the simulator, with as many real
    episodes as the full arm spends: :func:`real_episode_budget`)."""


ARMS = {
    "full": Arm((), "RL in WM Base, PACE (evolved-policy rollouts refine the world model), RL in WM Evo"),
    "no_pace": Arm(("loop.pace=false",), "without PACE: RL in WM Base only"),
    "no_kir": Arm(("rl.kir_ratio=0",), "without KIR: imagined episodes start from first frames only"),
    "no_mask": Arm(("rl.mask_after_success=false",), "without the post-success mask"),
    "shuffled": Arm(("rl.diagnostics.shuffled_scores=true",), "control: each group's scores shuffled among its rollouts"),
    "real_grpo": Arm(("loop.pace=false", "rl.refine.every=0"), "GRPO in the real simulator, on the full arm's real episodes", env="real"),
}
"""The arms an experiment can declare: the config keys they rely on are named here only."""

REAL_STAGE = "rl1"  # the stage the real_grpo arm runs in the simulator instead of the world model


def arms_help() -> str:
    return "\n".join(f"  {name}: {arm.about}" + (f" ({', '.join(arm.overrides)})" if arm.overrides else "") for name, arm in ARMS.items())


def real_episode_budget(config: Config, tasks: int, trained_tasks: int) -> int:
    """Real trajectories the full arm's policies consume (WoVR's table 2): the base policy's rollouts and, with PACE, the
    stage-1 policy's, on each of ``tasks`` tasks, plus RL's refinement rounds (rl.refine.every) on the ``trained_tasks``,
    in each RL stage. Evaluations, the gate's and the judge calibration's episodes measure and are not counted."""
    lp, rl = config.loop, config.rl
    per_task = lp.base_rollouts_per_task + (rl.refine.episodes_per_task if lp.pace else 0)
    rounds = (rl.iterations // rl.refine.every if rl.refine.every else 0) * (2 if lp.pace else 1)
    return per_task * tasks + rounds * rl.refine.episodes_per_task * trained_tasks


def arm_stages(arm: Arm, config: Config, run: Path, inputs: Inputs, vae_eval: bool) -> tuple[list[Stage], dict[str, str]]:
    """One arm's stages (the loop's, from RL on, over the base in ``inputs.base``) and their paths; the real arm trains
    its first RL stage in the simulator (with the world model and judge measuring the imagination-reality gap)."""
    stages, paths = plan(config, run, inputs)
    if arm.env == "real":
        stage = next(s for s in stages if s.name == REAL_STAGE)
        stage.argv = ["rl", "--env", "real", "--policy", paths["policy_base"], "--world-model", paths["wm_base"], "--judge", paths["judge"],
                      "--out", paths[REAL_STAGE], "--no-progress"]  # fmt: skip
    if vae_eval:
        final = final_policy(stages)
        stages.append(vae_eval_stage("eval_final_vae", final, paths["vae"], run, config, gated=True))
    return stages, paths


def final_policy(stages: list[Stage]) -> str:
    """The policy folder the arm's last evaluation reads (its final policy)."""
    last = final_eval(stages)
    argv = next(s.argv for s in stages if s.name == last)
    return argv[argv.index("--policy") + 1]


def final_eval(stages: list[Stage]) -> str:
    """The name of the arm's last real evaluation stage (the primary endpoint's)."""
    return [s.name for s in stages if s.argv[0] == "eval" and "--world-model" not in s.argv][-1]


def vae_eval_stage(name: str, policy: str, vae: str, run: Path, config: Config, gated: bool = False) -> Stage:
    """The secondary endpoint: ``policy`` evaluated on the loop's eval episodes, observing the simulator through ``vae``."""
    argv = ["eval", "--policy", policy, "--world-model", vae, "--out", str(run / name), "--episodes-per-task", str(config.loop.eval_episodes_per_task)]
    return Stage(name, argv, gated=gated)


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (else numbered from 0)."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [device.strip() for device in given.split(",") if device.strip() and device.strip() != "-1"]
    import torch

    return [str(index) for index in range(torch.cuda.device_count())]


def gpu_slots(parallel: int, gpus: list[str]) -> list[str | None]:
    """The GPU of each of ``parallel`` side-by-side runs: the ``gpus`` in turn (several runs share one when there are
    more runs than GPUs); None, and no placement, with fewer than 2 GPUs."""
    return [gpus[slot % len(gpus)] if len(gpus) > 1 else None for slot in range(parallel)]


def run_experiment(
    config: Config,
    run: str | Path,
    inputs: Inputs,
    preset: str,
    overrides: list[str],
    arms: list[str],
    seeds: int,
    verb: Callable[..., int] | None = None,
    parallel: int | None = None,
    through_vae: bool = False,
    gpus: list[str] | None = None,
) -> Path:
    """Run the base stages once, then every declared arm x seed (``parallel`` of them side by side; default: one per
    GPU when ``gpus`` holds several, else 1), then gather the per-episode verdicts into RUN/verdicts.json; returns its
    path. Finished stages are skipped on a rerun. ``gpus``: the GPUs to place the runs on, each run's stages seeing
    only its own (default: :func:`visible_gpus` when ``verb`` is the real one, none for a stand-in); a stand-in
    ``verb`` then takes ``env`` (the variables to set) as a keyword."""
    gpus = (visible_gpus() if verb is None else []) if gpus is None else gpus
    parallel = parallel if parallel is not None else len(gpus) if len(gpus) > 1 else 1
    unknown = [arm for arm in arms if arm not in ARMS]
    if unknown:
        raise ValueError(f"--arms: unknown arm(s) {', '.join(unknown)}; the arms: {', '.join(ARMS)}")
    if seeds < 1 or parallel < 1:
        raise ValueError(f"--seeds and --parallel must be >= 1, got {seeds} and {parallel}")
    if seeds < 4:
        print(f"experiment: WARNING {seeds} seed(s) per arm: the exact test of one arm against another over seeds cannot reach "
              f"p < 0.05 (its smallest p is 2 / C(2n, n) = {2 / math.comb(2 * seeds, seeds):.2g}); 4 seeds can (0.029)")  # fmt: skip
    from worldloop.sims.tasks import resolve_tasks

    run = Path(run)
    base = run / BASE_DIR
    run_loop(config, base, inputs, preset, overrides, verb=verb, stop_after="keyframes")
    base_paths = plan(config, base, inputs)[1]
    if through_vae:
        stage = vae_eval_stage("eval_base_vae", base_paths["policy_base"], base_paths["vae"], base, config)
        run_stages(config, base, [stage], Path(base_paths["gate"]), preset, overrides, verb, label="experiment base")

    tasks = resolve_tasks(config.sim)
    gate = read_json(Path(base_paths["gate"]) / "gate.json")
    trained = len(gate["passed"]) if config.loop.gate_min_kappa is not None else len(tasks)
    budget = real_episode_budget(config, len(tasks), trained)
    per_iteration = config.rl.num_groups * config.rl.group_size
    derived = {"real_grpo": (f"rl.iterations={max(1, math.ceil(budget / per_iteration))}",)}

    seed_values = [config.seed + k for k in range(seeds)]
    declared, jobs = {}, []
    for name in arms:
        arm = ARMS[name]
        arm_overrides = [*overrides, *arm.overrides, *derived.get(name, ())]
        for seed in seed_values:
            arm_run = run / ARMS_DIR / name / f"seed{seed}"
            every = [*arm_overrides, f"{SEED_KEY}={seed}"]
            arm_config = load_config(preset, every)
            stages, _ = arm_stages(arm, arm_config, arm_run, dataclasses.replace(inputs, base=str(base)), through_vae)
            jobs.append((f"experiment {name} seed {seed}", arm_config, arm_run, stages, every))
        declared[name] = {"about": arm.about, "overrides": [*arm.overrides, *derived.get(name, ())], "env": arm.env,
                          "final_eval": final_eval(stages), "rl_stages": [s.name for s in stages if s.argv[0] == "rl"]}  # fmt: skip
    atomic_write_json(run / "experiment.json", {
        "preset": preset, "overrides": overrides, "arms": declared, "seeds": seed_values, "seed_key": SEED_KEY,
        "through_vae": through_vae, "tasks": tasks, "trained_tasks": trained,
        "real_episode_budget": {"episodes": budget, "episodes_per_iteration": per_iteration},
    })  # fmt: skip

    slots: queue.Queue = queue.Queue()
    for gpu in gpu_slots(parallel, gpus):
        slots.put(gpu)

    def run_job(job) -> None:
        label, arm_config, arm_run, stages, every = job
        arm_run.mkdir(parents=True, exist_ok=True)
        save_config(arm_config, arm_run)
        gpu = slots.get()  # a run takes a free slot (its GPU) and gives it back when it ends
        try:
            job_verb = verb if gpu is None else functools.partial(verb or run_verb, env={"CUDA_VISIBLE_DEVICES": gpu})
            run_stages(arm_config, arm_run, stages, Path(base_paths["gate"]), preset, every, job_verb,
                       label=label if gpu is None else f"{label} (GPU {gpu})")  # fmt: skip
        finally:
            slots.put(gpu)

    failed = []
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for job, future in [(job, pool.submit(run_job, job)) for job in jobs]:
            try:
                future.result()
            except (RuntimeError, ValueError) as error:  # the other arms go on; a rerun resumes this one
                failed.append(f"{job[0]}: {error}")
    path = write_verdicts(run)
    if failed:
        raise RuntimeError("experiment: " + "; ".join(failed) + f" (the verdicts of what finished are in {path}; rerun to resume)")
    print(f"experiment: verdicts at {path}; `worldloop analyse {run}` writes the analysis")
    return path


def write_verdicts(run: Path) -> Path:
    path = run / "verdicts.json"
    atomic_write_json(path, gather_verdicts(run))
    return path


def gather_verdicts(run: Path) -> dict[str, Any]:
    """Every evaluation's per-episode verdicts ('0'/'1' per episode, per task), checked to share their initial states,
    with RL's first and last imagined-against-real checks, from an experiment's folders."""
    declared = read_json(run / "experiment.json")
    base_eval = read_json(run / BASE_DIR / "eval_base" / "results.json")
    seeds = base_eval["seeds"]

    def verdicts(folder: Path) -> dict[str, str] | None:
        file = folder / "results.json"
        if not file.is_file():
            return None
        result = read_json(file)
        if result.get("seeds") != seeds:
            raise ValueError(f"{file} did not start from the base evaluation's initial states ({run / BASE_DIR / 'eval_base'}): "
                             "every evaluation of an experiment must use the same tasks and episodes per task")  # fmt: skip
        return {task: row["per_episode"] for task, row in result["per_task"].items()}

    base = {"real": verdicts(run / BASE_DIR / "eval_base"), "through_vae": verdicts(run / BASE_DIR / "eval_base_vae")}
    arms = {}
    for name, arm in declared["arms"].items():
        arms[name] = {}
        for seed in declared["seeds"]:
            folder = run / ARMS_DIR / name / f"seed{seed}"
            real = verdicts(folder / arm["final_eval"])
            if real is None:
                continue  # not run (yet), or skipped by the gate
            arms[name][str(seed)] = {"real": real, "through_vae": verdicts(folder / "eval_final_vae"), "rl": rl_checks(folder, arm["rl_stages"])}
    return {
        "tasks": list(base["real"]), "episodes_per_task": base_eval["episodes_per_task"], "initial_state_seeds": seeds,
        "base": {key: value for key, value in base.items() if value is not None}, "arms": arms,
        "arm_about": {name: arm["about"] for name, arm in declared["arms"].items()},
    }  # fmt: skip


def rl_checks(folder: Path, stages: list[str]) -> dict[str, Any] | None:
    """RL's first reality check (of its first stage) and last one (of its last stage): real and imagined success on the
    same initial states (rl.checks.episodes_per_task per task)."""
    evaluations = []
    for stage in stages:
        for name in ("results.json", "evaluations.json"):
            if (folder / stage / name).is_file():
                evaluations += [(stage, e) for e in read_json(folder / stage / name)["evaluations"]]
                break
    if not evaluations:
        return None

    def check(stage: str, e: dict[str, Any]) -> dict[str, Any]:
        return {"stage": stage, "iteration": e["iteration"], "episodes": e["real"]["episodes"], "real": e["real"]["success_once"],
                "imagined": e["imagined"]["success_once"] if "imagined" in e else None}  # fmt: skip

    return {"first": check(*evaluations[0]), "last": check(*evaluations[-1])}

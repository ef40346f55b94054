"""Reality checks and the judge's calibration for RL: the same policy, the same initial states, real against imagined.

What ``worldloop rl`` (and any other command that measures a policy against imagination) builds its checks from:

- :func:`reality_check`: a :class:`~worldloop.rl.rollout.RealityCheck` on the eval verb's initial states, real and
  (with a world model and a judge) imagined, optionally through the world model's VAE (:func:`through_codec`);
- :func:`calibrate_threshold`: rl.judge_threshold=replay, the judge's threshold chosen on the policy's real episodes
  replayed in the world model; :func:`tracked_tasks`: rl.train_tasks=tracked, the tasks imagination tracks;
- :func:`imagined_env`, :func:`load_rl_judge`, :func:`instruction_of`: the imagined environment and judge they use.
"""

from __future__ import annotations

import time

import torch

from worldloop.config import Config, ConfigError
from worldloop.envs.codec import CodecObservations
from worldloop.envs.imagined import ImaginedEnv, InitialStates, initial_states_from_dataset, initial_states_from_keyframes
from worldloop.rewards import load_judge
from worldloop.rewards.calibrate import plot_kappa_by_threshold
from worldloop.rewards.configuration import CalibrateConfig
from worldloop.rl.evaluate import eval_seed
from worldloop.rl.rollout import LabelledEpisodes, RealityCheck, apply_calibration
from worldloop.sims import make_env
from worldloop.sims.tasks import INSTRUCTIONS
from worldloop.utils.io import atomic_write_json, read_json
from worldloop.utils.stats import format_kappa, kappa_above_chance


def reality_check(config: Config, tasks: list[str], world_model, judge, dataset, device, closers: list, first_episode: int = 0,
                  shared=None, keyframes: str | None = None, **videos):  # fmt: skip
    """rl's reality check: rl.eval_episodes_per_task real episodes per task of ``tasks`` from the eval verb's
    initial states (episode numbers from ``first_episode`` on) and, with a world model and judge, the same in
    imagination, and with ``keyframes`` (a KIR folder) in imagination from those keyframes too. Its environments
    are ``shared``'s (a check on the same tasks) or new ones, added to ``closers``."""
    per_task = config.rl.eval_episodes_per_task
    count = len(tasks) * per_task
    if shared is not None and shared.task_of_episode == [task for task in tasks for _ in range(per_task)]:
        real_env, gap_env = shared.real_env, shared.imagined_env
    else:
        real_env = through_codec(make_env(config, count, tasks=tasks), world_model, config)
        closers.append(real_env)
        gap_env = None
        if world_model is not None and judge is not None:
            horizon = -(-config.sim.max_steps // world_model.chunk_size) * world_model.chunk_size
            gap_env = imagined_env(config, world_model, judge, dataset, None, count, 1, horizon, device, kir_ratio=0.0)
    keyframe_env = None
    if keyframes and gap_env is not None:
        keyframe_env = imagined_env(config, world_model, judge, dataset, keyframes, count, 1, gap_env.max_steps, device, kir_ratio=1.0)
    seeds = [eval_seed(task, first_episode + e, config.eval.seed_offset) for task in tasks for e in range(per_task)]
    return RealityCheck(real_env, tasks, per_task, gap_env, seeds, config.eval.temperature, config.eval.greedy, keyframe_env=keyframe_env,
                        imagined_actions_in_reality=config.rl.diagnostics.imagined_actions_in_reality,
                        imagination_repeat=config.rl.diagnostics.imagination_repeat, **videos)  # fmt: skip


def through_codec(env, world_model, config: Config):
    """``env`` as the policy sees it: with rl.diagnostics.reality_through_codec, its frames through ``world_model``'s VAE."""
    if not config.rl.diagnostics.reality_through_codec:
        return env
    if world_model.image_size != config.sim.image_size:  # its VAE would still run, on frames it never learned
        env.close()
        raise ConfigError(f"rl.diagnostics.reality_through_codec: the world model works at {world_model.image_size}x{world_model.image_size}, the simulator "
                          f"renders {config.sim.image_size}x{config.sim.image_size} (sim.image_size)")  # fmt: skip

    return CodecObservations(env, world_model.vae)


def load_rl_judge(spec: str, device, config: Config):
    """The judge of ``spec``, deciding success at rl.judge_threshold when that is set."""
    judge = load_judge(spec, device, config.reward)
    if isinstance(config.rl.judge_threshold, float):
        print(f"judge {spec}: threshold {config.rl.judge_threshold} (rl.judge_threshold) in place of its own {judge.threshold:.3f}")
        judge.threshold = config.rl.judge_threshold
    return judge


def calibrate_threshold(calibration, policy, judge, rl, path, calibrate=None) -> dict:
    """rl.judge_threshold=replay: the judge's threshold from ``policy``'s real episodes replayed in the
    world model (RealityCheck.calibrate_judge), saved to ``path``, and the episodes beside it (PATH's stem +
    _episodes.pt, for rl.refine_every's recalibrations); a resumed run reads both back instead. Returns the
    calibration (what ``path`` holds). ``calibrate`` (reward.calibrate, default its defaults) sets the standard-error rules."""
    calibrate = calibrate or CalibrateConfig()

    episodes = path.with_name(f"{path.stem}_episodes.pt")
    if path.is_file():
        result = read_json(path)
        apply_calibration(judge, result)
        print(f"judge threshold {judge.threshold:.3f}{own_thresholds(result)}, calibrated before training ({path})")
        if calibration is not None and episodes.is_file():
            calibration.labelled = LabelledEpisodes.load(episodes)
        return result
    began = time.perf_counter()
    result = calibration.calibrate_judge(policy, calibrate.threshold_tolerance_se, calibrate.threshold_significance_se,
                                         rl.diagnostics.threshold_per_task)  # fmt: skip
    result["seconds"] = time.perf_counter() - began  # its cost: one real evaluation and one replay
    calibration.labelled.save(episodes)
    atomic_write_json(path, result)
    replays = result["per_episode"]
    plot_kappa_by_threshold(replays["score"], [c == "1" for c in replays["real"]], replays["task"],
                            {"before": result["previous"], "chosen": result["threshold"]}, path.with_suffix(".png"),
                            "the base policy's real episodes replayed in the world model", task_marks=result["task_thresholds"])  # fmt: skip

    def kappa(verdicts: dict) -> str:
        return "undefined" if verdicts["kappa"] is None else format_kappa(verdicts["kappa"], verdicts["kappa_stderr"])

    before, after = result["replayed_before"], result["replayed_after"]
    if result["calibrated"]:
        print(f"judge threshold {result['previous']:.3f} -> {result['threshold']:.3f}, chosen on the base policy's real episodes replayed "
              f"in the world model (n={result['real']['episodes']}, real success {result['real']['success_once']:.3f}): judged "
              f"{before['success_once']:.3f} -> {after['success_once']:.3f}, kappa {kappa(before)} -> {kappa(after)}{own_thresholds(result)}, "
              f"in {result['seconds']:.0f} s ({path})")  # fmt: skip
    else:
        print(f"judge threshold {result['previous']:.3f} kept: {result['kept_because']} on the base policy's {result['real']['episodes']} "
              f"real episodes replayed in the world model (real success {result['real']['success_once']:.3f}; judged "
              f"{before['success_once']:.3f}, kappa {kappa(before)}), in {result['seconds']:.0f} s ({path})")  # fmt: skip
    if after["kappa"] is None or after["kappa"] < 2 * after["kappa_stderr"]:
        # the thirteenth H200 session with rl.success_chunks=2: kappa 0.06 ± 0.07; the sixteenth's: <= 0 at every threshold
        print(f"rl: WARNING at the judge's threshold the replays' verdicts agree with the simulator's no better than chance "
              f"(kappa {kappa(after)}): this judge cannot tell the starting policy's successes from its failures in "
              "this world model, so RL's reward will be noise. Check the replays (`calibrate-reward --world-model` on the "
              "policy's rollouts), a lower rl.success_chunks, or other tasks")  # fmt: skip
    return result


def own_thresholds(calibration: dict) -> str:
    """'; per task: door-open-v3 0.912, ...' for rl.diagnostics.threshold_per_task's calibration, '' otherwise."""
    own = calibration.get("task_thresholds") or {}
    listed = ", ".join(f"{task} {'as for all' if threshold is None else f'{threshold:.3f}'}" for task, threshold in own.items())
    return f"; per task: {listed}" if listed else ""


def tracked_tasks(calibration: dict, candidates: list[str], significance_se: float) -> list[str]:
    """rl.train_tasks=tracked: the ``candidates`` whose replays in ``calibration`` (calibrate_threshold's) agree with
    the simulator within the task more than ``significance_se`` standard errors beyond chance at its threshold."""
    per_task = calibration["replayed_after"]["per_task_kappa"]

    def tracked(task: str) -> bool:
        return task in per_task and kappa_above_chance(per_task[task]["kappa"], per_task[task]["kappa_stderr"], significance_se)

    def described(task: str) -> str:
        if task not in per_task:
            return f"{task} not calibrated (not in rl.eval_tasks)"
        kappa = per_task[task]["kappa"]
        return f"{task} " + ("undefined" if kappa is None else format_kappa(kappa, per_task[task]["kappa_stderr"]))

    chosen = [task for task in candidates if tracked(task)]
    kappas = ", ".join(described(task) for task in candidates)
    if not chosen:
        raise ConfigError(f"rl.train_tasks=tracked: no task's replays agree with the simulator more than {significance_se:g} SE beyond chance "
                          f"(kappa within each task: {kappas}), so RL's reward would be noise on all of them; try other tasks, "
                          "a better world model or judge, or rl.train_tasks=all")  # fmt: skip
    print(f"rl: training on {', '.join(chosen)} of {', '.join(candidates)}, the tasks whose replays the judge tracks (kappa: {kappas})")
    return chosen


def imagined_env(config: Config, world_model, judge, dataset, keyframes: str | None, num_envs: int, group_size: int, max_steps: int, device, kir_ratio: float | None = None):
    """The imagined environment over the dataset's first frames (+ keyframes); without either it can only ``reset_to``."""
    if world_model is None or judge is None:
        raise ConfigError("the imagined environment needs --world-model and --judge")
    pools = [InitialStates.from_first_frames(torch.zeros(0, world_model.image_size, world_model.image_size, 3, dtype=torch.uint8), [])]
    if dataset is not None:
        if dataset.image_size != world_model.image_size:
            raise ConfigError(f"--dataset has {dataset.image_size}x{dataset.image_size} frames but the world model renders {world_model.image_size}x{world_model.image_size}")
        pools.append(initial_states_from_dataset(dataset))
    if keyframes:
        pools.append(initial_states_from_keyframes(keyframes))
    ratio = config.rl.kir_ratio if kir_ratio is None else kir_ratio
    return ImaginedEnv(world_model, judge, InitialStates.concat(*pools), num_envs, group_size, max_steps, config.sim.reward_scale, ratio, device,
                       success_chunks=config.rl.success_chunks)  # fmt: skip


def instruction_of(task: str) -> str:

    if task not in INSTRUCTIONS:
        raise ConfigError(f"--tasks: unknown simulator task '{task}'")
    return INSTRUCTIONS[task]

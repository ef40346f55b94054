"""Reality checks and the judge's calibration for RL: the same policy, the same initial states, real against imagined.

What ``worldloop rl`` (and any other command that measures a policy against imagination) builds its checks from:

- :class:`RealityCheck`: one policy run in the simulator and in imagination from the same initial states;
- :func:`reality_check`: a :class:`RealityCheck` on the eval verb's initial states, real and
  (with a world model and a judge) imagined, optionally through the world model's VAE (:func:`through_codec`);
- :func:`calibrate_threshold`: rl.judge_threshold=replay, the judge's threshold chosen on the policy's real episodes
  replayed in the world model; :func:`tracked_tasks`: rl.train_tasks=tracked, the tasks imagination tracks;
- the imagined environment and the judge they use come from :mod:`worldloop.rl.envs`, as RL's own do.

Under torchrun the checks and the calibration are data-parallel like the training: every rank runs its share of the
episodes (dealt in turn, :func:`worldloop.utils.distributed.dealt`), the per-episode records are gathered in their
one-process order, and every rank summarises and calibrates on all of them; rank 0 alone writes files and prints.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from worldloop.config import Config, ConfigError
from worldloop.diagnostics.tracking import (
    LabelledEpisodes,
    Replay,
    episode_frames,
    episode_tracking,
    replay,
    replay_in_reality,
    summarize,
    tracking_rows,
)
from worldloop.envs.codec import CodecObservations
from worldloop.envs.judging import JudgedEnv, streak_score
from worldloop.envs.protocol import VecEnv
from worldloop.rewards.calibrate import plot_kappa_by_threshold
from worldloop.rewards.configuration import CalibrateConfig
from worldloop.rl.envs import imagined_env, through_codec
from worldloop.rl.evaluate import eval_seed
from worldloop.rl.rollout import Rollout, apply_calibration, autocast, collect, policy_device
from worldloop.rl.summary import paired_changes
from worldloop.sims import make_env
from worldloop.sims.tasks import check_task
from worldloop.utils import distributed
from worldloop.utils.io import atomic_write_json, read_json
from worldloop.utils.stats import agreement_beyond_chance, format_kappa, kappa_above_chance


def reality_check(config: Config, tasks: list[str], world_model, judge, dataset, device, closers: list, first_episode: int = 0,
                  shared=None, keyframes: str | None = None, video_dir: str | Path | None = None):  # fmt: skip
    """rl's reality check: rl.checks.episodes_per_task real episodes per task of ``tasks`` from the eval verb's
    initial states (episode numbers from ``first_episode`` on) and, with a world model and judge, the same in
    imagination, and with ``keyframes`` (a KIR folder) in imagination from those keyframes too. Its environments
    are ``shared``'s (a check on the same tasks) or new ones, added to ``closers``. It samples as the eval verb does
    and writes eval.videos_per_task videos per task into ``video_dir`` when that is given. Under torchrun the
    environments hold this rank's share of the episodes (:class:`RealityCheck`)."""
    per_task = config.rl.checks.episodes_per_task
    count = len(tasks) * per_task
    if shared is not None and shared.task_of_episode == [task for task in tasks for _ in range(per_task)]:
        real_env, gap_env = shared.real_env, shared.imagined_env
    else:
        count = len(distributed.dealt(count))  # this process's episodes
        if count == 0:
            raise ConfigError(f"rl.checks.episodes_per_task={per_task} on {len(tasks)} tasks: {len(tasks) * per_task} episodes cannot be dealt over "
                              f"{distributed.world_size()} processes; run at least one per process")  # fmt: skip
        real_env = through_codec(make_env(config, count, tasks=tasks), world_model, config)
        closers.append(real_env)
        gap_env = None
        if world_model is not None and judge is not None:
            horizon = -(-real_env.max_steps // world_model.chunk_size) * world_model.chunk_size
            gap_env = imagined_env(config, world_model, judge, dataset, None, count, 1, horizon, device, kir_ratio=0.0)
    keyframe_env = None
    if keyframes and gap_env is not None:
        keyframe_env = imagined_env(config, world_model, judge, dataset, keyframes, real_env.num_envs, 1, gap_env.max_steps, device, kir_ratio=1.0)
    seeds = [eval_seed(task, first_episode + e) for task in tasks for e in range(per_task)]
    return RealityCheck(real_env, tasks, per_task, gap_env, seeds, keyframe_env, CheckOptions.from_config(config, video_dir))


def rl_checks(config: Config, policy, world_model, judge, dataset, device, closers: list, train_tasks: list[str], out: Path,
              keyframes: str | None = None):  # fmt: skip
    """rl's reality check (None with rl.checks.episodes_per_task 0) on rl.checks.tasks (default: the training tasks),
    and with rl.judge_threshold=replay first the judge's calibration on other initial states of the same tasks
    (OUT/judge_calibration.json), which with rl.train_tasks=tracked also narrows the training tasks. Returns
    (check, calibration or None, the simulator tasks to train on).

    Under torchrun every rank calls it and runs its share of both checks' episodes (:class:`RealityCheck`); all of
    them choose the same thresholds and keep the same tasks from all the episodes, and rank 0 alone writes."""
    rl = config.rl
    if rl.checks.episodes_per_task == 0:
        return None, None, train_tasks
    try:  # the simulator's own tasks (a preset's rl.checks.tasks may name another simulator's)
        eval_tasks, calibration = [check_task(task, config.sim.backend) for task in rl.checks.tasks] or list(train_tasks), None
    except ValueError as error:
        raise ConfigError(f"rl.checks.tasks: {error}") from None
    if rl.judge_threshold == "replay":  # on initial states apart from the evaluations', which stay out of sample
        calibration = reality_check(config, eval_tasks, world_model, judge, dataset, device, closers, first_episode=rl.checks.episodes_per_task)
        calibrated = calibrate_threshold(calibration, policy, judge, rl, out / "judge_calibration.json", config.reward.calibrate)
        if rl.train_tasks == "tracked":
            train_tasks = tracked_tasks(calibrated, train_tasks, config.reward.calibrate.threshold_significance_se)
            eval_tasks = list(rl.checks.tasks) or list(train_tasks)
    check = reality_check(config, eval_tasks, world_model, judge, dataset, device, closers, shared=calibration, keyframes=keyframes,
                          video_dir=out / "videos")  # fmt: skip
    if calibration is not None and check.real_env is not calibration.real_env:
        closers.remove(calibration.real_env)  # its episodes are taken; a refined model's recalibration only replays them
        calibration.real_env.close()
    return check, calibration, train_tasks


def check_diagnostics(rl, world_model: bool, judge: bool) -> None:
    """A clear error, before anything loads, for an rl.diagnostics switch (or rl.judge_threshold=replay) without what it measures with."""
    checks = world_model and judge and rl.checks.episodes_per_task > 0
    needs = f"--world-model, --judge and rl.checks.episodes_per_task > 0 (got {rl.checks.episodes_per_task})"
    for on, does in ((rl.diagnostics.imagined_actions_in_reality, "rl.diagnostics.imagined_actions_in_reality=true replays the imagined episodes' actions in the simulator"),
                     (rl.judge_threshold == "replay", "rl.judge_threshold=replay replays real episodes in the world model")):  # fmt: skip
        if on and not checks:
            raise ConfigError(f"{does}: it needs {needs}")
    if rl.diagnostics.reality_through_codec and not world_model:
        raise ConfigError("rl.diagnostics.reality_through_codec=true shows the policy the simulator through the world model's VAE: it needs --world-model")


def calibrate_threshold(calibration, policy, judge, rl, path, calibrate=None) -> dict:
    """rl.judge_threshold=replay: the judge's threshold from ``policy``'s real episodes replayed in the
    world model (RealityCheck.calibrate_judge), saved to ``path``, and the episodes beside it (PATH's stem +
    _episodes.pt, for rl.refine.every's recalibrations); a resumed run reads both back instead. Returns the
    calibration (what ``path`` holds). ``calibrate`` (reward.calibrate, default its defaults) sets the standard-error rules.
    Under torchrun every rank calibrates its judge alike (on all the episodes, each rank running its own) and
    rank 0 alone writes and prints; the saved episodes are all of them, as one process saves them."""
    calibrate = calibrate or CalibrateConfig()
    say = print if distributed.is_main() else lambda *args: None

    episodes = path.with_name(f"{path.stem}_episodes.pt")
    if path.is_file():
        result = read_json(path)
        apply_calibration(judge, result)
        say(f"judge threshold {judge.threshold:.3f}{own_thresholds(result)}, calibrated before training ({path})")
        if calibration is not None and episodes.is_file():
            calibration.label(LabelledEpisodes.load(episodes))
        return result
    began = time.perf_counter()
    result = calibration.calibrate_judge(policy, calibrate.threshold_tolerance_se, calibrate.threshold_significance_se,
                                         calibrate.threshold_per_task)  # fmt: skip
    result["seconds"] = time.perf_counter() - began  # its cost: one real evaluation and one replay
    labelled = calibration.all_labelled()
    if not distributed.is_main():
        return result
    labelled.save(episodes)
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
        # the 2026-12-02 replay-calibrated-judge run with rl.success_chunks=2: kappa 0.06 ± 0.07; the 2026-12-02 judge-never-says-success run's: <= 0 at every threshold
        print(f"rl: WARNING at the judge's threshold the replays' verdicts agree with the simulator's no better than chance "
              f"(kappa {kappa(after)}): this judge cannot tell the starting policy's successes from its failures in "
              "this world model, so RL's reward will be noise. Check the replays (`calibrate-reward --world-model` on the "
              "policy's rollouts), a lower rl.success_chunks, or other tasks")  # fmt: skip
    return result


def own_thresholds(calibration: dict) -> str:
    """'; per task: door-open-v3 0.912, ...' for reward.calibrate.threshold_per_task's calibration, '' otherwise."""
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
            return f"{task} not calibrated (not in rl.checks.tasks)"
        kappa = per_task[task]["kappa"]
        return f"{task} " + ("undefined" if kappa is None else format_kappa(kappa, per_task[task]["kappa_stderr"]))

    chosen = [task for task in candidates if tracked(task)]
    kappas = ", ".join(described(task) for task in candidates)
    if not chosen:
        raise ConfigError(f"rl.train_tasks=tracked: no task's replays agree with the simulator more than {significance_se:g} SE beyond chance "
                          f"(kappa within each task: {kappas}), so RL's reward would be noise on all of them; try other tasks, "
                          "a better world model or judge, or rl.train_tasks=all")  # fmt: skip
    if distributed.is_main():
        print(f"rl: training on {', '.join(chosen)} of {', '.join(candidates)}, the tasks whose replays the judge tracks (kappa: {kappas})")
    return chosen


@dataclass(frozen=True)
class CheckOptions:
    """How a :class:`RealityCheck` runs the policy, what it writes and what it measures beyond real against imagined."""

    temperature: float = 1.0
    """The policy's sampling temperature (ignored when greedy), as the eval verb samples by default."""
    greedy: bool = False
    """Take the most likely action token (eval.greedy)."""
    video_dir: Path | None = None
    """Where real | replay | imagined videos go (None: no videos)."""
    videos_per_task: int = 0
    """Episodes per task written as videos (the first ones)."""
    imagined_actions_in_reality: bool = False
    """rl.diagnostics.imagined_actions_in_reality: the imagined episodes' actions, open loop in the simulator."""

    @classmethod
    def from_config(cls, config: Config, video_dir: str | Path | None = None) -> CheckOptions:
        """As the eval verb samples (eval.*) and rl.diagnostics asks; videos (eval.videos_per_task) when ``video_dir`` is given."""
        d = config.rl.diagnostics
        return cls(1.0, config.eval.greedy, None if video_dir is None else Path(video_dir),
                   config.eval.videos_per_task if video_dir is not None else 0, d.imagined_actions_in_reality)  # fmt: skip


class RealityCheck:
    """Evaluate a policy in the real simulator and, from the very same initial observations, in the
    imagined environment: real success, imagined success and their gap, side by side, and whether the
    imagined verdict of each episode tracks its real one (agreement against chance, Cohen's kappa).

    Where the gap comes from (``gap_sources``), each against the simulator's verdicts: ``judged_real``,
    the imagined environment's judge on the real episodes' own frames (the judge alone); ``replayed``,
    the imagined environment driven open loop by the real episodes' action chunks (the world model and
    the judge); the closed-loop ``imagined`` run adds the policy reacting to imagined frames.
    ``per_episode`` keeps every verdict (real, imagined and each source) as a string of 0/1, one per episode.

    ``keyframe_env`` (optional, as many environments, a pool with KIR keyframes, ``kir_ratio`` 1): the imagined
    environment also runs from a keyframe of each episode's task, drawn with the episode's seed, so the same
    keyframes and world-model noise at every evaluation (``imagined_keyframes``): the starts RL trains from
    besides first frames, where the world model has less to imagine. A task without keyframes starts from a
    dataset first frame there (``keyframe_starts`` says how many did not).

    ``real_env`` has one environment per evaluation episode (tasks x episodes_per_task, task-major);
    ``seeds`` (default: 10**6 + 1000 * task position + episode) are the same at every evaluation,
    so every evaluation sees the same initial states. ``imagined_env`` (optional) must have as many
    environments and accept ``reset_to``. ``options`` (:class:`CheckOptions`) say how the policy samples, which
    videos are written and what else is measured: with both environments and ``options.video_dir``, the first
    ``options.videos_per_task`` episodes of each task are written as real | replay | imagined mp4s, one frame per chunk.

    ``options.imagined_actions_in_reality``: the simulator is also driven open loop, from the same initial states, by the
    closed-loop imagined episodes' action chunks (as far as each imagined episode ran): the simulator's verdict on
    what the policy did in imagination, against the imagined verdicts (``imagined_actions_in_reality``). Where
    imagination fails a task the simulator too fails with those actions, the policy acted worse on the imagined
    frames; where the simulator succeeds with them, the world model or the judge rendered them wrongly. Its
    ``versus_closed_loop``: those actions' success against the policy's own in reality, paired per episode.

    Under torchrun every rank runs its share of the episodes, dealt in turn (:func:`worldloop.utils.distributed.dealt`:
    rank r of W runs episodes r, r + W, ...; ``mine``), so its environments have that many envs; each episode keeps
    its seed and its world-model noise (seeded by its number among all episodes), and the per-episode verdicts and
    measures come back together in the one-process order (:func:`~worldloop.utils.distributed.gather_dealt`). Every
    rank then summarises all the episodes, and a threshold calibration chooses on all of them, as one process would:
    with a greedy policy (eval.greedy) the same results, episode by episode (up to the rounding of arithmetic in
    batches of another size); sampling, each rank draws from its own random stream. The videos are rank 0's: of its own episodes, the first ``videos_per_task`` of each task, named by
    the episode's number within its task (one process: 00, 01, ...; two: 00, 02, ...)."""

    def __init__(
        self,
        real_env: VecEnv,
        tasks: Sequence[str],
        episodes_per_task: int,
        imagined_env: Any | None = None,
        seeds: Sequence[int] | None = None,
        keyframe_env: Any | None = None,
        options: CheckOptions = CheckOptions(),
    ):
        count = len(tasks) * episodes_per_task
        self.mine = list(distributed.dealt(count))  # this process's episodes (all of them in one process)
        here = len(self.mine)
        on = f" (this process's share of {count} on {distributed.world_size()} processes)" if distributed.active() else ""
        if real_env.num_envs != here:
            raise ValueError(f"the real evaluation env has {real_env.num_envs} envs; {len(tasks)} tasks x {episodes_per_task} episodes need {here}{on}")
        if imagined_env is not None and imagined_env.num_envs != here:
            raise ValueError(f"the imagined evaluation env has {imagined_env.num_envs} envs; expected {here}{on}")
        if imagined_env is not None and int(imagined_env.image_size) != int(real_env.image_size):
            # found now, not after a whole real evaluation: the imagined run starts from the real frames, and its judge reads them
            raise ValueError(f"the real evaluation env renders {real_env.image_size}x{real_env.image_size} frames but the imagined one "
                             f"{imagined_env.image_size}x{imagined_env.image_size}: evaluate at the world model's resolution (sim.image_size)")
        if options.imagined_actions_in_reality and imagined_env is None:
            raise ValueError("imagined_actions_in_reality replays the imagined episodes' actions: it needs the imagined environment")
        if keyframe_env is not None and (imagined_env is None or keyframe_env.num_envs != here):
            raise ValueError(f"the keyframe evaluation needs the imagined one beside it and {here} envs{on}")
        self.real_env, self.imagined_env, self.keyframe_env = real_env, imagined_env, keyframe_env
        self.task_of_episode = [task for task in tasks for _ in range(episodes_per_task)]
        default = [10**6 + 1000 * t + e for t in range(len(tasks)) for e in range(episodes_per_task)]
        self.seeds = list(seeds) if seeds is not None else default
        if len(self.seeds) != count:
            raise ValueError(f"RealityCheck got {len(self.seeds)} seeds for {count} episodes")
        self.options = options
        self.labelled: LabelledEpisodes | None = None  # calibrate_judge's real episodes (this process's: those of ``mine``)
        self.through_codec = isinstance(real_env, CodecObservations)  # the policy sees reality through the world model's VAE

    def _tokens_on_reconstructed(self, policy: Any) -> Callable[[torch.Tensor, list[str]], torch.Tensor] | None:
        """The policy's tokens on frames encoded and decoded by the imagined env's world-model VAE (None without one)."""
        vae = getattr(getattr(self.imagined_env, "world_model", None), "vae", None)
        if vae is None or self.through_codec:  # through the codec already: its tokens are the real ones
            return None
        from worldloop.worldmodel.vae import reconstruct

        def tokens(frames: torch.Tensor, instructions: list[str]) -> torch.Tensor:
            device = policy_device(policy)
            with autocast(device):
                return policy.act(reconstruct(vae, frames).to(device), instructions, temperature=self.options.temperature, greedy=self.options.greedy).tokens

        return tokens

    def __call__(self, policy: Any, tag: str = "eval") -> dict[str, Any]:
        """Real and imagined success of ``policy``; ``tag`` names this evaluation's videos. Under torchrun every rank
        calls it: each runs its episodes, and all get the summary of all."""
        verdicts, tracking = self._run(policy, tag)
        verdicts = {name: distributed.gather_dealt(mine) for name, mine in verdicts.items()}
        return self._summary({name: torch.tensor(every) for name, every in verdicts.items()}, distributed.gather_dealt(tracking))

    def _run(self, policy: Any, tag: str) -> tuple[dict[str, list[bool]], list[dict[str, Any]]]:
        """This process's episodes: per source (real, imagined, ...), each episode's verdict; and each episode's
        trajectory tracking (:func:`worldloop.rl.rollout.episode_tracking`)."""
        tasks, seeds = [self.task_of_episode[i] for i in self.mine], [self.seeds[i] for i in self.mine]
        judge = getattr(self.imagined_env, "judge", None)
        real_env = self.real_env if judge is None else JudgedEnv(self.real_env, judge, getattr(self.imagined_env, "success_chunks", 1))
        first = real_env.reset(tasks, seeds)
        real = collect(policy, real_env, first, self.options.temperature, self.options.greedy)
        verdicts, tracking = {"real": real.success_once}, []
        if self.imagined_env is not None:
            start = self.imagined_env.reset_to(first.frames, list(first.instructions), noise_seeds=self.mine)  # noise by the episode's number among all
            imagined = collect(policy, self.imagined_env, start, self.options.temperature, self.options.greedy)
            tracking = episode_tracking(real, imagined, self._tokens_on_reconstructed(policy))
            replayed = replay(self.imagined_env, first, real, noise_seeds=self.mine)
            verdicts["imagined"] = imagined.success_once
            if judge is not None:
                verdicts["judged_real"] = real_env.success_once
            verdicts["replayed"] = replayed.success
            if self.options.imagined_actions_in_reality:
                self.real_env.reset(tasks, seeds)
                verdicts["imagined_actions_in_reality"] = replay_in_reality(self.real_env, imagined)
            if self.keyframe_env is not None:
                start = self.keyframe_env.reset(list(first.instructions), seeds)
                verdicts["imagined_keyframes"] = collect(policy, self.keyframe_env, start, self.options.temperature, self.options.greedy).success_once
                verdicts["keyframe_start"] = self.keyframe_env.started_from_keyframe
            if self.options.video_dir is not None and self.options.videos_per_task > 0 and distributed.is_main():
                self._write_videos(real, replayed, imagined, tag)
        return {name: outcome.bool().tolist() for name, outcome in verdicts.items()}, tracking

    def _summary(self, verdicts: dict[str, torch.Tensor], tracking: list[dict[str, Any]]) -> dict[str, Any]:
        """The check's result from every episode's ``verdicts`` (per source, (N,) bool, in the check's episode order)
        and trajectory ``tracking``."""
        tasks = self.task_of_episode
        real = verdicts["real"]
        result = {"real": summarize(real, tasks), "real_through_codec": self.through_codec}
        if "imagined" not in verdicts:
            return result
        result["imagined"] = summarize(verdicts["imagined"], tasks)
        # per episode, beyond what each task's success rate alone explains (kappa 0: RL's reward is noise)
        result |= self._versus_real(real, verdicts["imagined"])
        result["tracking"] = tracking_rows(tracking, tasks)
        sources = [name for name in ("judged_real", "replayed") if name in verdicts]
        result["gap_sources"] = {name: summarize(verdicts[name], tasks) | self._versus_real(real, verdicts[name]) for name in sources}
        if "imagined_actions_in_reality" in verdicts:
            # against the imagined verdicts: did what imagination called success (or failure) come true?
            acted = verdicts["imagined_actions_in_reality"]
            result["imagined_actions_in_reality"] = summarize(acted, tasks) | self._versus_real(verdicts["imagined"], acted)
        if "imagined_keyframes" in verdicts:
            share = verdicts["keyframe_start"].float().mean().item()
            result["imagined_keyframes"] = summarize(verdicts["imagined_keyframes"], tasks) | {"keyframe_starts": share}
        # every verdict, one character per episode (in the check's episode order), for paired comparisons later
        kept = ("real", "imagined", *sources, "imagined_actions_in_reality", "imagined_keyframes")
        result["per_episode"] = {name: "".join("1" if v else "0" for v in verdicts[name].tolist()) for name in kept if name in verdicts}
        if "imagined_actions_in_reality" in verdicts:  # did the actions chosen on imagined frames do better than those chosen on real ones?
            result["imagined_actions_in_reality"]["versus_closed_loop"] = paired_changes(result, result, "real", "imagined_actions_in_reality")
        return result

    def calibrate_judge(self, policy: Any, tolerance_se: float = 1.0, significance_se: float = 2.0,
                        per_task: bool = False) -> dict[str, Any]:  # fmt: skip
        """Set the imagined environment's judge threshold on ``policy``'s own real episodes (this
        check's initial states), replayed open loop in the world model with their own action chunks:
        per episode, the highest threshold at which the judge would have called it a success over the
        chunks the real episode ran (``success_chunks`` consecutive verdicts, as in the imagined env),
        and the threshold whose verdicts agree with the simulator's beyond chance (kappa within tasks),
        the highest within ``tolerance_se`` standard errors of the best, among those more than
        ``significance_se`` standard errors above 0. These are the frames RL's judge reads, from the
        successes and failures of the policy RL starts from; the held-out episodes train-reward chose its
        threshold on are mostly the expert's. The threshold stays where the episodes all succeed or all
        fail (no kappa) or no threshold agrees beyond chance (``kept_because``). With ``per_task``, each
        task's episodes also choose a threshold of their own the same way (``judge.task_thresholds``), the
        one for all staying where a task's cannot choose. The episodes stay in ``labelled``, for
        :meth:`recalibrate_judge`. Under torchrun every rank runs and replays its own episodes, and all choose
        alike on all of them.
        Returns the threshold, the one it replaced and the kappa of each."""
        first = self.real_env.reset([self.task_of_episode[i] for i in self.mine], [self.seeds[i] for i in self.mine])
        real = collect(policy, self.real_env, first, self.options.temperature, self.options.greedy)
        self.labelled = LabelledEpisodes(first, real.actions, real.done, real.success_once)
        return self.recalibrate_judge(tolerance_se, significance_se, per_task)

    def all_labelled(self) -> LabelledEpisodes:
        """Every process's ``labelled`` episodes together, in the check's episode order (one process: its own): what
        rl saves for the recalibrations, the same file whatever the number of processes."""
        if not distributed.active():
            return self.labelled
        return LabelledEpisodes.joined(distributed.gather_dealt(self.labelled.rows()))

    def label(self, episodes: LabelledEpisodes) -> None:
        """Take back saved episodes of all processes (:meth:`all_labelled`'s): this process keeps its own."""
        if len(episodes.first.instructions) != len(self.seeds):
            raise ValueError(f"the saved calibration holds {len(episodes.first.instructions)} episodes; this check runs {len(self.seeds)}")
        self.labelled = episodes if len(self.mine) == len(self.seeds) else episodes.select(self.mine)

    def recalibrate_judge(self, tolerance_se: float = 1.0, significance_se: float = 2.0, per_task: bool = False) -> dict[str, Any]:
        """:meth:`calibrate_judge`'s choice again, on the same real episodes (``labelled``) replayed in the world model
        as it is now: after a refinement round has changed what it renders (worldloop.rl.refine)."""
        from worldloop.rewards.metrics import max_kappa_threshold

        if self.labelled is None:
            raise ValueError("recalibrate_judge replays the episodes of an earlier calibrate_judge (or loaded into labelled): there are none")
        episodes, judge = self.labelled, self.imagined_env.judge
        previous, previous_per_task = judge.threshold, dict(judge.task_thresholds)
        judge.threshold, judge.task_thresholds = math.inf, {}  # no replayed episode ends on a verdict: every chunk it ran gets scored
        try:
            probability = replay(self.imagined_env, episodes.first, episodes, noise_seeds=self.mine).probability
        finally:
            judge.threshold, judge.task_thresholds = previous, previous_per_task
        best = streak_score(probability, getattr(self.imagined_env, "success_chunks", 1)).cpu().numpy()
        # every process's episodes, in the check's order: each process chooses alike
        best = np.array(distributed.gather_dealt(best.tolist()), dtype=best.dtype)
        real = np.array(distributed.gather_dealt(episodes.success_once.cpu().tolist()), dtype=bool)
        instructions = distributed.gather_dealt(list(episodes.first.instructions))
        chosen = max_kappa_threshold(best, real, self.task_of_episode, tolerance_se, significance_se)
        judge.threshold = previous if chosen is None else chosen
        kept_because = None
        if chosen is None:
            kept_because = ("the episodes all succeeded or all failed" if real.all() or not real.any() else
                            f"no threshold's verdicts agree with the simulator's more than {significance_se:g} SE beyond chance")  # fmt: skip
        own: dict[str, float | None] = {}  # per_task: each task's own choice, None where it falls back on the one for all
        if per_task:
            tasks = np.asarray(self.task_of_episode)
            for task in dict.fromkeys(self.task_of_episode):
                mine = tasks == task
                own[task] = max_kappa_threshold(best[mine], real[mine], tasks[mine], tolerance_se, significance_se)
        instruction = dict(zip(self.task_of_episode, instructions))
        judge.task_thresholds = {instruction[task]: threshold for task, threshold in own.items() if threshold is not None}

        def judged_at(threshold: float, by_instruction: dict[str, float]) -> dict[str, Any]:
            thresholds = np.array([by_instruction.get(text, threshold) for text in instructions])
            verdicts = torch.as_tensor(best >= thresholds)
            return summarize(verdicts, self.task_of_episode) | self._versus_real(torch.as_tensor(real), verdicts) | {"threshold": threshold}

        return {"threshold": judge.threshold, "previous": previous, "calibrated": chosen is not None, "kept_because": kept_because,
                "tolerance_se": tolerance_se, "significance_se": significance_se,
                # per_task: each task's own threshold (None: the one for all), and what the judge holds (apply_calibration)
                "task_thresholds": own, "instruction_thresholds": dict(judge.task_thresholds),
                "real": summarize(torch.as_tensor(real), self.task_of_episode),
                "replayed_before": judged_at(previous, previous_per_task),
                "replayed_after": judged_at(judge.threshold, judge.task_thresholds),
                # per episode, for any other threshold's verdicts later: its replay's score, the simulator's verdict, its task
                "per_episode": {"score": best.tolist(), "real": "".join("1" if r else "0" for r in real.tolist()),
                                "task": list(self.task_of_episode)}}  # fmt: skip

    def _versus_real(self, real: torch.Tensor, verdicts: torch.Tensor) -> dict[str, Any]:
        """Per-episode agreement of ``verdicts`` with the simulator's, against chance within tasks, and
        each task's own kappa (``per_task_kappa``: where one task's imagination is faithful and another's is not)."""
        real, verdicts, tasks = real.tolist(), verdicts.tolist(), self.task_of_episode
        agreement = agreement_beyond_chance(real, verdicts, tasks)
        per_task = {}
        for task in dict.fromkeys(tasks):
            mine = [i for i, t in enumerate(tasks) if t == task]
            within = agreement_beyond_chance([real[i] for i in mine], [verdicts[i] for i in mine], [task] * len(mine))
            per_task[task] = {"kappa": within["kappa"], "kappa_stderr": within["kappa_stderr"]}
        return {"agreement": agreement["agreement"], "agreement_by_chance": agreement["chance"],
                "kappa": agreement["kappa"], "kappa_stderr": agreement["kappa_stderr"], "per_task_kappa": per_task}  # fmt: skip

    def _write_videos(self, real: Rollout, replayed: Replay, imagined: Rollout, tag: str) -> None:
        """real | replay | imagined, one frame per chunk: the real episode; the world model stepped by its real
        actions (where it departs, the world model is wrong); the policy acting in imagination (closed loop).
        ``real``, ``replayed`` and ``imagined`` hold this process's episodes."""
        from worldloop.data.video import write_mp4
        from worldloop.utils.draw import caption, side_by_side

        written: dict[str, int] = {}
        for i, episode in enumerate(self.mine):  # this process's episodes: the first videos_per_task of each task
            task = self.task_of_episode[episode]
            if written.get(task, 0) >= self.options.videos_per_task:
                continue
            written[task] = written.get(task, 0) + 1
            number = episode - self.task_of_episode.index(task)  # the episode's number within its task
            real_frames = episode_frames(real, i)
            video = side_by_side(
                caption(real_frames, "real", bool(real.success_once[i])),
                caption(replayed.images[i, : len(real_frames)].cpu(), "replay", bool(replayed.success[i])),  # the real episode's chunks
                caption(episode_frames(imagined, i), "imagined", bool(imagined.success_once[i])),
            )
            write_mp4(self.options.video_dir / f"{tag}_{task}_{number:02d}.mp4", video, fps=4)

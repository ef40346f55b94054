"""Running a policy in any :class:`~worldloop.envs.protocol.VecEnv`: the rollout buffer of one batch
of episodes, and the reality check (the same policy, the same initial states, real vs imagined)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from worldloop.envs.codec import CodecObservations
from worldloop.envs.judging import JudgedEnv, streak_score
from worldloop.envs.protocol import EnvReset, VecEnv
from worldloop.utils.device import autocast_dtype
from worldloop.utils.stats import agreement_beyond_chance, paired_difference, rate_with_stderr


@dataclass
class Rollout:
    """One batch of N episodes, T chunks each (T = the chunks until every episode had ended)."""

    images: torch.Tensor
    """(N, T, H, W, 3) uint8: the observation each chunk was chosen from."""
    instructions: list[str]
    """N instructions."""
    tokens: torch.Tensor
    """(N, T, K, A) int64 sampled action tokens."""
    log_probs: torch.Tensor
    """(N, T, K, A) their log-probabilities at the sampling temperature (the 'old' policy)."""
    rewards: torch.Tensor
    """(N, T) the environment's chunk rewards."""
    done: torch.Tensor
    """(N, T) bool: the episode had ended by the end of chunk t."""
    terminated: torch.Tensor
    """(N, T) bool: succeeded, or ended other than by the time limit, by the end of chunk t (no bootstrap past it)."""
    success: torch.Tensor
    """(N, T) bool: the success signal fired in chunk t."""
    elapsed: torch.Tensor
    """(N,) int64 actions executed per episode."""
    values: torch.Tensor | None = None
    """(N, T) value estimates (policies with a value head)."""
    last_values: torch.Tensor | None = None
    """(N,) value of the observation after the last chunk."""
    actions: torch.Tensor | None = None
    """(N, T, K, A) the action chunks sent to the environment (what a world model replays)."""
    frames: torch.Tensor | None = None
    """(N, T * K, H, W, 3) uint8 on the CPU: the observation after every action (``collect(keep_frames=True)``:
    what a world model trains on)."""

    @property
    def success_once(self) -> torch.Tensor:
        """(N,) bool: the episode succeeded at some step."""
        return self.success.any(dim=1)


def policy_device(policy: Any) -> torch.device:
    device = getattr(policy, "device", None)
    if isinstance(device, torch.device):
        return device
    return next(policy.parameters()).device


def autocast(device: torch.device):
    dtype = autocast_dtype(device)
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def check_compatible(policy: Any, env: VecEnv, where: str = "environment") -> None:
    """A clear error when the policy cannot act in ``env`` (action dimension, chunk size, resolution)."""
    for name in ("action_dim", "chunk_size", "image_size"):
        mine, theirs = int(getattr(policy, name)), int(getattr(env, name))
        if mine != theirs:
            raise ValueError(f"the policy has {name}={mine} but the {where} has {name}={theirs}: use a policy trained for this {where}")


@torch.no_grad()
def collect(policy: Any, env: VecEnv, first: EnvReset, temperature: float = 1.0, greedy: bool = False, keep_frames: bool = False) -> Rollout:
    """Run every episode of ``env`` (already reset to ``first``) until all have ended or the time
    limit, the policy sampling at ``temperature`` (or greedy); everything is kept on the policy's device,
    but for the frame after every action, kept on the CPU with ``keep_frames``."""
    device = policy_device(policy)
    num_chunks = math.ceil(env.max_steps / env.chunk_size)
    instructions = list(first.instructions)
    observation = first.frames
    images, actions, tokens, log_probs, values, rewards, done, truncated, success, frames = ([] for _ in range(10))
    for _ in range(num_chunks):
        with autocast(device):
            out = policy.act(observation, instructions, temperature=temperature, greedy=greedy)
        chunk = out.actions.float()
        step = env.step(chunk.to(env.device))
        images.append(observation.to(device))
        actions.append(chunk.to(device))
        tokens.append(out.tokens.to(device))
        log_probs.append(out.log_probs.float().to(device))
        if out.values is not None:
            values.append(out.values.float().to(device))
        rewards.append(step.reward.float().to(device))
        done.append(step.done[:, -1].to(device))
        truncated.append(step.truncated.to(device))
        success.append(step.success.any(dim=1).to(device))
        if keep_frames:
            frames.append(step.frames.cpu())
        observation = step.frames[:, -1]
        if bool(step.done[:, -1].all()):
            break
    last_values = None
    if values:
        with autocast(device):
            last_values = policy.act(observation, instructions, temperature=temperature).values.float().to(device)
    done_t, success_t = torch.stack(done, dim=1), torch.stack(success, dim=1)
    truncated_so_far = torch.stack(truncated, dim=1).cummax(dim=1).values
    succeeded_so_far = success_t.cummax(dim=1).values
    return Rollout(
        images=torch.stack(images, dim=1),
        instructions=instructions,
        tokens=torch.stack(tokens, dim=1),
        log_probs=torch.stack(log_probs, dim=1),
        rewards=torch.stack(rewards, dim=1),
        done=done_t,
        terminated=(done_t & ~truncated_so_far) | succeeded_so_far,
        success=success_t,
        elapsed=env.elapsed_steps.to(device),
        values=torch.stack(values, dim=1) if values else None,
        last_values=last_values,
        actions=torch.stack(actions, dim=1),
        frames=torch.cat(frames, dim=1) if keep_frames else None,
    )


def summarize(success_once: torch.Tensor, task_names: Sequence[str]) -> dict[str, Any]:
    """success_once (N,) with the task of each episode -> overall and per-task rates with standard errors."""
    outcomes = success_once.bool().tolist()
    rate, stderr = rate_with_stderr(outcomes)
    per_task = {}
    for task in dict.fromkeys(task_names):
        mine = [o for o, t in zip(outcomes, task_names) if t == task]
        task_rate, task_stderr = rate_with_stderr(mine)
        per_task[task] = {"success_once": task_rate, "stderr": task_stderr, "episodes": len(mine)}
    return {"success_once": rate, "stderr": stderr, "episodes": len(outcomes), "per_task": per_task}


def paired_changes(first: dict[str, Any], later: dict[str, Any], source: str = "real", later_source: str | None = None) -> dict[str, Any] | None:
    """How ``source``'s verdicts (real, imagined, ...) changed between two reality checks of the same episodes,
    overall and per task, paired episode by episode (:func:`worldloop.utils.stats.paired_difference`); None
    when either check kept no per-episode verdicts of ``source`` or they are of different episodes.
    ``later_source`` compares ``later``'s verdicts of another source instead (one check against itself: the
    closed loop in reality against the imagined episodes' actions done there)."""
    before = first.get("per_episode", {}).get(source)
    after = later.get("per_episode", {}).get(later_source or source)
    layout = [[(task, numbers["episodes"]) for task, numbers in result["real"]["per_task"].items()] for result in (first, later)]
    if before is None or after is None or len(before) != len(after) or len(after) < 2 or layout[0] != layout[1]:
        return None  # not the same episodes: other tasks, or as many episodes split otherwise
    per_task, start = {}, 0
    for task, numbers in first["real"]["per_task"].items():  # the check's episodes are task-major, in this order
        end = start + numbers["episodes"]
        if numbers["episodes"] >= 2:
            per_task[task] = paired_difference([c == "1" for c in before[start:end]], [c == "1" for c in after[start:end]])
        start = end
    return paired_difference([c == "1" for c in before], [c == "1" for c in after]) | {"per_task": per_task}


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
    environments and accept ``reset_to``. With both and ``video_dir``, the first ``videos_per_task``
    episodes of each task are written as real | replay | imagined mp4s, one frame per chunk.

    ``imagined_actions_in_reality``: the simulator is also driven open loop, from the same initial states, by the
    closed-loop imagined episodes' action chunks (as far as each imagined episode ran): the simulator's verdict on
    what the policy did in imagination, against the imagined verdicts (``imagined_actions_in_reality``). Where
    imagination fails a task the simulator too fails with those actions, the policy acted worse on the imagined
    frames; where the simulator succeeds with them, the world model or the judge rendered them wrongly. Its
    ``versus_closed_loop``: those actions' success against the policy's own in reality, paired per episode.

    ``imagination_repeat``: the imagined episodes' action chunks also drive the imagined environment again, open loop
    from the same frames under other world-model noise (``imagination_repeat``, its kappa against the first imagined
    verdicts): how much of an imagined verdict the actions decide, and how much the world model's sampling noise.
    RL in imagination can only learn what the actions decide."""

    def __init__(
        self,
        real_env: VecEnv,
        tasks: Sequence[str],
        episodes_per_task: int,
        imagined_env: Any | None = None,
        seeds: Sequence[int] | None = None,
        temperature: float = 1.0,
        greedy: bool = False,
        video_dir: str | Path | None = None,
        videos_per_task: int = 0,
        keyframe_env: Any | None = None,
        imagined_actions_in_reality: bool = False,
        imagination_repeat: bool = False,
    ):
        count = len(tasks) * episodes_per_task
        if real_env.num_envs != count:
            raise ValueError(f"the real evaluation env has {real_env.num_envs} envs; {len(tasks)} tasks x {episodes_per_task} episodes need {count}")
        if imagined_env is not None and imagined_env.num_envs != count:
            raise ValueError(f"the imagined evaluation env has {imagined_env.num_envs} envs; expected {count}")
        if imagined_env is not None and int(imagined_env.image_size) != int(real_env.image_size):
            # found now, not after a whole real evaluation: the imagined run starts from the real frames, and its judge reads them
            raise ValueError(f"the real evaluation env renders {real_env.image_size}x{real_env.image_size} frames but the imagined one "
                             f"{imagined_env.image_size}x{imagined_env.image_size}: evaluate at the world model's resolution (sim.image_size)")
        if imagined_actions_in_reality and imagined_env is None:
            raise ValueError("imagined_actions_in_reality replays the imagined episodes' actions: it needs the imagined environment")
        if imagination_repeat and imagined_env is None:
            raise ValueError("imagination_repeat replays the imagined episodes' actions in imagination: it needs the imagined environment")
        if keyframe_env is not None and (imagined_env is None or keyframe_env.num_envs != count):
            raise ValueError(f"the keyframe evaluation needs the imagined one beside it and {count} envs")
        self.real_env, self.imagined_env, self.keyframe_env = real_env, imagined_env, keyframe_env
        self.task_of_episode = [task for task in tasks for _ in range(episodes_per_task)]
        default = [10**6 + 1000 * t + e for t in range(len(tasks)) for e in range(episodes_per_task)]
        self.seeds = list(seeds) if seeds is not None else default
        if len(self.seeds) != count:
            raise ValueError(f"RealityCheck got {len(self.seeds)} seeds for {count} episodes")
        self.temperature, self.greedy = temperature, greedy
        self.labelled: LabelledEpisodes | None = None  # calibrate_judge's real episodes
        self.video_dir, self.videos_per_task = (Path(video_dir) if video_dir is not None else None), videos_per_task
        self.through_codec = isinstance(real_env, CodecObservations)  # the policy sees reality through the world model's VAE
        self.imagined_actions_in_reality = imagined_actions_in_reality
        self.imagination_repeat = imagination_repeat

    def _tokens_on_reconstructed(self, policy: Any) -> Callable[[torch.Tensor, list[str]], torch.Tensor] | None:
        """The policy's tokens on frames encoded and decoded by the imagined env's world-model VAE (None without one)."""
        vae = getattr(getattr(self.imagined_env, "world_model", None), "vae", None)
        if vae is None or self.through_codec:  # through the codec already: its tokens are the real ones
            return None
        from worldloop.worldmodel.vae import reconstruct

        def tokens(frames: torch.Tensor, instructions: list[str]) -> torch.Tensor:
            device = policy_device(policy)
            with autocast(device):
                return policy.act(reconstruct(vae, frames).to(device), instructions, temperature=self.temperature, greedy=self.greedy).tokens

        return tokens

    def __call__(self, policy: Any, tag: str = "eval") -> dict[str, Any]:
        """Real and imagined success of ``policy``; ``tag`` names this evaluation's videos."""
        judge = getattr(self.imagined_env, "judge", None)
        real_env = self.real_env if judge is None else JudgedEnv(self.real_env, judge, getattr(self.imagined_env, "success_chunks", 1))
        first = real_env.reset(self.task_of_episode, self.seeds)
        real = collect(policy, real_env, first, self.temperature, self.greedy)
        result = {"real": summarize(real.success_once, self.task_of_episode), "real_through_codec": self.through_codec}
        if self.imagined_env is not None:
            start = self.imagined_env.reset_to(first.frames, list(first.instructions))
            imagined = collect(policy, self.imagined_env, start, self.temperature, self.greedy)
            result["imagined"] = summarize(imagined.success_once, self.task_of_episode)
            # per episode, beyond what each task's success rate alone explains (kappa 0: RL's reward is noise)
            result |= self._versus_real(real.success_once, imagined.success_once)
            result["tracking"] = trajectory_tracking(real, imagined, self.task_of_episode, self._tokens_on_reconstructed(policy))
            replayed = replay(self.imagined_env, first, real)
            sources = {"replayed": replayed.success}
            if judge is not None:
                sources = {"judged_real": real_env.success_once} | sources
            result["gap_sources"] = {name: summarize(verdicts, self.task_of_episode) | self._versus_real(real.success_once, verdicts)
                                     for name, verdicts in sources.items()}  # fmt: skip
            # every verdict, one character per episode (in the check's episode order), for paired comparisons later
            verdicts = {"real": real.success_once, "imagined": imagined.success_once} | sources
            if self.imagined_actions_in_reality:
                self.real_env.reset(self.task_of_episode, self.seeds)
                acted = replay_in_reality(self.real_env, imagined)
                # against the imagined verdicts: did what imagination called success (or failure) come true?
                result["imagined_actions_in_reality"] = summarize(acted, self.task_of_episode) | self._versus_real(imagined.success_once, acted)
                verdicts["imagined_actions_in_reality"] = acted
            if self.imagination_repeat:
                # the same actions from the same frames under other world-model noise: kappa near 1, the imagined verdict is
                # the actions' (RL can learn it, right or wrong); near 0, it is the noise's (RL's reward is a coin)
                again = replay(self.imagined_env, first, imagined, noise_seed_offset=len(self.seeds)).success
                result["imagination_repeat"] = summarize(again, self.task_of_episode) | self._versus_real(imagined.success_once, again)
                verdicts["imagination_repeat"] = again
            if self.keyframe_env is not None:
                start = self.keyframe_env.reset(list(first.instructions), self.seeds)
                from_keyframes = collect(policy, self.keyframe_env, start, self.temperature, self.greedy)
                share = self.keyframe_env.started_from_keyframe.float().mean().item()
                result["imagined_keyframes"] = summarize(from_keyframes.success_once, self.task_of_episode) | {"keyframe_starts": share}
                verdicts["imagined_keyframes"] = from_keyframes.success_once
            result["per_episode"] = {name: "".join("1" if v else "0" for v in outcome.tolist()) for name, outcome in verdicts.items()}
            if self.imagined_actions_in_reality:  # did the actions chosen on imagined frames do better than those chosen on real ones?
                result["imagined_actions_in_reality"]["versus_closed_loop"] = paired_changes(result, result, "real", "imagined_actions_in_reality")
            if self.video_dir is not None and self.videos_per_task > 0:
                self._write_videos(real, replayed, imagined, tag)
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
        :meth:`recalibrate_judge`.
        Returns the threshold, the one it replaced and the kappa of each."""
        first = self.real_env.reset(self.task_of_episode, self.seeds)
        real = collect(policy, self.real_env, first, self.temperature, self.greedy)
        self.labelled = LabelledEpisodes(first, real.actions, real.done, real.success_once)
        return self.recalibrate_judge(tolerance_se, significance_se, per_task)

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
            probability = replay(self.imagined_env, episodes.first, episodes).probability
        finally:
            judge.threshold, judge.task_thresholds = previous, previous_per_task
        best = streak_score(probability, getattr(self.imagined_env, "success_chunks", 1)).cpu().numpy()
        real = episodes.success_once.cpu().numpy()
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
        instruction = dict(zip(self.task_of_episode, episodes.first.instructions))
        judge.task_thresholds = {instruction[task]: threshold for task, threshold in own.items() if threshold is not None}

        def judged_at(threshold: float, by_instruction: dict[str, float]) -> dict[str, Any]:
            thresholds = np.array([by_instruction.get(text, threshold) for text in episodes.first.instructions])
            verdicts = torch.as_tensor(best >= thresholds)
            return summarize(verdicts, self.task_of_episode) | self._versus_real(episodes.success_once, verdicts) | {"threshold": threshold}

        return {"threshold": judge.threshold, "previous": previous, "calibrated": chosen is not None, "kept_because": kept_because,
                "tolerance_se": tolerance_se, "significance_se": significance_se,
                # per_task: each task's own threshold (None: the one for all), and what the judge holds (apply_calibration)
                "task_thresholds": own, "instruction_thresholds": dict(judge.task_thresholds),
                "real": summarize(episodes.success_once, self.task_of_episode),
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
        actions (where it departs, the world model is wrong); the policy acting in imagination (closed loop)."""
        from worldloop.data.video import write_mp4
        from worldloop.utils.draw import caption, side_by_side

        written: dict[str, int] = {}
        for i, task in enumerate(self.task_of_episode):
            number = written.get(task, 0)
            if number >= self.videos_per_task:
                continue
            written[task] = number + 1
            real_frames = episode_frames(real, i)
            video = side_by_side(
                caption(real_frames, "real", bool(real.success_once[i])),
                caption(replayed.images[i, : len(real_frames)].cpu(), "replay", bool(replayed.success[i])),  # the real episode's chunks
                caption(episode_frames(imagined, i), "imagined", bool(imagined.success_once[i])),
            )
            write_mp4(self.video_dir / f"{tag}_{task}_{number:02d}.mp4", video, fps=4)


def apply_calibration(judge: Any, result: dict[str, Any]) -> None:
    """The judge's thresholds as a saved calibration (:meth:`RealityCheck.recalibrate_judge`'s result) chose them."""
    judge.threshold = float(result["threshold"])
    judge.task_thresholds = {text: float(threshold) for text, threshold in result.get("instruction_thresholds", {}).items()}


@dataclass
class LabelledEpisodes:
    """Real episodes as an open-loop replay needs them, with the simulator's verdicts: what
    rl.judge_threshold=replay chooses the judge's threshold on, kept (and saved) so that a refined world
    model's threshold can be chosen again on the same episodes."""

    first: EnvReset
    """The initial observations and instructions."""
    actions: torch.Tensor
    """(N, T, K, A) the action chunks the real episodes executed."""
    done: torch.Tensor
    """(N, T) bool: the episode had ended by the end of chunk t."""
    success_once: torch.Tensor
    """(N,) bool: the simulator's verdict."""

    def save(self, path: str | Path) -> None:
        from worldloop.utils.io import atomic_path

        tensors = {"frames": self.first.frames, "actions": self.actions, "done": self.done, "success_once": self.success_once}
        with atomic_path(Path(path)) as tmp:
            torch.save({name: value.cpu() for name, value in tensors.items()} | {"instructions": list(self.first.instructions)}, tmp)

    @classmethod
    def load(cls, path: str | Path) -> "LabelledEpisodes":
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # a truncated or foreign file: say which, not torch's unpickling details
            raise ValueError(f"{path} is not a file of labelled episodes that rl wrote ({type(error).__name__}: {str(error)[:200]})") from error
        return cls(EnvReset(saved["frames"], saved["instructions"]), saved["actions"], saved["done"], saved["success_once"])


@dataclass
class Replay:
    """The imagined environment driven open loop by a real run's own action chunks (no policy): what
    differs from reality here is the world model and the judge alone."""

    success: torch.Tensor
    """(N,) bool: judged a success within the chunks the real episode executed."""
    probability: torch.Tensor
    """(N, T) the P(success) of each chunk's verdict, 0 for chunks the real episode did not run."""
    images: torch.Tensor
    """(N, T, H, W, 3) uint8: the imagined observation before each chunk (the real run's ``images``, imagined)."""


@torch.no_grad()
def chunks_run(done: torch.Tensor) -> torch.Tensor:
    """(N, T) bool: chunk t ran, i.e. the episode had not ended before it (``done``: ended by the end of chunk t)."""
    return torch.cat([torch.ones_like(done[:, :1]), ~done[:, :-1]], dim=1)


def replay(env: Any, first: EnvReset, real: Rollout | LabelledEpisodes, noise_seed_offset: int = 0) -> Replay:
    """The imagined ``env`` from the real run's initial observations, stepped by the real run's action chunks
    (``noise_seed_offset``: under other world-model noise than the closed loop's from the same frames)."""
    env.reset_to(first.frames, list(first.instructions), noise_seed_offset=noise_seed_offset)
    executed = chunks_run(real.done)
    success = torch.zeros_like(executed[:, 0])
    probability = torch.zeros(executed.shape, device=success.device)
    observation, images = first.frames, []
    for t in range(real.actions.shape[1]):
        images.append(observation.to(success.device))
        step = env.step(real.actions[:, t].to(env.device))
        success |= step.success.any(dim=1).to(success.device) & executed[:, t]
        probability[:, t] = env.verdicts.probability.to(success.device) * executed[:, t]
        observation = step.frames[:, -1]
    return Replay(success, probability, torch.stack(images, dim=1))


def replay_in_reality(env: VecEnv, imagined: Rollout) -> torch.Tensor:
    """The simulator ``env`` (already reset to the imagined run's initial states) stepped open loop by the imagined
    run's action chunks, each episode as far as it ran in imagination -> the simulator's success_once (N,)."""
    executed = chunks_run(imagined.done)
    success = torch.zeros_like(executed[:, 0])
    for t in range(imagined.actions.shape[1]):
        step = env.step(imagined.actions[:, t].to(env.device))
        success |= step.success.any(dim=1).to(success.device) & executed[:, t]
    return success


def trajectory_tracking(
    real: Rollout, imagined: Rollout, tasks: Sequence[str], tokens_on_reconstructed: Callable[[torch.Tensor, list[str]], torch.Tensor] | None = None,
) -> list[dict[str, Any]]:
    """How long imagination follows the real trajectory, from the same initial states under the same
    policy, after 1, 2, 4, 8, ... chunks: the PSNR of the imagined observation against the real one,
    over the episodes still running in both, beside the PSNR of the initial frame against the real one
    (as if nothing had moved: below it, imagination has lost the scene); the share of action tokens the
    policy chooses alike from the two observations (1 at the start, where they are the same frame: low
    while the PSNR is still high means the policy reacts to the world model's artefacts) and the mean
    number of bins between them (well below 1: near-ties flipping; several: other actions); and how well
    "succeeded by then" agrees beyond chance (Cohen's kappa within tasks). Greedy policies make the two
    comparable: sampling draws different actions in the two worlds. With ``tokens_on_reconstructed`` (the
    policy's tokens on the real observations passed through the world model's VAE), the share of tokens the
    policy keeps on those too, and their distance: how much of its other choices the VAE's loss of detail alone explains;
    and the share it chooses alike on those and on the imagined frames (``token_agreement_reconstructed_imagined``): high
    where imagination differs from reality mostly by the codec, which a policy observing reality through the VAE would share."""
    from worldloop.worldmodel.metrics import psnr

    rows = []
    chunks = 1
    while chunks < min(real.images.shape[1], imagined.images.shape[1]):
        running = ~real.done[:, chunks - 1] & ~imagined.done[:, chunks - 1]  # both observed after `chunks` chunks
        if not running.any():
            break
        real_now = real.images[running, chunks]
        tokens_real, tokens_imagined = real.tokens[running, chunks], imagined.tokens[running, chunks]
        by_then_real, by_then_imagined = real.success[:, :chunks].any(dim=1), imagined.success[:, :chunks].any(dim=1)
        agreement = agreement_beyond_chance(by_then_real.tolist(), by_then_imagined.tolist(), list(tasks))
        rows.append({
            "chunks": chunks,
            "episodes_running": int(running.sum()),
            "psnr": float(psnr(imagined.images[running, chunks], real_now).mean()),
            "psnr_initial_frame": float(psnr(real.images[running, 0], real_now).mean()),
            "token_agreement": float((tokens_real == tokens_imagined).float().mean()),
            "token_distance": float((tokens_real - tokens_imagined).abs().float().mean()),
            "real_success_by_then": float(by_then_real.float().mean()),
            "imagined_success_by_then": float(by_then_imagined.float().mean()),
            "kappa": agreement["kappa"],
            "kappa_stderr": agreement["kappa_stderr"],
        })  # fmt: skip
        if tokens_on_reconstructed is not None:
            instructions = [real.instructions[i] for i in running.nonzero().flatten().tolist()]
            reconstructed = tokens_on_reconstructed(real_now, instructions).to(real.tokens.device)
            rows[-1] |= {
                "token_agreement_reconstructed": float((tokens_real == reconstructed).float().mean()),
                "token_distance_reconstructed": float((tokens_real - reconstructed).abs().float().mean()),
                # what a policy that saw the real world through the VAE too would share with its imagined self
                "token_agreement_reconstructed_imagined": float((tokens_imagined == reconstructed).float().mean()),
            }
        chunks *= 2
    return rows


def tracking_line(rows: list[dict[str, Any]]) -> str:
    """'imagined vs real after 1/2/4 chunks: PSNR 31.2/27.5/22.0 dB (initial frame 28.0/24.1/21.5),
    same action tokens 0.91/0.62/0.40 (0.2/1.9/4.0 bins apart), success-by-then kappa 0.40/0.21/-'."""
    def joined(key: str, pattern: str = "{:.1f}") -> str:
        return "/".join("-" if row.get(key) is None else pattern.format(row[key]) for row in rows)

    return (f"imagined vs real after {joined('chunks', '{}')} chunks: PSNR {joined('psnr')} dB "
            f"(initial frame {joined('psnr_initial_frame')}), same action tokens {joined('token_agreement', '{:.2f}')} "
            f"({joined('token_distance')} bins apart)"
            + (f" (on the real frames through the VAE {joined('token_agreement_reconstructed', '{:.2f}')}, {joined('token_distance_reconstructed')} bins apart; "
               f"those against the imagined frames' {joined('token_agreement_reconstructed_imagined', '{:.2f}')})"
               if any("token_agreement_reconstructed" in r for r in rows) else "")
            + ", "
            f"success-by-then kappa {joined('kappa', '{:.2f}')}")


def episode_frames(rollout: Rollout, index: int) -> torch.Tensor:
    """(n, H, W, 3) uint8 on the CPU: the observations episode ``index`` acted on, up to its end."""
    ended = rollout.done[index].nonzero()
    chunks = int(ended[0]) + 1 if len(ended) else rollout.done.shape[1]
    return rollout.images[index, :chunks].cpu()

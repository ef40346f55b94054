"""Replays and tracking, what the reality checks and the fidelity gate measure imagination with: a batch of real
episodes replayed open loop in a world model (:func:`replay`), the imagined episodes' actions replayed in the simulator
(:func:`replay_in_reality`), how long imagination follows the real trajectory from the same initial state
(:func:`trajectory_tracking`, :func:`episode_tracking`, :func:`tracking_rows`), the real episodes kept with their
verdicts for a refined world model's recalibration (:class:`LabelledEpisodes`), and success rates per task
(:func:`summarize`). The rollout buffer itself is RL's (:class:`worldloop.rl.rollout.Rollout`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from worldloop.envs.protocol import EnvReset, VecEnv
from worldloop.rl.rollout import Rollout
from worldloop.utils.stats import agreement_beyond_chance, rate_with_stderr


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

    def select(self, indices: Sequence[int]) -> "LabelledEpisodes":
        """These episodes only (a rank's dealt share of a calibration's, :func:`worldloop.utils.distributed.dealt`)."""
        index = list(indices)

        def rows_of(tensor: torch.Tensor) -> torch.Tensor:
            return tensor[torch.as_tensor(index, dtype=torch.long, device=tensor.device)]

        first = EnvReset(rows_of(self.first.frames), [self.first.instructions[i] for i in index])
        return LabelledEpisodes(first, rows_of(self.actions), rows_of(self.done), rows_of(self.success_once))

    @classmethod
    def joined(cls, rows: list[tuple]) -> "LabelledEpisodes":
        """Episodes from their rows (:meth:`rows`, in the order wanted), the shorter ones padded past their end to the
        longest (actions 0, ended): what a replay reads of them is the same."""
        chunks = max(actions.shape[0] for _, _, actions, _, _ in rows)

        def padded(tensor: torch.Tensor, value) -> torch.Tensor:
            return torch.cat([tensor, tensor.new_full((chunks - tensor.shape[0], *tensor.shape[1:]), value)])

        frames, instructions, actions, done, success = zip(*rows)
        return cls(EnvReset(torch.stack(frames), list(instructions)), torch.stack([padded(a, 0) for a in actions]), torch.stack([padded(d, True) for d in done]),
                   torch.stack(success))  # fmt: skip

    def rows(self) -> list[tuple]:
        """One (first frame, instruction, actions, done, success) per episode, on the CPU: to gather them over ranks
        (each its own copy: a view would carry the whole batch's storage along when pickled)."""
        frames, actions, done, success = (tensor.cpu() for tensor in (self.first.frames, self.actions, self.done, self.success_once))
        return [(frames[i].clone(), text, actions[i].clone(), done[i].clone(), success[i].clone()) for i, text in enumerate(self.first.instructions)]

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


def replay(env: Any, first: EnvReset, real: Rollout | LabelledEpisodes, noise_seeds: Sequence[int] | None = None) -> Replay:
    """The imagined ``env`` from the real run's initial observations, stepped by the real run's action chunks
    (``noise_seeds``, one per episode, default 0..N-1: the world-model noise)."""
    env.reset_to(first.frames, list(first.instructions), noise_seeds=noise_seeds)
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
    where imagination differs from reality mostly by the codec, which a policy observing reality through the VAE would share.

    In two steps, so that several processes can each measure their own episodes: :func:`episode_tracking` per
    episode, :func:`tracking_rows` over all of them."""
    return tracking_rows(episode_tracking(real, imagined, tokens_on_reconstructed), tasks)


@torch.no_grad()
def episode_tracking(real: Rollout, imagined: Rollout, tokens_on_reconstructed: Callable[[torch.Tensor, list[str]], torch.Tensor] | None = None,
                     ) -> list[dict[str, Any]]:  # fmt: skip
    """:func:`trajectory_tracking`'s measures of each episode: the chunk of its first success in each world (None:
    none), and after 1, 2, 4, ... chunks, while it runs in both, its ``measures`` then."""
    from worldloop.worldmodel.metrics import psnr

    def first_success(success: torch.Tensor) -> list[int | None]:
        return [int(row.nonzero()[0]) if row.any() else None for row in success.cpu()]

    episodes = [{"real_first_success": in_real, "imagined_first_success": in_imagination, "measures": {}}
                for in_real, in_imagination in zip(first_success(real.success), first_success(imagined.success))]  # fmt: skip
    chunks = 1
    while chunks < min(real.images.shape[1], imagined.images.shape[1]):
        running = ~real.done[:, chunks - 1] & ~imagined.done[:, chunks - 1]  # both observed after `chunks` chunks
        if not running.any():
            break
        real_now, imagined_now = real.images[running, chunks], imagined.images[running, chunks]
        tokens_real, tokens_imagined = real.tokens[running, chunks].flatten(1), imagined.tokens[running, chunks].flatten(1)
        measures = {
            "psnr": psnr(imagined_now, real_now),
            "psnr_initial_frame": psnr(real.images[running, 0], real_now),
            "token_agreement": (tokens_real == tokens_imagined).float().mean(dim=1),
            "token_distance": (tokens_real - tokens_imagined).abs().float().mean(dim=1),
        }
        if tokens_on_reconstructed is not None:
            instructions = [real.instructions[i] for i in running.nonzero().flatten().tolist()]
            reconstructed = tokens_on_reconstructed(real_now, instructions).to(real.tokens.device).flatten(1)
            measures |= {
                "token_agreement_reconstructed": (tokens_real == reconstructed).float().mean(dim=1),
                "token_distance_reconstructed": (tokens_real - reconstructed).abs().float().mean(dim=1),
                # what a policy that saw the real world through the VAE too would share with its imagined self
                "token_agreement_reconstructed_imagined": (tokens_imagined == reconstructed).float().mean(dim=1),
            }
        measures = {name: values.float().cpu().tolist() for name, values in measures.items()}
        for row, episode in enumerate(running.nonzero().flatten().tolist()):
            episodes[episode]["measures"][chunks] = {name: values[row] for name, values in measures.items()}
        chunks *= 2
    return episodes


def tracking_rows(episodes: list[dict[str, Any]], tasks: Sequence[str]) -> list[dict[str, Any]]:
    """:func:`trajectory_tracking`'s rows from every episode's :func:`episode_tracking` (``tasks``: each episode's):
    per number of chunks, the measures' means over the episodes running in both worlds, and success by then over all."""
    rows, chunks = [], 1
    while True:
        running = [episode["measures"][chunks] for episode in episodes if chunks in episode["measures"]]
        if not running:
            break
        by_then = {world: [episode[f"{world}_first_success"] is not None and episode[f"{world}_first_success"] < chunks for episode in episodes]
                   for world in ("real", "imagined")}  # fmt: skip
        agreement = agreement_beyond_chance(by_then["real"], by_then["imagined"], list(tasks))
        mean = {name: sum(measures[name] for measures in running) / len(running) for name in running[0]}
        rows.append({
            "chunks": chunks,
            "episodes_running": len(running),
            "psnr": mean["psnr"],
            "psnr_initial_frame": mean["psnr_initial_frame"],
            "token_agreement": mean["token_agreement"],
            "token_distance": mean["token_distance"],
            "real_success_by_then": sum(by_then["real"]) / len(episodes),
            "imagined_success_by_then": sum(by_then["imagined"]) / len(episodes),
            "kappa": agreement["kappa"],
            "kappa_stderr": agreement["kappa_stderr"],
        } | {name: value for name, value in mean.items() if "reconstructed" in name})  # fmt: skip
        chunks *= 2
    return rows


def episode_frames(rollout: Rollout, index: int) -> torch.Tensor:
    """(n, H, W, 3) uint8 on the CPU: the observations episode ``index`` acted on, up to its end."""
    ended = rollout.done[index].nonzero()
    chunks = int(ended[0]) + 1 if len(ended) else rollout.done.shape[1]
    return rollout.images[index, :chunks].cpu()

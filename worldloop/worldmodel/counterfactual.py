"""Does the world model follow its actions as the simulator does? The counterfactual, checked in the simulator.

eval-wm's action ΔPSNR drives each held-out episode with the next one's actions and measures how far the
model's frames move from the recorded ones; how far they *should* move it cannot say. Here the simulator
answers: every episode is reset to its recorded task and scene seed and driven by the same swapped
actions, so the frames the model should have drawn exist. Per horizon h (frames 1..h, as eval-wm):

- ``counterfactual_psnr``: the model under the swapped actions against the simulator under them;
- ``blind_psnr``: the model under the episode's *own* actions against the simulator under the swapped ones,
  i.e. what a model that ignored the swap would score; ``counterfactual_gain`` = the difference, with its
  standard error over episodes (paired): > 0 when the model moves the scene the way the actions say;
- ``factual_psnr``: the model under the episode's own actions against the simulator under them (the model's
  accuracy where it is trained, free of the recording's video-codec loss), and ``action_following`` =
  (counterfactual - blind) / (factual - blind): the share of the actions' effect the model reproduces (1: it is
  as accurate under other actions as under the recorded ones; 0: it ignores them);
- ``simulator_action_effect_psnr``: the recorded frames against the simulator's swapped ones, how much the
  swap changes the scene at all (low: a large effect, which the model's ΔPSNR should approach);
- ``replay_psnr``: the simulator under the episode's own actions against the recorded frames, the check
  that the reset reproduces the recording: only the video codec's loss remains (~32 dB at 64x64); it is
  also the ceiling of every PSNR against the recording.

Frames after the simulator ends an episode (success held, or the time limit) are left out: it stops there.
Needs episodes collected by worldloop in this simulator (``info`` with ``task`` and ``seed``) at its settings.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch

from worldloop.worldmodel.metrics import psnr

FIRST_FRAME_MIN_PSNR = 25.0  # dB: the recording's own video codec costs ~31-32 at 64x64; another camera lands far below
STATE_TOLERANCE = 1e-4  # the reset's observation equals the recorded one exactly when the scene seed is the same


def recorded_starts(episodes: Sequence[Any]) -> tuple[list[str], list[int]]:
    """The (task, scene seed) every episode was collected from; a clear error where the dataset lacks them."""
    missing = [e.index for e in episodes if not {"task", "seed"} <= set(getattr(e, "info", {}) or {})]
    if missing:
        raise ValueError(f"episodes {missing[:5]} carry no recorded task and seed (info['task'], info['seed']): "
                         "the simulator check needs a dataset collected by `worldloop collect`")
    return [e.info["task"] for e in episodes], [int(e.info["seed"]) for e in episodes]


@torch.no_grad()
def simulate(sim_config: Any, episodes: Sequence[Any], actions_of: Sequence[Any], horizon: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reset the simulator to every episode's recorded start and drive it with ``actions_of``'s recorded actions
    (zero-padded past their end, as eval-wm's open loop does) for ``horizon`` frames, all episodes at once.
    Returns frames (N, horizon, H, W, 3) uint8 (frames 1..horizon) and running (N, horizon) bool (the episode
    had not ended before the action that produced the frame)."""
    from worldloop.sims import make_env

    tasks, seeds = recorded_starts(episodes)
    size = np.asarray(episodes[0].frames[0]).shape[0]
    if size != sim_config.image_size:
        raise ValueError(f"the episodes are {size}x{size} but sim.image_size is {sim_config.image_size}: set sim.image_size={size}")
    chunk = sim_config.chunk_size
    length = math.ceil(horizon / chunk) * chunk
    actions = np.zeros((len(episodes), length, np.asarray(actions_of[0].actions).shape[1]), np.float32)
    for i, driver in enumerate(actions_of):
        recorded = np.asarray(driver.actions, dtype=np.float32)[:length]
        actions[i, : len(recorded)] = recorded
    env = make_env(sim_config, len(episodes), tasks=sorted(set(tasks)))
    try:
        check_starts(episodes, env.reset(tasks, seeds), tasks, seeds)
        frames, running = [], []
        ended = torch.zeros(len(episodes), dtype=torch.bool)
        for c in range(0, length, chunk):
            step = env.step(torch.from_numpy(actions[:, c : c + chunk]))
            done_before = torch.cat([ended[:, None], step.done[:, :-1]], dim=1)  # ended before each action of the chunk
            frames.append(step.frames)
            running.append(~done_before)
            ended = step.done[:, -1]
    finally:
        env.close()
    return torch.cat(frames, dim=1)[:, :horizon], torch.cat(running, dim=1)[:, :horizon]


def check_starts(episodes: Sequence[Any], reset: Any, tasks: list[str], seeds: list[int]) -> None:
    """The simulator's reset must be the recorded start: the same observation (the scene seed: object and goal
    positions) where episodes carry their state, and nearly the same first frame (camera, resolution, shadows)."""

    def refuse(i: int, what: str) -> None:
        raise ValueError(f"the simulator's reset of episode {episodes[i].index} ({tasks[i]}, seed {seeds[i]}) is not its recorded start: "
                         f"{what}; the dataset was collected with other sim.* settings or another simulator version")

    for i, episode in enumerate(episodes):
        if episode.state is not None and reset.state is not None:
            gap = float(np.abs(reset.state[i].numpy() - np.asarray(episode.state[0], np.float32)).max())
            if gap > STATE_TOLERANCE:
                refuse(i, f"its observation differs from the recorded one by up to {gap:.3g}")
    recorded = torch.stack([torch.as_tensor(np.asarray(e.frames[0])) for e in episodes])
    start_psnr = psnr(reset.frames, recorded)
    if bool((start_psnr < FIRST_FRAME_MIN_PSNR).any()):
        worst = int(start_psnr.argmin())
        refuse(worst, f"its first frame is {float(start_psnr[worst]):.1f} dB from the recorded one (< {FIRST_FRAME_MIN_PSNR}: camera, shadows?)")


def counterfactual_metrics(
    real: torch.Tensor, generated: torch.Tensor, other: torch.Tensor, simulated_other: torch.Tensor, simulated_own: torch.Tensor,
    valid: torch.Tensor, horizons: Sequence[int],
) -> dict[str, dict[str, float]]:
    """The module docstring's numbers per horizon, over the frames every episode has (``valid``: recorded frame,
    and the simulator still running under both action sequences) and the episodes that reach frame h."""
    curves = {
        "counterfactual_psnr": psnr(other, simulated_other), "blind_psnr": psnr(generated, simulated_other),
        "factual_psnr": psnr(generated, simulated_own),
        "simulator_action_effect_psnr": psnr(real, simulated_other), "replay_psnr": psnr(simulated_own, real),
    }  # fmt: skip
    rows = {}
    for h in horizons:
        episodes = valid[:, h - 1]
        if not episodes.any():
            continue
        mask = valid[episodes, :h].double()
        per_episode = {key: (curve[episodes, :h].double() * mask).sum(1) / mask.sum(1) for key, curve in curves.items()}
        gain = per_episode["counterfactual_psnr"] - per_episode["blind_psnr"]
        row = {key: float(values.mean()) for key, values in per_episode.items()}
        reachable = row["factual_psnr"] - row["blind_psnr"]  # what following the actions perfectly would gain
        row |= {"counterfactual_gain": float(gain.mean()), "episodes": int(episodes.sum()),
                "counterfactual_gain_stderr": float(gain.std() / math.sqrt(len(gain))) if len(gain) > 1 else float("nan"),
                "action_following": float(gain.mean()) / reachable if reachable > 0 else float("nan")}
        rows[str(h)] = row
    return rows

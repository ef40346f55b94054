"""Refining the world model on the evolving policy's real rollouts, within one RL run (PACE inside `rl`).

RL in imagination moves the policy towards actions the world model has not seen, and where the world
model renders those wrongly, RL exploits it: in the 2026-12-02 replay-calibrated-judge run the world model replaying
the policy's real door-open actions agreed with the simulator at kappa 0.50 before RL and -0.20 after 44
iterations, while real success fell 0.46 -> 0.13 (docs/experiments/). WoVR's answer is PACE: let the world
model see what the evolved policy really does. `worldloop loop` does it between whole RL stages; this
does it every ``rl.refine.every`` iterations of one run:

1. the policy runs ``rl.refine.episodes_per_task`` real episodes per training task, sampled at the
   training temperature (the actions RL is exploring), from initial states apart from the evaluations';
2. the world model makes its training examples of them (``refine_examples``: the built-in one encodes their
   clips with its VAE, as ``train-wm`` encodes a dataset's), which are kept
   (``OUT/refine/round_<iteration>.safetensors``, so a resumed run rebuilds the same buffer);
3. the world model takes ``rl.refine.steps`` optimizer steps (``refine_step``) on batches drawn half from every
   round's examples so far, half from those of the dataset's training episodes of the same tasks (what it knew,
   so that it does not forget the scenes), and imagination goes on in the refined model (``use_refined``). The
   built-in one steps an fp32 copy of its DiT (the inference copy is bf16 on the GPU, too coarse for small steps)
   with AdamW on its own flow-matching loss, and imagines with an exponential moving average of its weights
   (``REFINE_EMA_DECAY``, as ``train-wm`` samples from its EMA).

The refiner calls the world model only through the refinement methods of its protocol
(:class:`worldloop.worldmodel.protocol.WorldModelLike`), so a world model of the user's own is refined as the built-in
one is.

With ``rl.judge_threshold=replay``, the judge's threshold is then chosen again on the calibration's real
episodes replayed in the refined world model (``judge_check``): calibrated on the unrefined model, it no
longer fits what the refined one renders (the 2026-12-02 refinement-ab run: 0.995, and the refined model's
replays of drawer-open judged 0.00 where reality said 0.44).

Each round reports the real success of the rollouts (the training policy, in reality) and the loss of the
world model in use (``refine_loss``; the built-in's EMA) on the new examples before and after the round, on the
same noise: how surprised it was by the policy, and how much the round taught it.

Under torchrun, rank 0 alone collects the real rollouts and trains (steps 1 to 3: it alone has the refinement's
simulator); then its refined weights go to every rank's imagined environment
(:func:`worldloop.utils.distributed.broadcast_parameters`), and every rank replays its share of the calibration's
episodes for the judge's new threshold, which all choose alike (:meth:`RealityCheck.recalibrate_judge`). The other
ranks wait for the round; each holds the refinement's state that a checkpoint restores.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from worldloop.data.dataset import split_episodes
from worldloop.worldmodel.protocol import WorldModelLike
from worldloop.envs.protocol import EnvReset, VecEnv
from worldloop.rewards.configuration import CalibrateConfig
from worldloop.rl.configuration import RLConfig
from worldloop.rl.evaluate import EVAL_SEED_OFFSET
from worldloop.rl.rollout import Rollout, apply_calibration, collect
from worldloop.sims import make_env
from worldloop.sims.tasks import instruction
from worldloop.utils import distributed
from worldloop.utils.io import atomic_write_json, read_json
from worldloop.worldmodel.configuration import WorldModelConfig

REFINE = "refine"
MAX_DATASET_EPISODES_PER_TASK = 50  # the "what it knew" half: enough scenes per task, a bounded encoding cost
REFINE_LR = 1e-4
"""AdamW learning rate of the refinement (constant; train-wm's schedule ends at 10 % of world_model.lr)."""
REFINE_EMA_DECAY = 0.99
"""Decay per refinement step of the moving average of the refined weights that the imagined environment samples from
and OUT/world_model keeps (for a world model that keeps one, as the built-in does): ~100 of a round's steps. The raw
weights of the last step (0) turned the 2026-12-02 refinement-ab run's imagination pessimistic."""


@dataclass
class RealEpisode:
    """One real episode as the world model's training reads it: row t pairs the frame before action t with it."""

    frames: np.ndarray  # (T, H, W, 3) uint8
    actions: np.ndarray  # (T, A) float32


def rollout_episodes(first: EnvReset, rollout: Rollout) -> list[RealEpisode]:
    """The episodes of a ``collect(keep_frames=True)`` rollout, each cut at its last executed action."""
    if rollout.frames is None or rollout.actions is None:
        raise ValueError("rollout_episodes needs a rollout collected with keep_frames=True")
    frames = torch.cat([first.frames.cpu()[:, None], rollout.frames], dim=1).numpy()  # (N, T*K + 1, H, W, 3)
    actions = rollout.actions.flatten(1, 2).float().cpu().numpy()  # (N, T*K, A)
    return [RealEpisode(frames[i, :length], actions[i, :length]) for i, length in enumerate(rollout.elapsed.tolist())]


def refine_seed(task_position: int, episode: int, seed_offset: int) -> int:
    """Simulator seed of refinement episode ``episode`` of the refiner's task at ``task_position``: above the
    evaluation seeds (``seed_offset + 1000 * (task's Meta-World index) + e``, see
    :func:`worldloop.rl.evaluate.eval_seed`) and the collection seeds (below ``seed_offset``)."""
    if not 0 <= episode < 100_000:
        raise ValueError(f"refinement episode {episode}: at most 100000 per task")
    return seed_offset + 1_000_000 + 100_000 * task_position + episode


class WorldModelRefiner:
    """``refiner(policy, iteration)`` runs one refinement round and returns its metrics; ``modules`` and
    ``stateful`` (the world model's refinement state) go into RL's checkpoints, ``restore(iteration)`` rebuilds the
    state a resumed run had, and ``save(folder)`` writes the refined world model at the end. Under torchrun every rank
    calls it; ``real_env`` is None on the ranks other than 0, which receive the refined weights. ``world_model``: any
    :class:`~worldloop.worldmodel.protocol.WorldModelLike` with its refinement methods; ``world_model_config``: the run's
    world_model settings (its batch_size: the examples per step)."""

    def __init__(
        self,
        world_model: WorldModelLike,
        real_env: VecEnv | None,
        tasks: Sequence[str],
        dataset_episodes: Iterable[Any],
        rl: RLConfig,
        world_model_config: WorldModelConfig,
        out: str | Path,
        seed: int = 0,
        seed_offset: int = EVAL_SEED_OFFSET,
        calibrate: CalibrateConfig | None = None,
        lr: float = REFINE_LR,
        ema_decay: float = REFINE_EMA_DECAY,
    ):
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"the refinement's ema_decay must lie in [0, 1), got {ema_decay}")
        per_task = rl.refine.episodes_per_task
        if real_env is not None and real_env.num_envs != len(tasks) * per_task:
            raise ValueError(f"the refinement's real environment has {real_env.num_envs} envs; {len(tasks)} tasks x rl.refine.episodes_per_task {per_task} are needed")
        self.world_model, self.real_env, self.tasks, self.rl = world_model, real_env, list(tasks), rl
        self.calibrate = calibrate or CalibrateConfig()  # reward.calibrate: how a recalibration chooses the judge's threshold
        self.dataset_episodes = dataset_episodes  # read at the first round (not at start-up), then released
        self.out, self.seed, self.seed_offset = Path(out) / REFINE, seed, seed_offset
        self.device, self.batch_size = world_model.device, world_model_config.batch_size
        self.state = world_model.start_refinement(world_model_config, lr, ema_decay)  # the weights and optimizer refinement trains
        self.modules, self.stateful = self.state.modules, self.state.stateful
        self.rounds: list[dict[str, torch.Tensor]] = []  # every round's examples (the built-in's: latents (M, C, 4, h, w), actions (M, 13, A) raw)
        self.known: dict[str, torch.Tensor] | None = None  # the examples of the dataset's episodes of the training tasks, made once, on the device
        self.judge_check: Any = None  # a RealityCheck whose labelled episodes choose the judge's threshold after each round

    def restore(self, iteration: int) -> None:
        """After loading a checkpoint of ``iteration``: the rounds saved up to it, and the refined weights in use."""
        from safetensors.torch import load_file

        self.rounds = [load_file(path) for path in self._saved("round_*.safetensors", iteration)] if distributed.is_main() else []  # rank 0 trains on them
        self.world_model.use_refined(self.state)
        thresholds = self._saved("judge_*.json", iteration)
        if self.judge_check is not None and thresholds:
            apply_calibration(self.judge_check.imagined_env.judge, read_json(thresholds[-1]))

    def _saved(self, pattern: str, iteration: int) -> list[Path]:
        """This run's round files (NAME_<iteration>.EXT) up to ``iteration``, oldest first."""
        return [path for path in sorted(self.out.glob(pattern)) if int(path.stem.split("_")[1]) <= iteration]

    def save(self, folder: str | Path) -> Path:
        """The refined world model as a model folder (the built-in's: ``train-wm``'s layout; rl, eval-wm and the loop load it)."""
        return self.world_model.save_refined(folder, self.state)

    def __call__(self, policy: Any, iteration: int) -> dict[str, float]:
        began = time.perf_counter()
        metrics = self._learn(policy, iteration) if distributed.is_main() else {}
        if not distributed.broadcast_object("world_model/refine_loss" in metrics):  # a round without examples changes nothing
            return metrics | {"time/refine": time.perf_counter() - began}
        for module in self.modules.values():  # rank 0's refined weights: every rank imagines in the same world model
            distributed.broadcast_parameters(module)
        self.world_model.use_refined(self.state)
        if self.judge_check is not None:
            metrics |= self._recalibrate(iteration)
        return metrics | {"time/refine": time.perf_counter() - began}

    def _learn(self, policy: Any, iteration: int) -> dict[str, float]:
        """Steps 1 to 3 of the round (the module's docstring): the real rollouts, their examples, the world model's steps."""
        from safetensors.torch import save_file

        from worldloop.utils.io import atomic_path

        began = time.perf_counter()
        episodes, success = self._real_rollouts(policy, iteration)
        reality = {"world_model/refine_real_success": success,
                   "world_model/refine_real_episodes": float(iteration // self.rl.refine.every * self.real_env.num_envs),  # spent so far
                   "time/refine_collect": time.perf_counter() - began}  # fmt: skip
        # an episode that succeeds within one chunk gives no clip; a round can have none
        episodes = [e for e in episodes if len(e.actions) > self.world_model.chunk_size]
        if not episodes:
            return reality
        examples = self.world_model.refine_examples(episodes, self.state, seed=self.seed + iteration)
        with atomic_path(self.out / f"round_{iteration:06d}.safetensors") as tmp:
            save_file({k: v.contiguous() for k, v in examples.items()}, str(tmp))
        self.rounds.append(examples)
        if self.known is None:
            known_episodes, self.dataset_episodes = list(self.dataset_episodes), ()
            if known_episodes:
                self.known = self._on_device([self.world_model.refine_examples(known_episodes, self.state, seed=self.seed)])

        generator = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + iteration)
        before = self._loss_on(examples, iteration)
        mean_loss = self._train(generator)
        after = self._loss_on(examples, iteration)
        return reality | {
            "world_model/refine_clips": float(sum(_count(r) for r in self.rounds)),
            "world_model/refine_loss": mean_loss,
            "world_model/refine_loss_new_before": before,
            "world_model/refine_loss_new_after": after,
        }

    def _recalibrate(self, iteration: int) -> dict[str, float]:
        """The judge's threshold chosen again on the calibration's episodes replayed in the refined world model."""
        began = time.perf_counter()
        rl = self.rl
        result = self.judge_check.recalibrate_judge(self.calibrate.threshold_tolerance_se, self.calibrate.threshold_significance_se,
                                                    self.calibrate.threshold_per_task)  # fmt: skip
        result["seconds"] = time.perf_counter() - began  # one replay of the calibration's episodes
        if distributed.is_main():
            atomic_write_json(self.out / f"judge_{iteration:06d}.json", result)  # a resumed run takes the threshold back from here
        kappa = result["replayed_after"]["kappa"]  # None where the episodes all succeeded or all failed
        return ({"world_model/judge_threshold": result["threshold"], "time/refine_judge": result["seconds"]}
                | ({} if kappa is None else {"world_model/judge_replay_kappa": kappa}))  # fmt: skip

    def _real_rollouts(self, policy: Any, iteration: int) -> tuple[list[RealEpisode], float]:
        per_task = self.rl.refine.episodes_per_task
        first_episode = (iteration // self.rl.refine.every - 1) * per_task  # round r's episodes follow round r - 1's
        task_ids = [task for task in self.tasks for _ in range(per_task)]
        seeds = [refine_seed(position, first_episode + j, self.seed_offset) for position in range(len(self.tasks)) for j in range(per_task)]
        policy.eval()
        first = self.real_env.reset(task_ids, seeds)
        rollout = collect(policy, self.real_env, first, temperature=self.rl.train_temperature, keep_frames=True)
        return rollout_episodes(first, rollout), float(rollout.success_once.float().mean())

    def _train(self, generator: torch.Generator) -> float:
        """``rl.refine.steps`` steps of the world model, each on a batch drawn from the kept examples: half from the
        policy's rollouts, half from what it knew. Returns their mean loss."""
        pools = [self._on_device(self.rounds)] + ([self.known] if self.known is not None else [])
        batch = self.batch_size
        sizes = [batch - batch // 2, batch // 2] if len(pools) == 2 else [batch]
        losses = []
        for _ in range(self.rl.refine.steps):
            picks = [torch.randint(_count(pool), (size,), generator=generator, device=self.device) for pool, size in zip(pools, sizes)]
            rows = {key: torch.cat([pool[key][index] for pool, index in zip(pools, picks)]) for key in pools[0]}
            losses.append(self.world_model.refine_step(rows, self.state, generator))
        return float(np.mean(losses)) if losses else float("nan")

    def _on_device(self, examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """``examples`` concatenated, on the world model's device."""
        return {key: torch.cat([e[key] for e in examples]).to(self.device) for key in examples[0]}

    def _loss_on(self, examples: dict[str, torch.Tensor], iteration: int, count: int = 256) -> float:
        """The loss of the world model in use on (up to ``count`` of) ``examples``, on noise fixed by ``iteration``: before and after a round compare."""
        generator = torch.Generator(device=self.device).manual_seed(iteration)
        return self.world_model.refine_loss(self._on_device([{k: v[:count] for k, v in examples.items()}]), self.state, generator)


def _count(examples: dict[str, torch.Tensor]) -> int:
    """How many examples ``examples`` holds (the length of its tensors)."""
    return len(next(iter(examples.values())))


def world_model_refiner(config: Any, world_model: Any, dataset: Any, tasks: list[str], out: str | Path, calibration: Any = None) -> WorldModelRefiner:
    """rl.refine.every: the world model learns from the policy's real rollouts on ``tasks`` during RL, and keeps
    the dataset's training episodes of those tasks (the world model's split) in view. ``config``: the run's Config.
    ``calibration`` (rl.judge_threshold=replay: the RealityCheck that chose the judge's threshold) chooses it again
    in each refined world model, from its labelled episodes. Under torchrun rank 0 alone opens the refinement's
    simulator and reads the dataset's episodes."""
    train_indices, _ = split_episodes(dataset, seed=config.seed)
    wanted = {instruction(task): MAX_DATASET_EPISODES_PER_TASK for task in tasks}
    task_of, chosen = dataset.task_indices, []
    for index in train_indices:
        text = dataset.tasks[task_of[index]]
        if wanted.get(text, 0) > 0:
            wanted[text] -= 1
            chosen.append(index)
    main = distributed.is_main()  # the one that collects and learns
    real_env = make_env(config, len(tasks) * config.rl.refine.episodes_per_task, tasks=tasks) if main else None
    refiner = WorldModelRefiner(world_model, real_env, tasks, dataset.episodes(chosen) if main else (), config.rl, config.world_model, out,
                                seed=config.seed, calibrate=config.reward.calibrate)  # fmt: skip
    if calibration is not None and calibration.labelled is not None:
        refiner.judge_check = calibration
    elif calibration is not None and main:
        print("rl: the judge's calibration episodes were not saved (a run begun before they were): its threshold stays as "
              "calibrated through the refinement rounds")  # fmt: skip
    return refiner

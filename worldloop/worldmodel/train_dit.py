"""Training the world model's DiT, top to bottom (``train-wm``).

1. data: every clip of every training episode is encoded once with the frozen VAE (cached on disk next to the
   run, :func:`cached_clips`), and the actions are normalised by their statistics;
2. setup: a new DiT (or ``init``'s), its EMA, AdamW and the learning-rate schedule over the budget, resumed from
   the run's latest checkpoint;
3. the loop: a batch of clips, some of whose memory latents the model samples itself (self-forcing), the
   rectified-flow loss (:func:`worldloop.worldmodel.flow_matching.flow_matching_loss`), an AdamW step, the EMA;
4. the end: the last checkpoint, the EMA model saved as a model folder, results.json.

Under torchrun it is data-parallel (:mod:`worldloop.utils.distributed`): every rank draws the same global batch and
trains on its rows, the gradients are averaged, rank 0 writes checkpoints, TensorBoard and the model.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from worldloop.utils import distributed
from worldloop.utils.checkpoint import resume, save_checkpoint
from worldloop.utils.io import atomic_path, atomic_write_json, read_json
from worldloop.worldmodel import vae as vae_lib
from worldloop.worldmodel.clips import OUTCOME_LEAD_CHUNKS, STATIC_FRACTION, encode_clips
from worldloop.worldmodel.configuration import WorldModelConfig
from worldloop.worldmodel.flow_matching import flow_matching_loss
from worldloop.worldmodel.rollout import WorldModel, autocast, sample_future
from worldloop.worldmodel.training import (
    GRAD_CLIP,
    LOG_EVERY,
    WEIGHT_DECAY,
    EpisodeLike,
    TrainingBudget,
    ema_step,
    episode_actions,
    episode_frames,
    make_optimizer,
    progress,
)

SELF_FORCING_AFTER = 0.3
"""Share of the training budget (steps, or time under world_model.time_limit_s) before self-forcing starts
(world_model.self_forcing): until then the model's own predictions of a memory are noise."""


def train_world_model(
    config: WorldModelConfig,
    train_episodes: Sequence[EpisodeLike],
    vae,
    out: str | Path,
    device: torch.device,
    seed: int = 0,
    cache_key: dict[str, Any] | None = None,
    clips: dict[str, torch.Tensor] | None = None,
    init: WorldModel | None = None,
    steps_before: int | None = 0,
    log_every: int = LOG_EVERY,
    self_forcing_after: float = SELF_FORCING_AFTER,
) -> WorldModel:
    """Train the action-conditioned DiT on ``train_episodes``; the EMA model is saved to ``out``
    (config.json, model.safetensors, vae/) and returned. ``clips`` ({"latents" (M, C, 4, h, w),
    "actions" (M, 13, A) raw, optionally "previous" (M,) for self-forcing}) replaces the episodes with
    ready-made latent clips. ``init`` starts from a trained world model's weights and action
    statistics (fine-tuning, e.g. PACE's WM Evo, or a DiT grown over several runs); ``steps_before``
    (its :func:`steps_trained`, None: unknown) lets results.json's ``steps_total`` count its steps too.
    ``self_forcing_after``: the share of the budget before self-forcing starts (0: from the first step, as
    `bench wm-train` measures it)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vae = vae.to(device).eval().requires_grad_(False)
    # 1. data
    clips, image_size, all_actions = training_clips(config, train_episodes, vae, out, device, seed, cache_key, clips)
    action_mean, action_std = action_statistics(all_actions, image_size, config, init)
    if config.self_forcing and "previous" not in clips:
        raise ValueError("world_model.self_forcing needs clips with 'previous' (the clip one chunk earlier); ready-made clips lack it")
    # 2. setup
    run = start_run(config, out, vae, clips, image_size, action_mean, action_std, init, device, seed)
    writer = distributed.summary_writer(str(out / "tb"))
    forcing = SelfForcing.plan(config, run.previous, self_forcing_after)
    forward = compiled(run.model.dit, config, device)
    # 3. the loop
    run.budget.started, run.first = time.time(), run.done
    train_steps(run, forcing, forward, vae, writer, log_every)
    # 4. the end
    return finish_run(run, forward, vae, writer, steps_before, log_every)


# ============================================================================================ 1. data


def training_clips(config: WorldModelConfig, episodes: Sequence[EpisodeLike], vae, out: Path, device: torch.device, seed: int,
                   cache_key: dict[str, Any] | None, clips: dict[str, torch.Tensor] | None) -> tuple[dict[str, torch.Tensor], int, np.ndarray]:  # fmt: skip
    """The clips to train on (``clips`` when given, else every clip of ``episodes``, encoded once and cached in ``out``),
    the size of the frames they show, and the raw actions (N, A) whose statistics normalise them."""
    if clips is not None:
        image_size = int(clips["latents"].shape[-1]) * vae_lib.spatial_factor(vae)
        return clips, image_size, clips["actions"][:, 5:].reshape(-1, clips["actions"].shape[-1]).numpy()
    if not episodes:
        raise ValueError("train-wm: no training episodes")
    image_size = int(episode_frames(episodes[0]).shape[1])
    all_actions = np.concatenate([episode_actions(e) for e in episodes])
    key = dict(cache_key or {}, image_size=image_size, episodes=len(episodes), chunk=config.chunk_size,
               stride=config.clip_stride, static=STATIC_FRACTION, outcome_lead=OUTCOME_LEAD_CHUNKS, seed=seed,
               vae_mean=list(vae.config.latents_mean)[:4])  # fmt: skip
    return cached_clips(vae, episodes, config, device, out, key, seed), image_size, all_actions


def cached_clips(vae, episodes: Sequence[EpisodeLike], config: WorldModelConfig, device: torch.device, cache_dir: Path, key: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """:func:`~worldloop.worldmodel.clips.encode_clips`, stored once in ``cache_dir/latents.safetensors`` and reused while
    ``key`` matches. Under torchrun rank 0 encodes and writes them; the other ranks read its file."""
    from safetensors.torch import load_file

    if distributed.is_main():
        clips = _cached_clips(vae, episodes, config, device, cache_dir, key, seed)
    distributed.barrier()
    return clips if distributed.is_main() else load_file(cache_dir / "latents.safetensors")


def _cached_clips(vae, episodes: Sequence[EpisodeLike], config: WorldModelConfig, device: torch.device, cache_dir: Path, key: dict[str, Any],
                  seed: int) -> dict[str, torch.Tensor]:  # fmt: skip
    from safetensors.torch import load_file, save_file

    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    file, meta = cache_dir / "latents.safetensors", cache_dir / "latents.json"
    if file.is_file() and meta.is_file() and read_json(meta).get("digest") == digest:
        clips = load_file(file)
        if "previous" in clips and "outcome" in clips:  # caches written before self-forcing or outcome clips lack them
            return clips
    clips = encode_clips(vae, episodes, config, device, seed)
    with atomic_path(file) as tmp:
        save_file({k: v.contiguous() for k, v in clips.items()}, str(tmp))
    atomic_write_json(meta, {"digest": digest, "key": key, "clips": len(clips["latents"])})
    return clips


def action_statistics(all_actions: np.ndarray, image_size: int, config: WorldModelConfig, init: WorldModel | None) -> tuple[np.ndarray, np.ndarray]:
    """The per-dimension mean and std that normalise the actions: those of ``all_actions`` (N, A), or, fine-tuning,
    ``init``'s (its DiT learned with them), whose frames, actions and input layer must be this run's."""
    action_dim = all_actions.shape[1]
    action_mean, action_std = all_actions.mean(0), np.maximum(all_actions.std(0), 1e-3)
    if init is None:
        return action_mean, action_std
    if (init.image_size, len(init.spec["action_mean"])) != (image_size, action_dim):
        raise ValueError(f"--init world model renders {init.image_size}px with {len(init.spec['action_mean'])}-d actions; this data has {image_size}px, {action_dim}-d")
    if bool(init.spec["context_channels"]) != config.context_channels:
        raise ValueError(f"--init world model has context_channels={bool(init.spec['context_channels'])}; "
                         f"world_model.context_channels={config.context_channels} builds a DiT whose input layer differs: set it alike")
    return np.asarray(init.spec["action_mean"]), np.asarray(init.spec["action_std"])


# =========================================================================================== 2. setup


@dataclass
class Run:
    """One train-wm run: what the loop trains, what a checkpoint keeps, the clips it draws from, how far it is."""

    config: WorldModelConfig
    out: Path
    model: WorldModel  # its DiT trains
    ema: torch.nn.Module  # the moving average of the DiT's weights: what gets saved
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    budget: TrainingBudget
    generator: torch.Generator  # every draw of the loop: clips, noise, self-forced samples
    shape: dict[str, Any]  # what a checkpoint must match for this run to go on from it
    latents: torch.Tensor  # (M, C, 4, h, w) on the device: every clip's
    actions: torch.Tensor  # (M, 13, A) normalised, once for every batch and self-forced sample
    previous: torch.Tensor | None  # (M,) the clip one chunk earlier (-1: none); None: the clips do not say
    weights: torch.Tensor | None = None  # (M,) how often each clip is drawn (world_model.outcome_weight); None: alike
    outcome: torch.Tensor | None = None  # (M,) bool: clips near an episode's first success (clips.outcome_clips); None: the clips do not say
    done: int = 0  # optimizer steps taken, in this run and those it resumed
    first: int = 0  # the step this run started at
    loss: torch.Tensor | None = None  # the last step's
    loss_value: float = float("nan")  # the last logged loss, averaged over the ranks
    self_forced: int = 0  # clips of this run whose memory the model sampled

    @property
    def modules(self) -> dict[str, torch.nn.Module]:
        return {"dit": self.model.dit, "ema": self.ema}

    @property
    def stateful(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, "scheduler": self.scheduler, "generator": self.generator}

    def write_checkpoint(self) -> None:
        save_checkpoint(self.out, self.done, self.modules, self.stateful, extra={"shape": self.shape, "seconds": self.budget.seconds()})

    def same_shape(self, checkpoint: Path, saved: dict) -> None:
        """Refuses a checkpoint of a run with other frames, actions, latents or DiT."""
        saved_shape = saved.get("shape") or {}
        if saved_shape != self.shape:
            differ = sorted(key for key in saved_shape.keys() | self.shape.keys() if saved_shape.get(key) != self.shape.get(key))
            raise ValueError(f"checkpoint {checkpoint} cannot resume this run: it differs in {differ} "
                             f"(checkpoint {saved_shape}, this run {self.shape}); train into a new --out or match the settings")


def start_run(config: WorldModelConfig, out: Path, vae, clips: dict[str, torch.Tensor], image_size: int, action_mean: np.ndarray,
              action_std: np.ndarray, init: WorldModel | None, device: torch.device, seed: int) -> Run:  # fmt: skip
    """A new world model (with ``init``'s DiT weights when given), its EMA, AdamW and the schedule over the budget,
    and the clips on the device; resumed from ``out``'s latest checkpoint when it has one, the same on every rank."""
    latents, actions = clips["latents"].to(device), clips["actions"].to(device)
    torch.manual_seed(seed)
    action_dim = len(action_mean)
    model = WorldModel.build(config, vae, image_size, action_dim, action_mean.tolist(), action_std.tolist(), device)
    if init is not None:
        load_init_weights(model.dit, init.dit)
    dit = model.dit.train()
    ema = copy.deepcopy(dit).eval().requires_grad_(False)
    optimizer = make_optimizer(dit.parameters(), config.lr, WEIGHT_DECAY, device)
    budget = TrainingBudget(config.steps, config.time_limit_s)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, budget.lr_factor)
    generator = torch.Generator(device=device).manual_seed(seed)
    shape = dict(image_size=image_size, action_dim=action_dim, latent_shape=list(latents.shape[1:]), size=config.size)
    if config.context_channels:  # only when set, so that checkpoints from before the option still resume
        shape["context_channels"] = True
    mean = torch.as_tensor(action_mean, dtype=torch.float32, device=device)
    std = torch.as_tensor(action_std, dtype=torch.float32, device=device)
    run = Run(config, out, model, ema, optimizer, scheduler, budget, generator, shape, latents, (actions - mean) / std,
              clips["previous"].to(device) if "previous" in clips else None)  # fmt: skip
    run.outcome = clips["outcome"].to(device).bool() if "outcome" in clips else None
    run.weights = clip_weights(run.outcome, config.outcome_weight)
    resumed = resume(out, "train-wm", run.modules, run.stateful, check=run.same_shape)
    if resumed is not None:
        _, run.done, extra = resumed
        budget.seconds_done = extra.get("seconds", 0.0)
    for module in run.modules.values():
        distributed.broadcast_parameters(module)
    return run


def clip_weights(outcome: torch.Tensor | None, outcome_weight: float) -> torch.Tensor | None:
    """Each clip's drawing weight from its ``outcome`` flag (M,): ``outcome_weight`` for an outcome clip, 1 for any
    other; None (drawn uniformly, as before the option) when the weight is 1 or no clip is an outcome clip."""
    if outcome_weight == 1.0 or outcome is None or not bool(outcome.any()):
        return None
    return torch.where(outcome, outcome_weight, 1.0).float()


def outcome_draw_share(run: Run) -> float:
    """The expected share of drawn clips that are outcome clips (their share of the clips when drawn uniformly)."""
    if run.outcome is None:
        return 0.0
    weights = run.weights if run.weights is not None else torch.ones(len(run.outcome), device=run.outcome.device)
    return float(weights[run.outcome].sum() / weights.sum())


def load_init_weights(dit, init_dit) -> None:
    """``init_dit``'s weights into the new ``dit``; a missing or unexpected weight is an error."""
    missing, unexpected = dit.load_state_dict({k: v.float() for k, v in init_dit.state_dict().items()}, strict=False)
    if unexpected or missing:
        raise ValueError(f"--init world model's DiT does not match this one: "
                         f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")  # fmt: skip


@dataclass
class SelfForcing:
    """Which clips of each batch get a memory latent the model sampled itself (world_model.self_forcing), and from when."""

    per_step: int  # how many: a fixed count, so that the compiled graphs see fixed shapes
    rows: torch.Tensor  # where they sit in the global batch: each rank its share (:func:`self_forced_rows`)
    candidates: torch.Tensor | None  # the clips that have a predecessor one chunk earlier, drawn uniformly
    after: float  # the share of the budget before it starts

    @staticmethod
    def plan(config: WorldModelConfig, previous: torch.Tensor | None, after: float) -> SelfForcing:
        per_step = round(config.self_forcing * config.batch_size)
        candidates = torch.nonzero(previous >= 0).flatten() if previous is not None else None
        if per_step and not len(candidates):
            raise ValueError("world_model.self_forcing: no training clip has a predecessor one chunk earlier (episodes too short?)")
        return SelfForcing(per_step, self_forced_rows(per_step, config.batch_size), candidates, after)


def self_forced_rows(count: int, batch: int) -> torch.Tensor:
    """The rows of a global batch of ``batch`` that hold the ``count`` self-forced clips: the first rows of each rank's
    share, as evenly as they split (in one process, the first ``count`` rows)."""
    ranks, share = distributed.world_size(), batch // distributed.world_size()
    per_rank = [count // ranks + (r < count % ranks) for r in range(ranks)]
    return torch.tensor([r * share + i for r in range(ranks) for i in range(per_rank[r])], dtype=torch.long)


def compiled(dit, config: WorldModelConfig, device: torch.device):
    """The DiT's forward for training: ``torch.compile``d on CUDA when ``config.compile`` (the small DiT's eager step
    is bound by kernel launches, not arithmetic), else the module itself. Compiled with fixed shapes: one graph for
    the training batch and one for the self-forced samples' batch."""
    if not (config.compile and device.type == "cuda"):
        return dit
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True  # a graph that fails to compile runs eagerly instead of ending the run
    return torch.compile(dit, dynamic=False)


# ========================================================================================= 3. the loop


def train_steps(run: Run, forcing: SelfForcing, forward, vae, writer, log_every: int) -> None:
    """The optimizer steps from ``run.done`` to the budget's end: batch, loss, AdamW step, EMA; the losses to
    TensorBoard every ``log_every`` steps, sample videos and a checkpoint every ``checkpoint_every``."""
    config, budget, main = run.config, run.budget, distributed.is_main()
    mine = distributed.rows(config.batch_size, "world_model.batch_size")
    dit, optimizer, scheduler = run.model.dit, run.optimizer, run.scheduler
    bar = progress(range(run.done, config.steps), initial=run.done, total=config.steps, desc="train-wm", disable=not main)
    for step in bar:
        if budget.out_of_time():  # checked first: a resumed run whose time is spent takes no step
            break
        x0, actions = draw_batch(run, forcing, forward, step, mine)
        loss = flow_matching_loss(forward, x0, actions, config, run.generator, rows=mine)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        distributed.average_gradients(dit.parameters())
        grad_norm = torch.nn.utils.clip_grad_norm_(dit.parameters(), GRAD_CLIP)
        optimizer.step()
        scheduler.step()
        ema_step(run.ema, dit, min(config.ema_decay, (1 + step) / (10 + step)))
        done = run.done = step + 1
        run.loss = loss
        if done % log_every == 0 or done == config.steps:  # reading the loss waits for the GPU: only here
            run.loss_value = distributed.all_mean(float(loss.detach()))
            writer.add_scalar("wm/loss", run.loss_value, done)
            writer.add_scalar("wm/grad_norm", float(grad_norm), done)
            writer.add_scalar("wm/lr", scheduler.get_last_lr()[0], done)
            writer.add_scalar("wm/self_forced_clips", run.self_forced, done)
            bar.set_postfix(loss=f"{run.loss_value:.4f}")
        if main and (done % config.checkpoint_every == 0 or done == config.steps):  # sample videos at every checkpoint
            _log_samples(writer, run.ema, vae, run.latents[:4], run.actions[:4], run.model.sigmas, done)
        if done % config.checkpoint_every == 0 and done < config.steps:
            run.write_checkpoint()


def draw_batch(run: Run, forcing: SelfForcing, forward, step: int, mine: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch of clips (B, C, 4, h, w) and their normalised actions (B, 13, A), drawn uniformly
    (or by ``run.weights``);
    once self-forcing has started, its rows are clips that have a predecessor, and this rank's of them hold the memory
    latent the model samples from the real context one chunk earlier: what it will see from a rollout's second chunk on."""
    generator, batch, device = run.generator, run.config.batch_size, run.latents.device
    if run.weights is None:
        index = torch.randint(len(run.latents), (batch,), generator=generator, device=device)
    else:  # outcome clips world_model.outcome_weight times as often
        index = torch.multinomial(run.weights, batch, replacement=True, generator=generator)
    forced = forcing.per_step and run.budget.fraction(step) >= forcing.after
    if forced:
        pick = torch.randint(len(forcing.candidates), (forcing.per_step,), generator=generator, device=device)
        index = index.clone()
        index[forcing.rows] = forcing.candidates[pick]
    x0 = run.latents[index]  # this rank computes on its rows ``mine``
    actions = run.actions[index]
    if forced:
        here = forcing.rows[(forcing.rows >= mine.start) & (forcing.rows < mine.stop)]
        if len(here):
            x0[here, :, 1] = self_forced_memory(forward, run.latents, run.actions, run.previous, index[here], run.model.sigmas, generator)
        run.self_forced += forcing.per_step
    return x0, actions


def self_forced_memory(
    dit, latents: torch.Tensor, actions: torch.Tensor, previous: torch.Tensor, clips: torch.Tensor, sigmas: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """The memory latent a rollout's second chunk would hold at each of ``clips`` (indices; each has a predecessor):
    the model's own last latent sampled from the real context of the clip one chunk earlier, driven by that clip's
    recorded (normalised) ``actions``. Returns (n, C, h, w)."""
    earlier = previous[clips]
    real = latents[earlier]  # (n, C, 4, h, w): its reference and memory frames, and the shape of its future
    noise = torch.randn(real[:, :, 2:].shape, device=latents.device, generator=generator)
    return sample_future(dit, real[:, :, :2], actions[earlier], noise, sigmas)[:, :, -1]


@torch.no_grad()
def _log_samples(writer, dit, vae, latents: torch.Tensor, actions: torch.Tensor, sigmas: torch.Tensor, step: int) -> None:
    """TensorBoard: real | generated 13-frame clips (context + 8 sampled frames) as one image strip each."""
    device = latents.device
    noise = torch.randn(latents[:, :, 2:].shape, device=device, generator=torch.Generator(device=device).manual_seed(0))
    generated = sample_future(dit, latents[:, :, :2], actions, noise, sigmas)
    with autocast(device):
        real = vae_lib.decode(vae, latents)  # (b, 13, H, W, 3)
        fake = vae_lib.decode(vae, torch.cat([latents[:, :, :2], generated], dim=2))
    real_rows = torch.cat(list(real.unbind(1)), dim=2)  # (b, H, 13 W, 3)
    fake_rows = torch.cat(list(fake.unbind(1)), dim=2)
    image = torch.cat([torch.cat([r, f], dim=0) for r, f in zip(real_rows, fake_rows)], dim=0)  # real above generated
    writer.add_image("wm/samples_real_over_generated", image.cpu(), step, dataformats="HWC")


# ========================================================================================== 4. the end


def finish_run(run: Run, forward, vae, writer, steps_before: int | None, log_every: int) -> WorldModel:
    """The last checkpoint, the EMA model saved to ``run.out`` with results.json (on rank 0), and the EMA model returned."""
    config, done, main = run.config, run.done, distributed.is_main()
    if done > run.first and done % log_every and done != config.steps:  # the last step's loss, when it was not logged
        run.loss_value = distributed.all_mean(float(run.loss.detach()))
    loop_seconds = time.time() - run.budget.started
    if main and done % config.checkpoint_every and done < config.steps:  # stopped by the time limit: samples of the end state
        _log_samples(writer, run.ema, vae, run.latents[:4], run.actions[:4], run.model.sigmas, done)
    writer.close()
    run.write_checkpoint()
    model, ema, was_compiled = run.model, run.ema, forward is not run.model.dit
    model.dit = ema
    if not main:  # rank 0 writes the model and results.json
        distributed.barrier()
        return model
    model.save_pretrained(run.out, dit=ema)
    total = {} if steps_before is None else {"steps_total": steps_before + done}  # "steps" are this run's
    atomic_write_json(run.out / "results.json", {"steps": done, **total, "final_loss": run.loss_value, "clips": len(run.latents),
                                                 "self_forced_clips_this_run": run.self_forced, "outcome_clips": 0 if run.outcome is None else int(run.outcome.sum()),
                                                 "outcome_draw_share": outcome_draw_share(run),
                                                 "train_seconds_this_run": time.time() - run.budget.started, "batch_size": config.batch_size,
                                                 "compiled": was_compiled, "processes": distributed.world_size(),
                                                 "clips_per_s": (done - run.first) * config.batch_size / loop_seconds if loop_seconds > 0 else None,
                                                 "parameters_millions": sum(p.numel() for p in ema.parameters()) / 1e6})  # fmt: skip
    distributed.barrier()
    return model


def steps_trained(folder: str | Path) -> int | None:
    """Optimizer steps the world model in ``folder`` has taken in all its training runs (results.json's
    ``steps_total``, or ``steps`` where it has no other); None where its results.json is absent or says neither."""
    path = Path(folder) / "results.json"
    if not path.is_file():
        return None
    results = read_json(path)  # a corrupt file is named in its error
    steps = results.get("steps_total", results.get("steps"))
    return None if steps is None else int(steps)

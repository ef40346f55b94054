"""The world model as a batched simulator: ``reset(first_frames, memory_frames)``, ``step(actions)``.

State per environment lives on the device, in latent space: the context ``[reference, memory]``
(2 latent frames), the 4 actions that produced the memory frames, one noise generator, and the
causal decoder cache. One ``step`` runs the 5-step flow-matching Euler sampler for every
environment in one batched DiT forward per step, decodes only the 8 new frames, and makes the last
generated latent the next memory (no decode / re-encode of the context).

A model folder holds ``config.json`` (kind ``world_model``: sizes, image size, action
normalisation), ``model.safetensors`` (the DiT's EMA weights) and ``vae/`` (diffusers format).

The ``refine_*`` methods fine-tune the DiT on new real episodes during RL (rl.refine.every: the refinement
methods of :class:`worldloop.worldmodel.protocol.WorldModelLike`), with train-wm's loss.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors.torch import save_file

from worldloop.utils.device import autocast, resolve_device
from worldloop.utils.io import atomic_dir, atomic_path, atomic_write_json
from worldloop.utils.pretrained import load_weights, read_model_config
from worldloop.worldmodel import vae as vae_lib
from worldloop.worldmodel.clips import encode_clips
from worldloop.worldmodel.configuration import WorldModelConfig
from worldloop.worldmodel.flow_matching import flow_matching_loss
from worldloop.worldmodel.modeling import ActionConditionedDiT
from worldloop.worldmodel.training import GRAD_CLIP, WEIGHT_DECAY, EpisodeLike, ema_step

KIND = "world_model"
RETIRED_SPEC: dict[str, Any] = {"memory_frames": 4, "reference_frame": True, "null_actions": False, "action_dropout": 0.0, "action_guidance": 1.0}
"""config.json keys of world models saved by earlier versions -> the only value this version builds: the ablations (1
memory frame, no reference frame) and action guidance (2026-12-03 action-guidance run: not a fix as trained) are gone."""
MEMORY = 4


def sampler_sigmas(steps: int, shift: float) -> torch.Tensor:
    """The noise levels of diffusers' FlowMatchEulerDiscreteScheduler: steps + 1 values from 1 down to 0."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    scheduler.set_timesteps(steps)
    return scheduler.sigmas.float().cpu()


@torch.no_grad()
def sample_future(
    dit: ActionConditionedDiT, context: torch.Tensor, actions: torch.Tensor, noise: torch.Tensor, sigmas: torch.Tensor,
    memory_sigma: float = 0.0,
) -> torch.Tensor:  # fmt: skip
    """Euler integration of the velocity field from ``noise`` (sigma 1) to clean future latents.

    context (N, C, 2, h, w) is re-imposed at every step at sigma 0, its memory slot at ``memory_sigma``
    when the caller has noised it; actions (N, 13, A) normalised; noise (N, C, k, h, w); sigmas
    (steps + 1,) decreasing to 0; one DiT call of N rows per step."""
    latents = noise
    batch, frames = noise.shape[0], context.shape[2] + noise.shape[2]
    for sigma, sigma_next in zip(sigmas[:-1].tolist(), sigmas[1:].tolist()):
        per_frame = torch.zeros(batch, frames, device=noise.device)
        per_frame[:, 1 : context.shape[2]] = memory_sigma
        per_frame[:, context.shape[2] :] = sigma
        with autocast(noise.device):
            velocity = dit(torch.cat([context, latents], dim=2), per_frame, actions)
        latents = latents + (sigma_next - sigma) * velocity[:, :, context.shape[2] :].float()
    return latents


@dataclass
class DiTRefinement:
    """What the built-in world model's refinement trains: an fp32 copy of its DiT that AdamW steps (the inference
    copy is bf16 on the GPU, too coarse for small steps), and the moving average of its weights that the model
    imagines with and saves, as train-wm samples from its EMA."""

    config: WorldModelConfig  # the clips as the model was trained on them (its chunk), the loss's time shift
    master: ActionConditionedDiT
    ema: ActionConditionedDiT
    optimizer: torch.optim.AdamW
    ema_decay: float  # per step

    @property
    def modules(self) -> dict[str, torch.nn.Module]:
        return {"world_model": self.master, "world_model_ema": self.ema}

    @property
    def stateful(self) -> dict[str, Any]:
        return {"world_model_optimizer": self.optimizer}


class WorldModel:
    """An action-conditioned video world model over N environments at once."""

    def __init__(self, dit: ActionConditionedDiT, vae, spec: dict[str, Any], device: str | torch.device = "auto"):
        self.device = resolve_device(device) if isinstance(device, str) else device
        self.dit = dit.to(self.device).eval()
        self.vae = vae.to(self.device).eval()
        self.spec = dict(spec)
        self.image_size = int(spec["image_size"])
        self.chunk_size = int(spec["chunk_size"])
        self.action_dim = int(spec["action_dim"])
        self.action_mean = torch.tensor(spec["action_mean"], dtype=torch.float32, device=self.device)
        self.action_std = torch.tensor(spec["action_std"], dtype=torch.float32, device=self.device)
        self.set_sampling(spec.get("sampling_steps", 5), spec.get("shift", 5.0), spec.get("decode", "full"), spec.get("memory_noise", 0.0))
        self.use_decoder(spec.get("decoder"))
        self.context: torch.Tensor | None = None  # (N, C, 2, h, w)
        self.context_actions: torch.Tensor | None = None  # (N, 5, A) raw
        self.generators: list[torch.Generator] = []
        self.resets = 0  # default noise seeds differ from one reset to the next

    # ------------------------------------------------------------------------------------ folders

    @classmethod
    def build(cls, config: WorldModelConfig, vae, image_size: int, action_dim: int, action_mean=None, action_std=None, device="auto") -> "WorldModel":
        """A new (randomly initialised) world model for frames of ``image_size`` and ``action_dim`` actions."""
        factor = vae_lib.spatial_factor(vae)
        if image_size % (2 * factor):
            raise ValueError(f"image_size {image_size} must be a multiple of {2 * factor} (VAE {factor}x, DiT patch 2)")
        dit = ActionConditionedDiT(config.size, int(vae.config.z_dim), action_dim, config.chunk_size, config.context_channels)
        spec = dict(
            kind=KIND, size=config.size, image_size=image_size, action_dim=action_dim, chunk_size=config.chunk_size,
            context_channels=config.context_channels, latent_channels=int(vae.config.z_dim),
            action_mean=list(action_mean) if action_mean is not None else [0.0] * action_dim,
            action_std=list(action_std) if action_std is not None else [1.0] * action_dim,
            sampling_steps=config.sampling_steps, shift=config.shift, decode=config.decode, memory_noise=config.memory_noise,
            decoder=config.decoder,
        )  # fmt: skip
        return cls(dit, vae, spec, device)

    @classmethod
    def from_pretrained(cls, folder: str | Path, device: str | torch.device = "auto", **sampling: Any) -> "WorldModel":
        """Load a folder written by :meth:`save_pretrained`; ``sampling`` may override
        ``sampling_steps``, ``shift``, ``decode``, ``decoder`` and ``memory_noise``."""
        folder = Path(folder)
        spec = read_model_config(folder, kind=KIND)
        vae = vae_lib.load_vae(folder / "vae")
        if int(vae.config.z_dim) != int(spec["latent_channels"]):
            raise ValueError(f"{folder}/vae has {vae.config.z_dim} latent channels, the DiT expects {spec['latent_channels']}")
        spec.setdefault("context_channels", False)  # folders from before the option
        for key, fixed in RETIRED_SPEC.items():  # written by earlier versions, where they were options
            if spec.setdefault(key, fixed) != fixed:
                raise ValueError(f"world model {folder}: config.json has {key}={spec[key]!r}; world_model.{key} was retired and "
                                 f"this version only builds {key}={fixed!r} (train the world model again)")
            spec.pop(key)
        dit = ActionConditionedDiT(spec["size"], int(spec["latent_channels"]), int(spec["action_dim"]), int(spec["chunk_size"]),
                                   bool(spec["context_channels"]))  # fmt: skip
        load_weights(folder, dit)
        spec.update({k: v for k, v in sampling.items() if v is not None})
        try:
            model = cls(dit, vae, spec, device)
        except ValueError as error:  # a sampling option this model cannot take: say which model
            raise ValueError(f"world model {folder}: {error}") from error
        return model.for_inference()

    def for_inference(self) -> "WorldModel":
        """bf16 DiT weights on GPU (the sampler keeps latents in fp32); unchanged on CPU. The VAE keeps
        fp32 weights under bf16 autocast: with bf16 weights its residual stream loses ~8 dB PSNR."""
        if self.device.type == "cuda":
            self.dit.to(torch.bfloat16)
        return self

    def save_pretrained(self, folder: str | Path, dit: ActionConditionedDiT | None = None) -> Path:
        """Write config.json, model.safetensors (``dit`` or this model's DiT) and vae/ into ``folder``,
        each atomically (the folder may also hold a training run's checkpoints and logs)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        module = dit if dit is not None else self.dit
        with atomic_dir(folder / "vae") as tmp:
            self.vae.save_pretrained(str(tmp), safe_serialization=True)
        with atomic_path(folder / "model.safetensors") as tmp:
            save_file({k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}, str(tmp))
        atomic_write_json(folder / "config.json", self.spec)
        return folder

    def set_sampling(self, steps: int, shift: float, decode: str, memory_noise: float = 0.0) -> None:
        if decode not in ("cached", "full"):
            raise ValueError(f"decode must be 'cached' or 'full', got {decode!r}")
        if not 0.0 <= memory_noise < 1.0:
            raise ValueError(f"memory_noise must be in [0, 1), got {memory_noise}")
        self.sampling_steps, self.shift, self.decode_mode, self.memory_noise = int(steps), float(shift), decode, float(memory_noise)
        self.sigmas = sampler_sigmas(self.sampling_steps, self.shift)
        self.spec.update(sampling_steps=self.sampling_steps, shift=self.shift, decode=decode, memory_noise=self.memory_noise)

    def use_decoder(self, folder: str | Path | None) -> None:
        """Decode imagined frames with the VAE in ``folder`` (a light decoder distilled from this model's VAE: its
        encoder and latent statistics must be this model's, which is checked), or with the model's own (None)."""
        decoding = self.vae
        if folder is not None:  # checked before anything changes: a refused folder leaves the decoder in use as it was
            decoding = vae_lib.load_vae(folder)
            vae_lib.check_same_encoding(decoding, self.vae, f"decoder {folder}")
        self.decoding_vae = decoding.to(self.device).eval()
        self.decoder = vae_lib.StreamingDecoder(self.decoding_vae)
        self.spec["decoder"] = None if folder is None else str(folder)

    # ------------------------------------------------------------------------------------ rollout

    def _check_frames(self, frames: torch.Tensor, what: str, leading: tuple[int, ...]) -> torch.Tensor:
        frames = torch.as_tensor(frames)
        expected = (*leading, self.image_size, self.image_size, 3)
        if frames.dtype != torch.uint8 or tuple(frames.shape) != expected:
            raise ValueError(f"{what} must be uint8 {expected} (this world model works at {self.image_size}x{self.image_size}), got {frames.dtype} {tuple(frames.shape)}")
        return frames.to(self.device)

    def normalise(self, actions: torch.Tensor) -> torch.Tensor:
        return (actions - self.action_mean) / self.action_std

    @torch.no_grad()
    def encode_context(self, sequence: torch.Tensor, first_frames: torch.Tensor | None) -> torch.Tensor:
        """(N, 5, H, W, 3) frames [pre, m1..m4] (+ the reference frames) -> context latents (N, C, 2, h, w)."""
        with autocast(self.device):
            latents = vae_lib.encode(self.vae, sequence)  # (N, C, 2, h, w)
            if first_frames is not None:
                reference = vae_lib.encode(self.vae, first_frames[:, None])
                latents = torch.cat([reference, latents[:, :, 1:]], dim=2)
        return latents.float()

    @torch.no_grad()
    def reset(
        self,
        first_frames: torch.Tensor,
        memory_frames: torch.Tensor | None = None,
        seeds: Sequence[int] | None = None,
        memory_actions: torch.Tensor | None = None,
    ) -> None:
        """Start N rollouts. first_frames (N, H, W, 3) uint8: the episodes' first frames (the fixed
        reference). memory_frames (N, 4, H, W, 3) uint8: the last 4 frames, the newest last (default:
        the first frame repeated). seeds: one noise seed per environment (default: k*N .. k*N+N-1
        at the k-th reset, so every episode gets new noise).
        memory_actions (N, 4, A): the actions that produced the memory frames (default zero)."""
        first = self._check_frames(first_frames, "first_frames", (len(first_frames),))
        num_envs = first.shape[0]
        memory = first[:, None].expand(-1, MEMORY, -1, -1, -1) if memory_frames is None else self._check_frames(memory_frames, "memory_frames", (num_envs, MEMORY))
        sequence = torch.cat([memory[:, :1], memory], dim=1)  # [pre, m1..m4]
        self.context = self.encode_context(sequence, first)
        self.context_actions = torch.zeros(num_envs, 5, self.action_dim, device=self.device)
        if memory_actions is not None:
            memory_actions = torch.as_tensor(memory_actions, dtype=torch.float32, device=self.device)
            if tuple(memory_actions.shape) != (num_envs, MEMORY, self.action_dim):
                raise ValueError(f"memory_actions must be ({num_envs}, {MEMORY}, {self.action_dim}), got {tuple(memory_actions.shape)}")
            self.context_actions[:, 1:] = memory_actions
        if seeds is None:  # fresh, reproducible noise streams for every reset
            seeds = [self.resets * num_envs + i for i in range(num_envs)]
        seeds = list(seeds)
        self.resets += 1
        if len(seeds) != num_envs:
            raise ValueError(f"reset got {num_envs} environments but {len(seeds)} seeds")
        self.generators = [torch.Generator(device=self.device).manual_seed(int(s)) for s in seeds]
        self.decoder.reset()
        if self.decode_mode == "cached":
            with autocast(self.device):
                self.decoder(self.context)  # prime the causal cache with the context; frames unused

    @torch.no_grad()
    def step(self, action_chunks: torch.Tensor) -> torch.Tensor:
        """action_chunks (N, 8, A) in raw units -> the next 8 frames (N, 8, H, W, 3) uint8 on the device."""
        if self.context is None:
            raise RuntimeError("call reset() before step()")
        num_envs = self.context.shape[0]
        actions = torch.as_tensor(action_chunks, dtype=torch.float32, device=self.device)
        if tuple(actions.shape) != (num_envs, self.chunk_size, self.action_dim):
            raise ValueError(f"action_chunks must be ({num_envs}, {self.chunk_size}, {self.action_dim}), got {tuple(actions.shape)}")
        all_actions = self.normalise(torch.cat([self.context_actions, actions], dim=1))  # (N, 13, A)
        channels, _, height, width = self.context.shape[1:]
        future = self.chunk_size // vae_lib.TEMPORAL_FACTOR  # new latent frames
        draws = (channels, future + (1 if self.memory_noise else 0), height, width)  # + the memory's noise
        noise = torch.stack([torch.randn(draws, generator=g, device=self.device) for g in self.generators])
        noise, memory_eps = noise[:, :, :future], noise[:, :, future:]
        context = self.context
        if self.memory_noise:  # the conditioning only: the clean memory stays in self.context
            memory = (1 - self.memory_noise) * context[:, :, 1:] + self.memory_noise * memory_eps
            context = torch.cat([context[:, :, :1], memory], dim=2)
        new = sample_future(self.dit, context, all_actions, noise, self.sigmas, self.memory_noise)  # (N, C, 2, h, w)
        with autocast(self.device):
            if self.decode_mode == "cached":
                frames = self.decoder(new)
            else:
                frames = vae_lib.decode(self.decoding_vae, torch.cat([self.context, new], dim=2))[:, -self.chunk_size :]
        # the next context: the reference stays, the last generated latent becomes the memory, with the actions that made it
        self.context_actions = torch.zeros_like(self.context_actions)
        self.context_actions[:, 1:] = actions[:, -MEMORY:]
        self.context = torch.cat([self.context[:, :, :1], new[:, :, -1:]], dim=2)
        return frames

    def select(self, index: torch.Tensor) -> None:
        """Keep only environments ``index`` (drops finished ones without a reset)."""
        index = torch.as_tensor(index, device=self.device)
        self.context, self.context_actions = self.context[index], self.context_actions[index]
        self.generators = [self.generators[i] for i in index.tolist()]
        self.decoder.select(index)

    # ------------------------------------------------------------------------------------ refinement

    def start_refinement(self, config: WorldModelConfig, lr: float, ema_decay: float) -> DiTRefinement:
        """An fp32 copy of the DiT, AdamW on it (``lr``, train-wm's weight decay, no schedule) and the moving average
        of its weights (``ema_decay`` per step); clips cut as ``config`` says (its clip stride), in this model's chunk."""
        master = copy.deepcopy(self.dit).float().train()
        ema = copy.deepcopy(master).eval().requires_grad_(False)
        optimizer = torch.optim.AdamW(master.parameters(), lr=lr, weight_decay=WEIGHT_DECAY, betas=(0.9, 0.99))
        return DiTRefinement(dataclasses.replace(config, chunk_size=self.chunk_size), master, ema, optimizer, ema_decay)

    def refine_examples(self, episodes: Sequence[EpisodeLike], state: DiTRefinement, seed: int) -> dict[str, torch.Tensor]:
        """Every clip of ``episodes``, as train-wm encodes a dataset's (``seed``: which static clips): ``latents``
        (M, C, 4, h, w) and the raw ``actions`` (M, 13, A)."""
        clips = encode_clips(self.vae, episodes, state.config, self.device, seed=seed, progress_bar=False)
        return {"latents": clips["latents"], "actions": clips["actions"]}

    def refine_step(self, batch: dict[str, torch.Tensor], state: DiTRefinement, generator: torch.Generator) -> float:
        """One AdamW step of the fp32 DiT's flow-matching loss on ``batch`` (its gradient clipped as train-wm clips
        it), then one step of the moving average; returns the loss."""
        loss = flow_matching_loss(state.master, batch["latents"], self.normalise(batch["actions"]), state.config, generator)
        state.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(state.master.parameters(), GRAD_CLIP)
        state.optimizer.step()
        ema_step(state.ema, state.master, state.ema_decay)
        return float(loss.detach())

    @torch.no_grad()
    def refine_loss(self, examples: dict[str, torch.Tensor], state: DiTRefinement, generator: torch.Generator) -> float:
        """The moving average's flow-matching loss on ``examples``: what the model imagines with."""
        return float(flow_matching_loss(state.ema, examples["latents"], self.normalise(examples["actions"]), state.config, generator))

    @torch.no_grad()
    def use_refined(self, state: DiTRefinement) -> None:
        """The moving average's weights into the DiT the model imagines with (in its own dtype)."""
        for target, source in zip(self.dit.parameters(), state.ema.parameters()):
            target.copy_(source)

    def save_refined(self, folder: str | Path, state: DiTRefinement) -> Path:
        """This model's folder with the moving average's fp32 weights."""
        return self.save_pretrained(folder, dit=state.ema)

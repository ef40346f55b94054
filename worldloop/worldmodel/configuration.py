"""Configuration of the world model: the video VAE and the action-conditioned DiT.

Architecture sizes are named presets (``size``): ``tiny`` (CPU tests, trains in minutes),
``small`` (one H200, Meta-World 64x64 or 128x128) and ``wan2.2-5b`` (the dimensions of
Wan2.2-TI2V-5B, for throughput benchmarks with random weights). The tables that spell the sizes
out live next to the code that builds the modules (:mod:`worldloop.worldmodel.vae`,
:mod:`worldloop.worldmodel.modeling`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

SIZES = ("tiny", "small", "wan2.2-5b")
Size = Literal["tiny", "small", "wan2.2-5b"]


@dataclass
class VAEConfig:
    """The video VAE (diffusers ``AutoencoderKLWan``): trained from scratch, or a local folder."""

    # Architecture: saved with a trained VAE, which is built as saved
    size: Size = "tiny"
    """Architecture of a VAE trained from scratch: 'tiny', 'small' or 'wan2.2-5b' (the Wan2.2 VAE, 48 channels, 16x)."""
    spatial_downsamples: int = 3
    """Spatial halvings of the encoder (the latent is 2^n times smaller per side): 3 = 8x (Wan2.1), 2 = 4x.
    Ignored by 'wan2.2-5b', which is always 16x."""
    decoder_base_dim: int | None = None
    """Channels of the decoder's first stage (diffusers' ``decoder_base_dim``; None: as the encoder's, or as vae.init's).
    With vae.init and a narrower value, train-vae distils a light decoder: vae.init's encoder and latent statistics are
    kept frozen, and the narrower decoder learns to decode its latents as vae.init's own decoder does (the Wan2.2 VAE's
    decodes at 256 channels; 64 costs about 1/16 of its convolution FLOPs). A world model decodes with it through
    ``world_model.decoder``."""
    # Where its weights come from, and training (`worldloop train-vae`)
    init: str | None = None
    """A local diffusers-format AutoencoderKLWan folder (an earlier train-vae's --out, or the Wan2.2 VAE) whose weights
    training starts from, for `steps` more (its architecture replaces size and spatial_downsamples): a VAE grows over
    several short GPU runs, and its latent statistics are measured again after training. With vae.steps=0 it is
    taken as it is, its statistics too."""
    steps: int = 300
    """Optimizer steps of `worldloop train-vae`; 0 (with vae.init): no training."""
    batch_size: int = 8
    """Clips per optimizer step."""
    lr: float = 3e-4
    """AdamW learning rate (cosine decay to 10% after a 5% warm-up)."""
    checkpoint_every: int = 200
    """Steps between atomic training checkpoints (resume continues from the newest)."""
    time_limit_s: float = 0.0
    """Training seconds (summed over resumed runs) after which training stops even before `steps`; the
    learning-rate schedule then spans this time (0 = no limit: the schedule spans `steps`)."""

    def validate(self) -> None:
        if self.size not in SIZES:
            raise ValueError(f"size must be one of {SIZES}, got {self.size!r}")
        if self.decoder_base_dim is not None and self.decoder_base_dim < 1:
            raise ValueError(f"decoder_base_dim must be >= 1 (or None: the encoder's), got {self.decoder_base_dim}")
        if self.spatial_downsamples not in (2, 3):
            raise ValueError(f"spatial_downsamples must be 2 or 3, got {self.spatial_downsamples}")
        for name in ("batch_size", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.steps < 1 and not (self.steps == 0 and self.init):
            raise ValueError(f"steps must be >= 1, or 0 with init (a VAE taken as it is), got {self.steps} with init {self.init}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.time_limit_s < 0:
            raise ValueError(f"time_limit_s must be >= 0 (0: no limit), got {self.time_limit_s}")


@dataclass
class WorldModelConfig:
    """The action-conditioned DiT (diffusers ``WanTransformer3DModel``), its training, sampling and evaluation.

    The sampling options (sampling_steps, shift, decode, decoder, memory_noise) are saved with a trained model. The
    verbs that load one (eval-wm, train-reward, calibrate-reward, rl) sample as saved, except for the options
    named on their command line."""

    # Architecture: saved with a trained model, which is built as saved
    size: Size = "tiny"
    """DiT dimensions: 'tiny', 'small' or 'wan2.2-5b' (dim 3072, 30 layers, 24 heads, ffn 14336)."""
    chunk_size: int = 8
    """Actions per chunk = new frames per `step` (a multiple of the VAE's 4x temporal compression)."""
    context_channels: bool = False
    """Also concatenate the reference and memory latents to every latent frame's input channels (Wan's
    image-to-video conditioning): each future patch sees those frames' same patch directly. Against objects
    fading in long rollouts (docs/experiments/2026-12-01-fading-objects.md). Saved with the model; False: the slot layout only."""
    # Sampling: saved with a trained model; a verb that loads one takes them from its command line only
    shift: float = 5.0
    """Flow-matching time shift: sigma' = shift*sigma / (1 + (shift-1)*sigma), for training noise levels and sampling."""
    sampling_steps: int = 5
    """Euler steps of the flow-matching sampler per chunk."""
    decode: Literal["cached", "full"] = "full"
    """How new frames are decoded: 'full' decodes [context + new] latents (13 frames, the length a VAE
    trained here learned) and keeps the new frames; 'cached' decodes only the new latents with the causal
    decoder cache kept from the previous chunk, half the decode, exactly one long decode of the whole
    rollout. A VAE trained on 13-frame clips drifts in such a long decode: objects fade within three
    chunks (docs/experiments/2026-12-01-context-channels.md). 'cached' is for a VAE that learned long videos (Wan2.2's
    pipelines decode whole videos this way)."""
    decoder: str | None = None
    """Sampling: a VAE folder whose decoder decodes the imagined frames instead of the world model's own (a light
    decoder distilled from it: `worldloop train-vae --dataset D --out LIGHT vae.init=WM/vae vae.decoder_base_dim=64`).
    Its encoder and latent statistics must be the world model's, which is checked. None: the world model's own VAE."""
    memory_noise: float = 0.0
    """Sampling: noise level sigma put on the memory latent at every rollout step, the model told so by its
    per-token timestep (trained for: worldloop.worldmodel.flow_matching.CONTEXT_NOISE): it then trusts its own last frames less. 0 = clean."""
    # Training (`worldloop train-wm`)
    self_forcing: float = 0.0
    """Fraction of training clips whose memory latent is the model's own prediction of it, sampled
    (without gradient) from the clip one chunk earlier, as in a rollout: the model learns to continue
    from its own frames, not only from real ones, against drift that compounds chunk by chunk. It starts
    after worldloop.worldmodel.train_dit.SELF_FORCING_AFTER (30 %) of the budget. 0 disables."""
    clip_stride: int = 2
    """Frames between the start of consecutive training clips cut from one episode."""
    outcome_weight: float = 1.0
    """How many times as often as any other a training clip is drawn whose future frames come within
    worldloop.worldmodel.clips.OUTCOME_LEAD_CHUNKS chunks before its episode's first success (through that success):
    the moments a success judge reads, where open-loop replays part from the simulator's frames
    (docs/experiments/2026-12-07-judge-on-unseen-replays.md). 1: every clip alike; episodes without success labels
    have no such clips."""
    steps: int = 400
    """Optimizer steps of `worldloop train-wm`."""
    batch_size: int = 16
    """Clips per optimizer step."""
    lr: float = 3e-4
    """AdamW learning rate (cosine decay to 10% after a 5% warm-up)."""
    ema_decay: float = 0.999
    """Decay of the exponential moving average of the weights that is saved and sampled from."""
    compile: bool = False
    """torch.compile the DiT's training forward (CUDA only; fixed shapes). The small DiT's eager training step is bound
    by kernel launches (the GPU ~30 % busy at batch 64 on an H200); compiled, it fuses them. Costs a minute of
    compilation at the start of a run (docs/benchmarks.md, `bench wm-train`)."""
    checkpoint_every: int = 500
    """Steps between atomic training checkpoints (resume continues from the newest) and sample videos written to
    TensorBoard (and at the end)."""
    time_limit_s: float = 0.0
    """Training seconds (summed over resumed runs) after which training stops even before `steps`; the
    learning-rate schedule then spans this time (0 = no limit: the schedule spans `steps`)."""
    # Evaluation (`worldloop eval-wm`)
    eval_horizons: list[int] = field(default_factory=lambda: [8, 32, 64, 128])
    """Open-loop horizons (frames) of `worldloop eval-wm`; a horizon longer than every held-out episode is skipped."""
    eval_episodes: int = 16
    """Held-out episodes replayed by `worldloop eval-wm` (all of them if fewer)."""

    def validate(self) -> None:
        if self.size not in SIZES:
            raise ValueError(f"size must be one of {SIZES}, got {self.size!r}")
        if self.chunk_size < 4 or self.chunk_size % 4:
            raise ValueError(f"chunk_size must be a positive multiple of 4 (the VAE's temporal compression), got {self.chunk_size}")
        if not 0.0 <= self.self_forcing <= 1.0:
            raise ValueError(f"self_forcing must be in [0, 1], got {self.self_forcing}")
        if not 0.0 <= self.memory_noise < 1.0:
            raise ValueError(f"memory_noise must be in [0, 1), got {self.memory_noise}")
        for name in ("clip_stride", "steps", "batch_size", "sampling_steps", "checkpoint_every", "eval_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.outcome_weight < 1.0:
            raise ValueError(f"outcome_weight must be >= 1 (1: every clip drawn alike), got {self.outcome_weight}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")
        if self.lr <= 0 or self.shift <= 0:
            raise ValueError(f"lr and shift must be > 0, got {self.lr}, {self.shift}")
        if self.time_limit_s < 0:
            raise ValueError(f"time_limit_s must be >= 0 (0: no limit), got {self.time_limit_s}")
        if not self.eval_horizons or min(self.eval_horizons) < 1:
            raise ValueError(f"eval_horizons must be positive frame counts, got {self.eval_horizons}")

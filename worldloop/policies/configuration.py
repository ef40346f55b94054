"""Configuration of the policy verbs: supervised fine-tuning and evaluation (each policy's own configuration lives in its
folder: worldloop.policies.compact_vla.configuration, worldloop.policies.openvla_oft.configuration)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SFTConfig:
    """Supervised fine-tuning on demonstrations: token cross-entropy on action chunks."""

    steps: int = 300
    """Optimizer steps. Every quarter of them (and at the end) the held-out samples are scored and a checkpoint is
    written, a resume point: rerunning `worldloop sft` on the same OUT continues."""
    batch_size: int = 32
    """Samples (frame, instruction, action chunk) per step."""
    lr: float = 3e-4
    """Peak AdamW learning rate."""
    warmup_steps: int = 20
    """Linear warm-up steps before the cosine decay to zero."""
    augment_codec: float = 0.0
    """Share of training frames shown through the world model's VAE (`worldloop sft --world-model`), encoded and
    decoded, as every imagined frame is: the policy learns to choose the same actions from them as from the
    simulator's (0: off). The held-out codec_token_agreement measures it: 0.5 raised it from 0.70 to 0.79 for
    the 97M policy, 1.0 lowered it (0.66: never a sharp frame is as bad as never a reconstructed one)."""

    def validate(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError("steps >= 1, batch_size >= 1 and lr > 0 are required")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.augment_codec <= 1:
            raise ValueError(f"augment_codec is a share of frames, in [0, 1]; got {self.augment_codec}")


@dataclass
class EvalConfig:
    """Evaluation in the real simulator: success_once over fixed seeds."""

    episodes_per_task: int = 10
    """Episodes per task."""
    num_envs: int = 10
    """Environments stepped together (the policy acts on all of them in one batched forward)."""
    greedy: bool = False
    """Take the most likely action token instead of sampling one at temperature 1 (the eval verb's --temperature)."""
    videos_per_task: int = 1
    """Episodes per task written as captioned mp4 videos (the first ones of the task)."""

    def validate(self) -> None:
        if self.episodes_per_task < 1 or self.episodes_per_task > 1000 or self.num_envs < 1:
            raise ValueError("episodes_per_task must be in [1, 1000] and num_envs >= 1")
        if self.videos_per_task < 0:
            raise ValueError(f"videos_per_task must be >= 0, got {self.videos_per_task}")

"""The world-model protocol: what the imagined environment steps and, where RL refines it, what refinement trains.

It sits beside the policy's (:mod:`worldloop.policies.protocol`) and the judge's (:mod:`worldloop.rewards.protocol`).
The built-in :class:`worldloop.worldmodel.rollout.WorldModel` implements all of it; a world model of a user's own
registers in :data:`worldloop.utils.registry.WORLD_MODELS` and implements what it is used for.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import torch

if TYPE_CHECKING:
    from worldloop.worldmodel.configuration import WorldModelConfig
    from worldloop.worldmodel.training import EpisodeLike


class RefinementState(Protocol):
    """What a world model's refinement trains, made by :meth:`WorldModelLike.start_refinement` and handed back to its
    other ``refine_*`` methods. RL's checkpoints keep it (a resumed run loads it into a new one by these names, which
    share the checkpoint with the policy's: begin them with ``world_model``), and under torchrun rank 0 alone trains,
    after which its ``modules`` go to every rank."""

    modules: dict[str, torch.nn.Module]
    """The weights refinement trains, and any average of them, by name."""
    stateful: dict[str, Any]
    """The optimizer and whatever else has ``state_dict()`` and ``load_state_dict()``, by name."""


class WorldModelLike(Protocol):
    """A world model as worldloop uses it. The imagined environment needs ``image_size``, ``chunk_size``,
    ``action_dim``, ``reset`` and ``step``. The rest is needed only to refine the world model on the policy's real
    rollouts during RL (rl.refine.every > 0, in ``worldloop rl`` or the loop's RL stages:
    :class:`worldloop.rl.refine.WorldModelRefiner`, which trains the world model through these methods alone); a world
    model without them imagines as well. Refinement runs, per round:

        state = model.start_refinement(config, lr, ema_decay)     # once, before the first round
        examples = model.refine_examples(real_episodes, state, seed)  # kept, and drawn from in every later round
        before = model.refine_loss(examples, state, generator)
        for _ in range(rl.refine.steps):
            model.refine_step(batch, state, generator)            # batch: rows of the examples kept so far
        after = model.refine_loss(examples, state, generator)
        model.use_refined(state)                                  # imagination goes on in the refined model
        ...
        model.save_refined(folder, state)                         # at the end of the run: OUT/world_model

    The built-in :class:`worldloop.worldmodel.rollout.WorldModel` encodes the episodes' clips with its VAE and takes
    AdamW steps of its DiT's flow-matching loss, as ``train-wm`` does."""

    image_size: int
    chunk_size: int
    action_dim: int
    device: torch.device
    """Where refinement puts the examples it draws a batch from (refinement only)."""

    def reset(
        self, first_frames: torch.Tensor, memory_frames: torch.Tensor | None = None, seeds: Sequence[int] | None = None, memory_actions: torch.Tensor | None = None
    ) -> None: ...

    def step(self, action_chunks: torch.Tensor) -> torch.Tensor: ...

    def start_refinement(self, config: WorldModelConfig, lr: float, ema_decay: float) -> RefinementState:
        """The weights and the optimizer refinement will train (refinement only). ``config``: the run's
        ``world_model`` settings; ``lr``: the optimizer's learning rate; ``ema_decay``: the decay per step of a moving
        average of the weights to imagine with, for a model that keeps one (the built-in does)."""
        ...

    def refine_examples(self, episodes: Sequence[EpisodeLike], state: RefinementState, seed: int) -> dict[str, torch.Tensor]:
        """The training examples of real ``episodes`` (refinement only): each has ``frames`` (T, H, W, 3) uint8 and
        ``actions`` (T, A) float32 in raw units, row t the frame before action t and that action. Returns tensors whose
        first dimension counts examples, all of one length, on the CPU; the refiner keeps them (a resumed run reads them
        back), and each :meth:`refine_step` gets rows of them. ``seed``: for any choice of examples made at random."""
        ...

    def refine_step(self, batch: dict[str, torch.Tensor], state: RefinementState, generator: torch.Generator) -> float:
        """One optimizer step of refinement on ``batch`` (refinement only): the same keys as
        :meth:`refine_examples` returns, rows drawn from the examples kept so far, on ``device``. It trains
        ``state``'s weights with ``state``'s optimizer and returns the step's loss. ``generator`` (on ``device``)
        draws any noise the loss needs, so that a resumed run repeats the step exactly."""
        ...

    def refine_loss(self, examples: dict[str, torch.Tensor], state: RefinementState, generator: torch.Generator) -> float:
        """The loss of the weights the model imagines with on ``examples`` (on ``device``), without training
        (refinement only); with ``generator`` seeded alike, the losses before and after a round compare."""
        ...

    def use_refined(self, state: RefinementState) -> None:
        """Imagine with ``state``'s refined weights from now on (after each round, and after a resumed run loaded
        ``state``; refinement only). A model whose ``state`` holds the very weights it imagines with does nothing."""
        ...

    def save_refined(self, folder: str | Path, state: RefinementState) -> Path:
        """Write the refined model to ``folder`` as a model folder that the world model's ``from_pretrained`` (by the
        ``kind`` in its config.json) loads again (refinement only)."""
        ...

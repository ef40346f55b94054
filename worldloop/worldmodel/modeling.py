"""The action-conditioned DiT: diffusers ``WanTransformer3DModel`` with dual-channel action injection.

The clip the DiT sees is 13 frames = 5 context frames ``[reference, 4 memory]`` + 8 future frames,
i.e. 4 latent frames under the 4x causal VAE: ``[ref | memory | future 1-4 | future 5-8]``.
Every frame has the action that produced it (zero for the reference frame), 13 actions in all.

Channel 1, cross-attention: each of the 13 actions becomes one token (a linear map plus a learned
slot embedding); the 13 tokens replace the text tokens as ``encoder_hidden_states``.

Channel 2, AdaLN: the actions of each latent frame (4 per frame; the reference frame's single action
is zero-padded to 4) go through an MLP whose output is *added to the timestep embedding* of that
frame's tokens. Wan computes ``temb = time_embedder(sinusoid(t))`` per token and derives every block's
AdaLN-Zero shift/scale/gate (and the output norm's) from it, so the action reaches all of them. The
sum is done by a forward hook on ``condition_embedder.time_embedder``: no diffusers code is copied
and the weight names stay Wan's.

Timesteps are per token (``(B, seq_len)``, Wan2.2-TI2V style): context tokens carry their own noise
level (0 when clean), future tokens the sampler's.

Optionally (``context_channels``), the two context latents are also concatenated to every latent
frame's channels, as Wan's image-to-video model concatenates its first frame: a future token then
holds the reference and memory latents of its own patch as input, so keeping what does not move is
a local copy rather than something attention has to learn to look up across time.
"""

from __future__ import annotations

import torch
from torch import nn

TEMPORAL_FACTOR = 4
CONTEXT_FRAMES = 5

DIT_SIZES = {
    # heads, head_dim, layers, ffn, freq_dim, action-token width (the "text_dim" input)
    "tiny": dict(num_attention_heads=2, attention_head_dim=32, num_layers=2, ffn_dim=128, freq_dim=64, text_dim=64),
    "small": dict(num_attention_heads=8, attention_head_dim=64, num_layers=8, ffn_dim=2048, freq_dim=256, text_dim=256),
    "wan2.2-5b": dict(num_attention_heads=24, attention_head_dim=128, num_layers=30, ffn_dim=14336, freq_dim=256, text_dim=4096),
}


class ActionConditionedDiT(nn.Module):
    """``forward(latents, sigmas, actions) -> velocity`` over ``[context | future]`` latents."""

    def __init__(self, size: str, latent_channels: int, action_dim: int, chunk_size: int = 8, context_channels: bool = False):
        super().__init__()
        from diffusers import WanTransformer3DModel

        dims = DIT_SIZES[size]
        self.action_dim = action_dim
        self.chunk_size = chunk_size
        self.context_channels = context_channels
        self.num_actions = CONTEXT_FRAMES + chunk_size
        self.latent_frames = 2 + chunk_size // TEMPORAL_FACTOR
        self.transformer = WanTransformer3DModel(
            patch_size=(1, 2, 2),
            in_channels=latent_channels * (3 if context_channels else 1),
            out_channels=latent_channels,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            **dims,
        )
        inner = dims["num_attention_heads"] * dims["attention_head_dim"]
        # channel 1: one cross-attention token per action
        self.action_tokens = nn.Linear(action_dim, dims["text_dim"])
        self.slot_embedding = nn.Parameter(torch.randn(self.num_actions, dims["text_dim"]) * 0.02)
        # channel 2: per-latent-frame action groups -> added to the timestep embedding
        self.frame_action_mlp = nn.Sequential(
            nn.Linear(TEMPORAL_FACTOR * action_dim, inner), nn.SiLU(), nn.Linear(inner, inner)
        )
        nn.init.zeros_(self.frame_action_mlp[-1].weight)
        nn.init.zeros_(self.frame_action_mlp[-1].bias)
        self._temb_offset: torch.Tensor | None = None
        self.transformer.condition_embedder.time_embedder.register_forward_hook(self._add_action_to_temb)

    def _add_action_to_temb(self, module, inputs, temb):
        if self._temb_offset is None:
            return temb
        return temb + self._temb_offset.to(temb.dtype)

    def frame_action_groups(self, actions: torch.Tensor) -> torch.Tensor:
        """(B, 13, A) -> (B, 4, 4A): the actions producing each latent frame (reference zero-padded)."""
        batch = actions.shape[0]
        reference = torch.cat([actions.new_zeros(batch, TEMPORAL_FACTOR - 1, self.action_dim), actions[:, :1]], dim=1)
        groups = torch.cat([reference, actions[:, 1:]], dim=1)  # (B, 4 * latent_frames, A)
        return groups.reshape(batch, self.latent_frames, TEMPORAL_FACTOR * self.action_dim)

    def forward(self, latents: torch.Tensor, sigmas: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """latents (B, C, 4, h, w); sigmas (B, 4) noise level per latent frame in [0, 1];
        actions (B, 13, A) normalised -> predicted velocity (B, C, 4, h, w)."""
        batch, _, frames, height, width = latents.shape
        if frames != self.latent_frames:
            raise ValueError(f"the DiT takes {self.latent_frames} latent frames (2 context + {self.chunk_size // 4} new), got {frames}")
        if actions.shape[1:] != (self.num_actions, self.action_dim):
            raise ValueError(f"actions must be (B, {self.num_actions}, {self.action_dim}), got {tuple(actions.shape)}")
        if height % 2 or width % 2:
            raise ValueError(f"latent height and width must be even for the (1, 2, 2) patch, got {height}x{width}")
        tokens_per_frame = (height // 2) * (width // 2)
        timestep = (sigmas * 1000.0).repeat_interleave(tokens_per_frame, dim=1)  # (B, seq_len)
        action_tokens = self.action_tokens(actions) + self.slot_embedding  # (B, 13, text_dim)
        frame_offset = self.frame_action_mlp(self.frame_action_groups(actions))  # (B, 4, inner)
        self._temb_offset = frame_offset.repeat_interleave(tokens_per_frame, dim=1)  # (B, seq_len, inner)
        if self.context_channels:  # [latent | reference | memory] on every frame's channels
            context = latents[:, :, :2].flatten(1, 2)[:, :, None].expand(-1, -1, frames, -1, -1)
            latents = torch.cat([latents, context], dim=1)
        try:
            return self.transformer(latents, timestep, action_tokens, return_dict=False)[0]
        finally:
            self._temb_offset = None


def dit_flops_per_forward(size: str, batch: int, tokens: int, action_tokens: int = 13) -> float:
    """Matmul FLOPs of one DiT forward (2 per multiply-add): projections, attention, FFN."""
    d = DIT_SIZES[size]
    inner = d["num_attention_heads"] * d["attention_head_dim"]
    per_layer = (
        2 * tokens * inner * inner * 4  # self-attention q, k, v, o
        + 2 * tokens * tokens * inner * 2  # scores and weighted sum
        + 2 * tokens * inner * inner * 2  # cross-attention q, o
        + 2 * action_tokens * inner * inner * 2  # cross-attention k, v
        + 2 * tokens * action_tokens * inner * 2  # cross-attention scores and sum
        + 2 * tokens * inner * d["ffn_dim"] * 2  # FFN
    )
    return float(batch * d["num_layers"] * per_layer)

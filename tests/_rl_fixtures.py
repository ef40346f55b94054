"""A minimal Policy-protocol implementation for the RL tests: a tiny CNN with a few action bins."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from worldloop.policies.protocol import ActOutput, PolicyEvaluation
from worldloop.utils.pretrained import save_model_folder


class ToyPolicy(nn.Module):
    """frame (B, H, W, 3) uint8 -> logits over ``num_bins`` action values in [-1, 1] for each of K x A tokens."""

    def __init__(self, image_size: int = 32, chunk_size: int = 4, action_dim: int = 2, num_bins: int = 5, value_head: bool = False):
        super().__init__()
        self.image_size, self.chunk_size, self.action_dim, self.num_bins = image_size, chunk_size, action_dim, num_bins
        self.encoder = nn.Sequential(nn.Conv2d(3, 8, 4, stride=4), nn.ReLU(), nn.Flatten(), nn.Linear(8 * (image_size // 4) ** 2, 32), nn.ReLU())
        self.head = nn.Linear(32, chunk_size * action_dim * num_bins)
        self.value = nn.Linear(32, 1) if value_head else None
        self.register_buffer("bins", torch.linspace(-1, 1, num_bins))

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        features = self.encoder(images.to(self.device).permute(0, 3, 1, 2).float() / 255.0)
        logits = self.head(features).view(-1, self.chunk_size, self.action_dim, self.num_bins)
        return logits, self.value(features).squeeze(-1) if self.value is not None else None

    @torch.no_grad()
    def act(self, images, instructions, temperature=1.0, greedy=False) -> ActOutput:
        logits, values = self(images)
        log_probs_all = torch.log_softmax(logits / temperature, dim=-1)
        if greedy:
            tokens = logits.argmax(-1)
        else:
            tokens = torch.multinomial(log_probs_all.exp().flatten(0, 2), 1).view(logits.shape[:-1])
        log_probs = log_probs_all.gather(-1, tokens[..., None]).squeeze(-1)
        return ActOutput(self.bins[tokens], tokens, log_probs, values)

    def evaluate(self, images, instructions, tokens, temperature=1.0) -> PolicyEvaluation:
        logits, values = self(images)
        log_probs_all = torch.log_softmax(logits / temperature, dim=-1)
        log_probs = log_probs_all.gather(-1, tokens[..., None]).squeeze(-1)
        entropy = -(log_probs_all.exp() * log_probs_all).sum(-1)
        return PolicyEvaluation(log_probs, entropy, values)

    def save_pretrained(self, folder: str | Path) -> None:
        save_model_folder(folder, {"kind": "toy_policy", "image_size": self.image_size}, self)

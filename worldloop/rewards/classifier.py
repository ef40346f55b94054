"""ResNet-18 success classifier: one frame and its task -> P(success).

The seeds train a ResNet-18 on single simulator frames with binary cross-entropy on the
simulator's success labels and round its output. Where several tasks share one scene, the image
alone cannot say which goal counts, so the task modulates the pooled image
features with a learned per-instruction scale and shift (FiLM), initialised to the identity.

A saved classifier is a model folder (``config.json`` + ``model.safetensors``): the instruction
vocabulary, input size, success threshold and the side length of its training frames (checked against
a world model's in imagination) travel with the weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from worldloop.rewards.protocol import check_windows, judged_success
from worldloop.utils.pretrained import load_weights, read_model_config, save_model_folder

KIND = "success_classifier"
MODEL_SUBFOLDER = "model"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
FEATURES = 512


class SuccessClassifier(nn.Module):
    """Judge with ``window = 1``: scores the last frame of each window."""

    window = 1

    def __init__(self, instructions: Sequence[str], input_size: int = 64, threshold: float = 0.5, image_size: int | None = None):
        super().__init__()
        import torchvision

        self.instructions = list(instructions)
        self.task_index = {text: i for i, text in enumerate(self.instructions)}
        self.input_size = int(input_size)
        self.threshold = float(threshold)
        self.task_thresholds: dict[str, float] = {}  # reward.calibrate.threshold_per_task's, not saved
        self.image_size = image_size  # side of the frames it was trained on (None: unknown, older folders)
        self.backbone = torchvision.models.resnet18(weights=None)
        self.backbone.fc = nn.Identity()
        self.film = nn.Embedding(max(1, len(self.instructions)), 2 * FEATURES)  # (scale - 1, shift) per task
        nn.init.zeros_(self.film.weight)
        self.head = nn.Linear(FEATURES, 1)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    # ---------------------------------------------------------------- processing
    def prepare(self, frames: torch.Tensor) -> torch.Tensor:
        """(B, H, W, 3) uint8 -> (B, 3, input_size, input_size) float in [0, 1] on the model's device."""
        images = frames.to(self.device, non_blocking=True).permute(0, 3, 1, 2).float().div_(255.0)
        if images.shape[-1] != self.input_size or images.shape[-2] != self.input_size:
            images = F.interpolate(images, size=(self.input_size, self.input_size), mode="bilinear", antialias=True, align_corners=False)
        return images

    def task_ids(self, instructions: Sequence[str]) -> torch.Tensor:
        """Instructions -> (B,) indices into the saved instruction vocabulary."""
        unknown = sorted({text for text in instructions if text not in self.task_index})
        if unknown:
            raise ValueError(f"success classifier was trained on {len(self.instructions)} instructions; unknown: {unknown[:3]}")
        return torch.tensor([self.task_index[text] for text in instructions], dtype=torch.long, device=self.device)

    # ---------------------------------------------------------------- modeling
    def forward(self, images: torch.Tensor, task_ids: torch.Tensor) -> torch.Tensor:
        """images (B, 3, s, s) in [0, 1], task_ids (B,) -> success logits (B,)."""
        features = self.backbone((images - self.mean) / self.std)  # (B, 512)
        scale, shift = self.film(task_ids).chunk(2, dim=-1)
        features = features * (1.0 + scale) + shift
        return self.head(features).squeeze(-1)

    # ---------------------------------------------------------------- judge protocol
    @torch.no_grad()
    def score(self, windows: torch.Tensor, instructions: Sequence[str]) -> torch.Tensor:
        """(B, 1, H, W, 3) uint8 -> (B,) P(success) of each window's frame."""
        check_windows(windows, instructions, self.window, "success classifier")
        was_training = self.training
        self.eval()
        logits = self(self.prepare(windows[:, -1]), self.task_ids(instructions))
        self.train(was_training)
        return torch.sigmoid(logits.float())

    def probability(self, scores: torch.Tensor) -> torch.Tensor:
        return scores

    def success(self, windows: torch.Tensor, instructions: Sequence[str]) -> torch.Tensor:
        return judged_success(self, windows, instructions)

    # ---------------------------------------------------------------- folders
    def load_backbone(self, path: str | Path) -> None:
        """Start from local torchvision ResNet-18 weights (.pth state dict or .safetensors); the fc layer is dropped."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"pretrained backbone weights {path} do not exist")
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
        state = {k: v for k, v in state.items() if not k.startswith("fc.")}
        missing, unexpected = self.backbone.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"{path} is not a torchvision ResNet-18 state dict: missing {missing[:3]}, unexpected {unexpected[:3]}")

    def config_dict(self) -> dict:
        return {
            "kind": KIND,
            "instructions": self.instructions,
            "conditioning": "task",
            "input_size": self.input_size,
            "threshold": self.threshold,
            "image_size": self.image_size,
        }

    def save_pretrained(self, folder: str | Path) -> Path:
        return save_model_folder(folder, self.config_dict(), self)

    @classmethod
    def from_pretrained(cls, folder: str | Path, device: torch.device | str = "cpu", config: object = None) -> "SuccessClassifier":
        """Load a model folder, or a ``train-reward`` run folder holding one in ``model/``; the classifier keeps the
        threshold and input size it was saved with (``config``, a RewardConfig, is not read)."""
        folder = Path(folder)
        if not (folder / "config.json").is_file() and (folder / MODEL_SUBFOLDER / "config.json").is_file():
            folder = folder / MODEL_SUBFOLDER
        config = read_model_config(folder, kind=KIND)
        if config.get("conditioning", "task") != "task":
            raise ValueError(f"success classifier {folder}: config.json has conditioning={config['conditioning']!r}; "
                             "reward.classifier.conditioning was retired and this version only builds 'task' (train the judge again)")
        model = cls(config["instructions"], config["input_size"], config["threshold"], config.get("image_size"))
        load_weights(folder, model)
        return model.to(device).eval()

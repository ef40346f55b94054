"""How data gets into shape for OpenVLA-OFT: the prompt, the two towers' pixels and the action bins.

- Prompt (OpenVLA's): ``<s> In: What action should the robot take to {instruction}?\\nOut:`` then the empty
  ``▁`` token (OFT adds it where the prompt does not end with it, as at training time).
- Pixels: a uint8 frame resized (bicubic, as OpenVLA's processor) to the towers' side, in [0, 1], normalised with ImageNet's mean/std for the
  DINOv2 tower and 0.5/0.5 for SigLIP, the two stacked on channels: (B, 6, H, W).
- Action bins (OpenVLA's ActionTokenizer): edges ``linspace(-1, 1, n_bins)``; a normalised value a falls in
  bin ``digitize(clip(a), edges) - 1`` in [0, n_bins - 1]; bin b is vocabulary token ``vocab_size - 1 - b``;
  it decodes to the centre of edges b and b + 1 (the last bin, reached only at a = 1 exactly, to the last centre).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from worldloop.policies.openvla_oft.configuration import IMAGENET_MEAN_STD, SIGLIP_MEAN_STD

PROMPT = "In: What action should the robot take to {instruction}?\nOut:"
EMPTY_TOKEN = "▁"


def load_tokenizer(folder: str | Path):
    """The folder's Llama tokenizer (tokenizer.json, else tokenizer.model), read locally, never from a hub."""
    folder = Path(folder)
    from transformers import PreTrainedTokenizerFast

    if (folder / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    if (folder / "tokenizer.model").is_file():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    raise FileNotFoundError(f"{folder} has neither tokenizer.json nor tokenizer.model: the instructions cannot be tokenized")


class PromptTokenizer:
    """Instructions -> prompt token ids (with <s>, ending with the empty token), cached per instruction."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        vocab = tokenizer.get_vocab()
        for needed in ("<s>", "</s>"):
            if needed not in vocab:
                raise ValueError(f"the tokenizer has no '{needed}' token; it is not a Llama-2 tokenizer")
        self.bos_id, self.stop_id = vocab["<s>"], vocab["</s>"]
        self.empty_id = vocab.get(EMPTY_TOKEN)
        self.cache: dict[str, list[int]] = {}

    def __call__(self, instruction: str) -> list[int]:
        ids = self.cache.get(instruction)
        if ids is None:
            text = PROMPT.format(instruction=instruction.lower())
            ids = [self.bos_id] + list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            if self.empty_id is not None and ids[-1] != self.empty_id:
                ids.append(self.empty_id)
            self.cache[instruction] = ids
        return ids


def tower_mean_std(timm_id: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """SigLIP towers normalise with 0.5/0.5, the others (DINOv2) with ImageNet's statistics."""
    return SIGLIP_MEAN_STD if "siglip" in timm_id else IMAGENET_MEAN_STD


def fused_pixels(images: torch.Tensor, size: int, timm_ids: list[str], dtype: torch.dtype) -> torch.Tensor:
    """uint8 (B, H, W, 3) -> (B, 3 * towers, size, size): each tower's normalised copy, stacked on channels."""
    pixels = images.permute(0, 3, 1, 2).float() / 255.0  # (B, 3, H, W)
    if pixels.shape[-1] != size:
        pixels = F.interpolate(pixels, size=(size, size), mode="bicubic", antialias=True, align_corners=False).clamp(0, 1)
    stacked = []
    for timm_id in timm_ids:
        mean, std = (torch.tensor(v, device=pixels.device).view(1, 3, 1, 1) for v in tower_mean_std(timm_id))
        stacked.append((pixels - mean) / std)
    return torch.cat(stacked, dim=1).to(dtype)


def bin_edges(n_bins: int, device=None) -> torch.Tensor:
    return torch.linspace(-1, 1, n_bins, device=device, dtype=torch.float64)


def actions_to_bins(normalized: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Normalised actions (..., A) in [-1, 1] -> bins (..., A) int64 in [0, n_bins - 1] (numpy's digitize, minus one)."""
    edges = bin_edges(n_bins, normalized.device)
    return torch.bucketize(normalized.double().clamp(-1, 1), edges, right=True) - 1


def bins_to_actions(bins: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Bins (..., A) -> normalised actions at the bin centres (float32)."""
    edges = bin_edges(n_bins, bins.device)
    centers = (edges[:-1] + edges[1:]) / 2
    return centers[bins.clamp(0, n_bins - 2)].float()


def bins_to_token_ids(bins: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bin b is vocabulary token vocab_size - 1 - b (OpenVLA: vocab_size - digitize)."""
    return vocab_size - 1 - bins

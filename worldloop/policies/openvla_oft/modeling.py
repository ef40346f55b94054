"""OpenVLA-OFT as a worldloop Policy: Prismatic's fused vision backbone, a Llama-2 and OFT's parallel decoding.

    frame (B, H, W, 3) uint8 ──resize, 2 normalisations──▶ pixels (B, 6, S, S)
       ├─ DINOv2 ViT (timm), second-to-last block, patch tokens ─┐
       └─ SigLIP ViT (timm), second-to-last block, patch tokens ─┴─ concat on channels ─▶ (B, P, Dv)
    fused GELU MLP projector ──▶ patch embeddings (B, P, D)   [+ one proprio token, when the folder has the projector]
    sequence  <s> | patches | prompt tokens | K*A empty action embeddings | </s>
    Llama-2: causal over the prefix, bidirectional over the action block (the K*A positions and </s>)
    the hidden state one position before each action position (the last prompt token for the first):
       ├─ token head: the LM head's rows of the last n_bins vocabulary tokens ─▶ logits (B, K, A, n_bins)   (RL)
       └─ L1 head (OFT's MLPResNet on each step's A hidden states) ──▶ actions in [-1, 1] (B, K, A)      (inference, SFT)
    un-normalised with the suite's q01/q99 bounds (dataset_statistics.json).

One forward pass decodes a whole chunk: the action positions' inputs are zeros (OFT's empty action embeddings),
so every token of the chunk is scored from the observation alone, and the chunk's log-probability is the sum
of its tokens' (what RL needs). ``act`` samples the token head; ``act(greedy=True)`` on a folder with an L1
head returns the L1 head's actions, as OFT's inference does (their tokens are those actions' bins, their
log-probs the token head's). The folder layout and its key names: :mod:`worldloop.policies.openvla_oft.layout`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from worldloop.policies.openvla_oft.configuration import ActionStatistics, OpenVLAOFTConfig, read_statistics
from worldloop.policies.openvla_oft.processing import PromptTokenizer, actions_to_bins, bins_to_actions, bins_to_token_ids, fused_pixels

KIND = "openvla-oft"
"""The policy's registry name: ``--policy openvla-oft:DIR``; a folder whose config.json says model_type "openvla" is one too."""


# ------------------------------------------------------------------------------------------------
# Vision


def build_tower(timm_id: str, image_size: int, overrides: dict) -> nn.Module:
    """A timm ViT as Prismatic builds it (no pretrained weights, no classifier)."""
    import timm

    return timm.create_model(timm_id, pretrained=False, num_classes=0, img_size=image_size, **overrides)


def second_to_last_patches(vit: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """Patch tokens (B, P, C) after the second-to-last block, unnormalised, prefix (class, register) tokens
    dropped: what Prismatic's ``get_intermediate_layers(n={len(blocks) - 2})`` gives. The last block is unused."""
    x = vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(pixels))))
    for block in vit.blocks[:-1]:
        x = block(x)
    return x[:, vit.num_prefix_tokens :]


class PrismaticVisionBackbone(nn.Module):
    """DINOv2 (``featurizer``) and SigLIP (``fused_featurizer``) on the same frame; patch features concatenated."""

    def __init__(self, config: OpenVLAOFTConfig):
        super().__init__()
        ids, sizes, kwargs = config.timm_model_ids, config.image_sizes, config.timm_model_kwargs
        self.featurizer = build_tower(ids[0], sizes[0], kwargs[0])
        self.fused_featurizer = build_tower(ids[1], sizes[1], kwargs[1])
        self.embed_dim = self.featurizer.embed_dim + self.fused_featurizer.embed_dim
        self.num_patches = self.featurizer.patch_embed.num_patches
        if self.fused_featurizer.patch_embed.num_patches != self.num_patches:
            raise ValueError(f"the two towers give {self.num_patches} and {self.fused_featurizer.patch_embed.num_patches} patches; they must match")

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels (B, 6, S, S) -> patch features (B, P, C_dino + C_siglip)."""
        dino, siglip = pixels.split(3, dim=1)
        return torch.cat([second_to_last_patches(self.featurizer, dino), second_to_last_patches(self.fused_featurizer, siglip)], dim=2)


class FusedProjector(nn.Module):
    """Prismatic's "fused-gelu-mlp": vision dim -> 4x -> LLM dim -> LLM dim."""

    def __init__(self, vision_dim: int, llm_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(vision_dim, 4 * vision_dim)
        self.fc2 = nn.Linear(4 * vision_dim, llm_dim)
        self.fc3 = nn.Linear(llm_dim, llm_dim)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(patches)))))


class PrismaticVLA(nn.Module):
    """The weights of the sharded checkpoint, under their published names (see the layout module)."""

    def __init__(self, config: OpenVLAOFTConfig):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        self.vision_backbone = PrismaticVisionBackbone(config)
        self.projector = FusedProjector(self.vision_backbone.embed_dim, config.hidden_size)
        text = {k: v for k, v in config.text_config.items() if k not in ("torch_dtype", "dtype", "architectures")}
        self.language_model = LlamaForCausalLM(LlamaConfig(**text | {"use_cache": False}))  # one pass per chunk: no KV cache


# ------------------------------------------------------------------------------------------------
# OFT's heads


class MLPResNetBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.ffn = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ffn(x)


class MLPResNet(nn.Module):
    def __init__(self, num_blocks: int, input_dim: int, hidden_dim: int, output_dim: int):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(input_dim)
        self.fc1 = nn.Linear(input_dim, hidden_dim)
        self.mlp_resnet_blocks = nn.ModuleList(MLPResNetBlock(hidden_dim) for _ in range(num_blocks))
        self.layer_norm2 = nn.LayerNorm(hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(self.layer_norm1(x)))
        for block in self.mlp_resnet_blocks:
            x = block(x)
        return self.fc2(self.layer_norm2(x))


class L1RegressionActionHead(nn.Module):
    """OFT's continuous head: each chunk step's A hidden states, concatenated, -> an A-d action in [-1, 1]."""

    def __init__(self, llm_dim: int, action_dim: int):
        super().__init__()
        self.model = MLPResNet(num_blocks=2, input_dim=llm_dim * action_dim, hidden_dim=llm_dim, output_dim=action_dim)

    def forward(self, action_hidden: torch.Tensor, chunk_size: int) -> torch.Tensor:
        """(B, K*A, D) -> normalised actions (B, K, A)."""
        return self.model(action_hidden.reshape(action_hidden.shape[0], chunk_size, -1))


class ProprioProjector(nn.Module):
    """OFT's proprio token: a normalised state (B, P) -> one LLM-width embedding (B, D)."""

    def __init__(self, llm_dim: int, proprio_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(proprio_dim, llm_dim)
        self.fc2 = nn.Linear(llm_dim, llm_dim)

    def forward(self, proprio: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(proprio)))


# ------------------------------------------------------------------------------------------------
# The policy


@dataclasses.dataclass
class ChunkOutput:
    action_hidden: torch.Tensor
    """(B, K*A, D): the hidden state that decodes each action position."""
    logits: torch.Tensor
    """(B, K, A, n_bins) float32: the token head's logits of each bin."""


class OpenVLAOFT(nn.Module):
    """A Policy (:mod:`worldloop.policies.protocol`) over OpenVLA-OFT weights; tokens are action bins."""

    def __init__(self, config: OpenVLAOFTConfig, statistics: ActionStatistics, tokenizer, l1_head: bool = True, proprio_dim: int = 0):
        super().__init__()
        config.validate()
        self.config = config
        self.statistics = statistics
        self.prompts = PromptTokenizer(tokenizer)
        self.chunk_size = config.chunk_size
        self.action_dim = statistics.action_dim
        self.image_size = config.input_size
        self.num_bins = config.n_action_bins
        self.vla = PrismaticVLA(config)
        self.action_head = L1RegressionActionHead(config.hidden_size, self.action_dim) if l1_head else None
        self.proprio_projector = ProprioProjector(config.hidden_size, proprio_dim) if proprio_dim else None
        self.register_buffer("bin_token_ids", bins_to_token_ids(torch.arange(self.num_bins), config.vocab_size), persistent=False)
        self.source = ""
        self.files: dict[str, str] = {}
        """Names of the head files as loaded (kept when saving)."""

    @property
    def device(self) -> torch.device:
        return self.vla.projector.fc1.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.vla.projector.fc1.weight.dtype

    def add_instructions(self, instructions: list[str]) -> None:
        """Tokenize (and cache) the prompts of these instructions."""
        for text in instructions:
            self.prompts(text)

    # --------------------------------------------------------------------------------------------
    # Forward

    def _check_images(self, images: torch.Tensor, instructions: list[str]) -> None:
        size = self.image_size
        if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.ndim != 4 or tuple(images.shape[1:]) != (size, size, 3):
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise ValueError(f"images are {shape}; this policy takes uint8 (B, {size}, {size}, 3) frames (worldloop.frame_size in its config.json)")
        if len(instructions) != len(images):
            raise ValueError(f"{len(images)} images but {len(instructions)} instructions")

    def sequence(self, images: torch.Tensor, instructions: list[str], proprio: torch.Tensor | None = None):
        """-> input embeddings (B, S, D), attention mask (B, 1, S, S) bool (True: may attend), position ids (B, S).

        Layout: ``<s> | patches [| proprio] | pad... | prompt | K*A zeros | </s>``; a shorter prompt is padded
        before it, padding is never attended to and takes no position, so each row computes what it would alone."""
        self._check_images(images, instructions)
        device, dtype = self.device, self.dtype
        batch, num_actions = len(images), self.chunk_size * self.action_dim
        pixels = fused_pixels(images.to(device), self.config.image_sizes[0], self.config.timm_model_ids, dtype)
        patches = self.vla.projector(self.vla.vision_backbone(pixels))  # (B, P, D)
        if self.proprio_projector is not None:
            if proprio is None:
                raise ValueError("this checkpoint has a proprio projector: it needs the robot state (proprio), which the environment does not give; "
                                 "remove its proprio_projector--*_checkpoint.pt file to act without it")  # fmt: skip
            state = self.statistics.normalize_proprio(proprio.to(device).float()).to(dtype)
            patches = torch.cat([patches, self.proprio_projector(state)[:, None]], dim=1)

        prompts = [self.prompts(text)[1:] for text in instructions]  # without <s>
        length = max(len(p) for p in prompts)
        pad = self.config.pad_token_id
        text_ids = torch.tensor([[pad] * (length - len(p)) + p for p in prompts], device=device)  # (B, L)
        text_valid = torch.tensor([[False] * (length - len(p)) + [True] * len(p) for p in prompts], device=device)
        embed = self.vla.language_model.get_input_embeddings()
        bos = embed(torch.full((batch, 1), self.prompts.bos_id, device=device))
        stop = embed(torch.full((batch, 1), self.prompts.stop_id, device=device))
        empty = torch.zeros(batch, num_actions, bos.shape[-1], device=device, dtype=bos.dtype)
        embeddings = torch.cat([bos, patches.to(bos.dtype), embed(text_ids), empty, stop], dim=1)  # (B, S, D)

        prefix = 1 + patches.shape[1]
        valid = torch.cat([torch.ones(batch, prefix, dtype=torch.bool, device=device), text_valid,
                           torch.ones(batch, num_actions + 1, dtype=torch.bool, device=device)], dim=1)  # fmt: skip
        total = valid.shape[1]
        index = torch.arange(total, device=device)
        in_block = index >= total - num_actions - 1
        allowed = (index[None, :] <= index[:, None]) | (in_block[:, None] & in_block[None, :])  # (S, S) query x key
        mask = allowed[None, None] & valid[:, None, None, :]  # (B, 1, S, S)
        positions = (valid.cumsum(1) - 1).clamp(min=0)
        return embeddings, mask, positions

    def chunk(self, images: torch.Tensor, instructions: list[str], proprio: torch.Tensor | None = None) -> ChunkOutput:
        """One forward pass over the whole chunk."""
        embeddings, mask, positions = self.sequence(images, instructions, proprio)
        hidden = self.vla.language_model.model(inputs_embeds=embeddings, attention_mask=mask, position_ids=positions).last_hidden_state
        num_actions = self.chunk_size * self.action_dim
        action_hidden = hidden[:, -num_actions - 2 : -2]  # position p - 1 decodes action position p
        bin_weights = self.vla.language_model.get_output_embeddings().weight[self.bin_token_ids]  # (n_bins, D)
        logits = F.linear(action_hidden, bin_weights).float()
        return ChunkOutput(action_hidden, logits.view(len(images), self.chunk_size, self.action_dim, self.num_bins))

    @torch.no_grad()
    def act(self, images: torch.Tensor, instructions: list[str], temperature: float = 1.0, greedy: bool = False,
            generator: torch.Generator | None = None, proprio: torch.Tensor | None = None):  # fmt: skip
        """Sample the chunk's bins from the token head; ``greedy`` with an L1 head: its continuous actions."""
        from worldloop.policies.protocol import ActOutput

        out = self.chunk(images, list(instructions), proprio)
        log_probs_all = torch.log_softmax(out.logits / temperature, dim=-1)  # (B, K, A, bins)
        if greedy and self.action_head is not None:
            normalized = self.action_head(out.action_hidden.to(self.dtype), self.chunk_size).float().clamp(-1, 1)
            bins = actions_to_bins(normalized, self.num_bins)
        else:
            if greedy:
                bins = out.logits.argmax(-1)
            else:
                flat = log_probs_all.exp().reshape(-1, self.num_bins)
                bins = torch.multinomial(flat, 1, generator=generator).view(out.logits.shape[:-1])
            normalized = bins_to_actions(bins, self.num_bins)
        log_probs = log_probs_all.gather(-1, bins[..., None]).squeeze(-1)
        return ActOutput(actions=self.statistics.unnormalize(normalized), tokens=bins, log_probs=log_probs)

    def evaluate(self, images: torch.Tensor, instructions: list[str], tokens: torch.Tensor, temperature: float = 1.0, proprio: torch.Tensor | None = None):
        """Differentiable log-probs and entropy of the bins ``tokens`` (B, K, A)."""
        from worldloop.policies.protocol import PolicyEvaluation

        logits = self.chunk(images, list(instructions), proprio).logits
        if tuple(tokens.shape) != tuple(logits.shape[:-1]):
            raise ValueError(f"tokens have shape {tuple(tokens.shape)}; expected (B, K, A) = {tuple(logits.shape[:-1])}")
        log_probs_all = torch.log_softmax(logits / temperature, dim=-1)
        log_probs = log_probs_all.gather(-1, tokens.to(logits.device, torch.long)[..., None]).squeeze(-1)
        entropy = -(log_probs_all.exp() * log_probs_all).sum(-1)
        return PolicyEvaluation(log_probs=log_probs, entropy=entropy)

    def sft_loss(self, images: torch.Tensor, instructions: list[str], actions: torch.Tensor, proprio: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Behaviour cloning on action chunks (B, K, A) in environment units: OFT's L1 loss of the continuous head
        (when the folder has one) plus the token head's cross-entropy on the actions' bins. ``loss`` is their sum."""
        out = self.chunk(images, list(instructions), proprio)
        normalized = self.statistics.normalize(actions.to(self.device).float())
        bins = actions_to_bins(normalized, self.num_bins)
        losses = {"token_loss": F.cross_entropy(out.logits.reshape(-1, self.num_bins), bins.reshape(-1))}
        if self.action_head is not None:
            predicted = self.action_head(out.action_hidden.to(self.dtype), self.chunk_size).float()
            losses["l1_loss"] = (predicted - normalized).abs().mean()
        losses["loss"] = sum(losses.values())
        return losses

    # --------------------------------------------------------------------------------------------
    # Training set-up

    def use_statistics(self, statistics: ActionStatistics) -> None:
        """Act in a new dataset's action space (OFT fine-tuning on a new suite): its bounds un-normalise from now on;
        a new action dimension gets a fresh L1 head (the token head scores bins of any dimension)."""
        if statistics.action_dim != self.action_dim:
            head = L1RegressionActionHead(self.config.hidden_size, statistics.action_dim)
            self.action_head = head.to(self.device, self.dtype) if self.action_head is not None else None
            self.action_dim = statistics.action_dim
        self.statistics = statistics
        self.config = dataclasses.replace(self.config, unnorm_key=statistics.suite)

    def enable_lora(self, rank: int | None = None) -> None:
        """LoRA (peft) of ``rank`` (default: config.lora_rank) on the language model's and projector's linear
        layers; the vision towers and the base weights freeze; the heads stay fully trainable."""
        from peft import LoraConfig, inject_adapter_in_model

        rank = self.config.lora_rank if rank is None else rank
        if rank <= 0:
            return
        targets = r".*(language_model\.model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)|projector\.fc\d)"
        config = LoraConfig(r=rank, lora_alpha=min(rank, 16), lora_dropout=0.0, target_modules=targets, init_lora_weights="gaussian")
        self.vla.requires_grad_(False)
        inject_adapter_in_model(config, self.vla)
        for name, parameter in self.vla.named_parameters():
            parameter.requires_grad_("lora_" in name)

    def gradient_checkpointing(self, on: bool = True) -> None:
        """Recompute each Llama layer's activations in the backward pass (less memory, ~1/3 more compute)."""
        model = self.vla.language_model
        if hasattr(model, "activation_checkpointing_enable"):  # transformers' name from 5.x on
            model.activation_checkpointing_enable({"use_reentrant": False}) if on else model.activation_checkpointing_disable()
        else:
            model.gradient_checkpointing_enable({"use_reentrant": False}) if on else model.gradient_checkpointing_disable()

    def merged_vla_tensors(self) -> dict[str, torch.Tensor]:
        """The VLA's tensors under the published names, each LoRA update merged into its base weight."""
        from peft.tuners.lora import LoraLayer

        tensors = {}
        for module_name, module in self.vla.named_modules():
            if isinstance(module, LoraLayer):
                base = module.get_base_layer()
                weight = base.weight.detach()
                for adapter in module.active_adapters:
                    weight = weight + module.get_delta_weight(adapter).to(weight.dtype)
                tensors[f"{module_name}.weight"] = weight
                if base.bias is not None:
                    tensors[f"{module_name}.bias"] = base.bias.detach()
        for key, value in self.vla.state_dict().items():
            if "lora_" in key or ".base_layer." in key:
                continue
            tensors.setdefault(key, value)
        return tensors

    # --------------------------------------------------------------------------------------------
    # Folders

    def save_pretrained(self, folder: str | Path, shards: int | None = None) -> None:
        """Write the published layout (LoRA merged): config.json, sharded safetensors + index,
        dataset_statistics.json, the head checkpoints, and the source folder's tokenizer files."""
        from worldloop.policies.openvla_oft.layout import ACTION_HEAD_PREFIX, PROPRIO_PREFIX, copy_side_files, write_head, write_vla_tensors
        from worldloop.utils.io import atomic_dir, atomic_write_json

        with atomic_dir(Path(folder)) as tmp:
            config = dataclasses.replace(self.config, unnorm_key=self.statistics.suite)
            atomic_write_json(tmp / "config.json", config.to_json())
            write_vla_tensors(tmp, self.merged_vla_tensors(), shards=shards)
            atomic_write_json(tmp / "dataset_statistics.json", self.statistics.to_json())
            if self.action_head is not None:
                write_head(tmp / self.files.get("action_head", f"{ACTION_HEAD_PREFIX}--latest_checkpoint.pt"), self.action_head)
            if self.proprio_projector is not None:
                write_head(tmp / self.files.get("proprio_projector", f"{PROPRIO_PREFIX}--latest_checkpoint.pt"), self.proprio_projector)
            if self.source:
                copy_side_files(Path(self.source), tmp)
            else:
                self.prompts.tokenizer.save_pretrained(str(tmp))

    @classmethod
    def from_pretrained(cls, spec: str | Path, device: str | torch.device = "cpu", lora: bool = True) -> OpenVLAOFT:
        """Load ``DIR`` or ``DIR@SUITE`` (SUITE: the dataset_statistics.json entry to un-normalise with) in the
        published layout; with ``lora`` and config lora_rank > 0, LoRA adapters are added for training."""
        from worldloop.policies.openvla_oft.layout import ACTION_HEAD_PREFIX, PROPRIO_PREFIX, find_head_file, load_strict, read_head, read_vla_tensors
        from worldloop.policies.openvla_oft.processing import load_tokenizer

        folder, _, suite = str(spec).partition("@")
        config = OpenVLAOFTConfig.from_folder(folder)
        statistics = read_statistics(folder, suite or config.unnorm_key, config.raw.get("norm_stats"))
        head_file, proprio_file = find_head_file(folder, ACTION_HEAD_PREFIX), find_head_file(folder, PROPRIO_PREFIX)
        head_state = read_head(head_file) if head_file else None
        proprio_state = read_head(proprio_file) if proprio_file else None
        proprio_dim = int(proprio_state["fc1.weight"].shape[1]) if proprio_state and "fc1.weight" in proprio_state else (
            len(statistics.proprio_q01) if proprio_state is not None and statistics.proprio_q01 is not None else 0)  # fmt: skip
        if proprio_state is not None and not proprio_dim:
            raise ValueError(f"{proprio_file} has no tensor 'fc1.weight' that the proprio projector needs")
        tensors = read_vla_tensors(folder)
        dtype = next(iter(tensors.values())).dtype if torch.device(device).type == "cuda" else torch.float32
        with torch.device(device):  # a 7B model is built where it will run, then overwritten by the checkpoint
            model = cls(config, statistics, load_tokenizer(folder), l1_head=head_state is not None, proprio_dim=proprio_dim)
        load_strict(model.vla, tensors, f"{folder} (model safetensors)")
        del tensors
        if head_state is not None:
            load_strict(model.action_head, head_state, str(head_file))
            model.files["action_head"] = head_file.name
        if proprio_state is not None:
            load_strict(model.proprio_projector, proprio_state, str(proprio_file))
            model.files["proprio_projector"] = proprio_file.name
        model.source = str(Path(folder))
        model.config = dataclasses.replace(config, unnorm_key=statistics.suite)
        model = model.to(device=device, dtype=dtype)
        if lora:
            model.enable_lora()
        return model.eval()

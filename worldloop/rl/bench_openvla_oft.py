"""``worldloop bench vla``: OpenVLA-OFT speed and memory at published (``--models 7b``) or test (``tiny``) dimensions
(in the rl layer: it times the GRPO update).

Random weights, built on the device (bf16 on a GPU, fp32 on a CPU), LIBERO's shape: A = 7, K = 8, 224-px
frames. It times

- ``act`` (one parallel-decoding pass per chunk, token head sampled) at each ``--batch-sizes`` (64: a GRPO
  rollout of 64 environments): ms per call, chunks/s and actions/s;
- one GRPO minibatch update (``evaluate`` of the sampled bins, the clipped loss, backward, AdamW) at
  rl.num_groups x rl.group_size / rl.num_minibatches samples, for full fine-tuning and LoRA (rank
  ``worldloop.lora_rank``, 32), each without and with gradient checkpointing: ms per step and the peak
  GPU memory of the step (including weights and optimizer state).
"""

from __future__ import annotations

import time

import torch

from worldloop.policies.openvla_oft.configuration import ActionStatistics, OpenVLAOFTConfig, seven_b_config
from worldloop.utils.device import autocast_dtype, resolve_device
from worldloop.utils.io import atomic_write_text
from worldloop.utils.timing import seconds_per_call, synchronize

ACTION_DIM, CHUNK = 7, 8
INSTRUCTIONS = ["put the bowl on the plate", "open the top drawer and put the bowl inside", "pick up the black bowl next to the cookie box and place it on the plate"]


def tiny_config() -> OpenVLAOFTConfig:
    """Test dimensions: 2-block ViTs of width 16 on 32-px frames, a 2-layer Llama of width 32, a 320-token vocabulary."""
    config = seven_b_config(CHUNK)
    tower = {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 8}
    config.timm_model_kwargs, config.image_sizes = [dict(tower), dict(tower)], [32, 32]
    config.text_config |= {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
                           "vocab_size": 384, "pad_token_id": 320}  # fmt: skip
    config.pad_token_id = 320
    return config


def synthetic_tokenizer(vocab_size: int):
    """A word-level tokenizer with Llama-2's special tokens and ``vocab_size`` entries (random weights need no real one)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for text in INSTRUCTIONS + ["in: what action should the robot take to ? out:"] for w in text.replace("?", " ? ").split()})
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3} | {w: 4 + i for i, w in enumerate(words)}
    vocab |= {f"<extra_{i}>": i for i in range(len(vocab), vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def build(config: OpenVLAOFTConfig, device: torch.device):
    from worldloop.policies.openvla_oft.modeling import OpenVLAOFT

    statistics = ActionStatistics(-torch.ones(ACTION_DIM), torch.ones(ACTION_DIM), torch.ones(ACTION_DIM, dtype=torch.bool), "bench")
    with torch.device(device):
        policy = OpenVLAOFT(config, statistics, synthetic_tokenizer(config.vocab_size), l1_head=True)
    return policy.to(torch.bfloat16 if device.type == "cuda" else torch.float32).eval()


def count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n / 1e3:.0f}k"


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f}"


def bench_vla(args, config) -> int:
    from worldloop.rl.losses import clipped_policy_loss

    device = resolve_device(config.device)
    rl = config.rl
    update_batch = max(1, rl.num_groups * rl.group_size // rl.num_minibatches)
    repeats = max(2, min(args.steps, 10))
    lines = []
    for dims in args.models:
        if dims not in ("tiny", "7b"):
            raise ValueError(f"bench vla measures --models tiny or 7b, not '{dims}'")
        model_config = seven_b_config(CHUNK) if dims == "7b" else tiny_config()
        torch.manual_seed(0)
        began = time.perf_counter()
        policy = build(model_config, device)
        synchronize(device)
        built = time.perf_counter() - began
        size = policy.image_size
        params = sum(p.numel() for p in policy.parameters())
        lines += [f"OpenVLA-OFT {dims}: {count(params)} parameters ({policy.dtype}), {size}x{size} frames, K={CHUNK}, A={ACTION_DIM}, "
                  f"device {device}; built in {built:.0f} s", "",
                  "| act | batch | ms per call | chunks/s | actions/s |", "| --- | ---: | ---: | ---: | ---: |"]  # fmt: skip

        def inputs(batch: int):
            images = torch.randint(0, 256, (batch, size, size, 3), dtype=torch.uint8, device=device)
            return images, [INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(batch)]

        dtype = autocast_dtype(device)
        for batch in args.batch_sizes:
            images, texts = inputs(batch)

            def act():
                with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                    policy.act(images, texts)

            seconds = seconds_per_call(act, device, repeats, warmup=1)
            lines.append(f"| act | {batch} | {seconds * 1e3:.1f} | {batch / seconds:.1f} | {batch * CHUNK / seconds:.0f} |")

        lines += ["", f"| GRPO minibatch update | batch | LoRA | grad. checkpointing | ms per step | peak GPU GiB |", "| --- | ---: | --- | --- | ---: | ---: |"]
        images, texts = inputs(update_batch)
        with torch.no_grad():
            sampled = policy.act(images, texts)
        advantages, weights = torch.randn(update_batch, device=device), torch.full((update_batch,), 1.0 / update_batch, device=device)
        for lora in (False, True):
            if lora:
                policy.enable_lora()
            for checkpointing in (False, True):
                policy.gradient_checkpointing(checkpointing)
                parameters = [p for p in policy.parameters() if p.requires_grad]
                optimizer = torch.optim.AdamW(parameters, lr=1e-6)

                def step():
                    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                        new = policy.evaluate(images, texts, sampled.tokens)
                    loss, _ = clipped_policy_loss(new.log_probs.float(), sampled.log_probs, advantages, weights)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()

                policy.train()
                try:
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                        torch.cuda.reset_peak_memory_stats(device)
                    seconds = seconds_per_call(step, device, repeats, warmup=1)
                    peak = gib(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else "n/a (CPU)"
                    row = f"{seconds * 1e3:.0f} | {peak}"
                except torch.OutOfMemoryError:
                    row = "out of memory | -"
                policy.eval()
                for parameter in parameters:
                    parameter.grad = None
                del optimizer
                trainable = sum(p.numel() for p in parameters)
                kind = f"rank {model_config.lora_rank} ({count(trainable)} trained)" if lora else f"no ({count(trainable)} trained)"
                lines.append(f"| GRPO update | {update_batch} | {kind} | {'yes' if checkpointing else 'no'} | {row} |")
        steps = rl.update_epochs * rl.num_minibatches
        lines += ["", f"one GRPO iteration of {rl.num_groups * rl.group_size} rollouts updates in {steps} such steps (rl.update_epochs x rl.num_minibatches)", ""]
        del policy
        if device.type == "cuda":
            torch.cuda.empty_cache()
    text = "\n".join(lines)
    print(text, end="")
    if args.out:
        atomic_write_text(args.out, text)
    return 0

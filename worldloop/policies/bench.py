"""``worldloop bench policy``: CompactVLA speed at the configured size (random weights).

Times ``act`` (one chunk for a batch of frames) at batch 1, 64 and ``eval.num_envs``, and one SFT
step (forward, token cross-entropy, backward, AdamW) at ``sft.batch_size``, with bf16 autocast on
a GPU. This is what sizes ``sft.steps`` and ``eval.num_envs`` for a time budget.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from worldloop.policies.compact_vla.modeling import CompactVLA
from worldloop.policies.sft import _autocast
from worldloop.policies.tokenizer import NUM_BINS, ActionTokenizer
from worldloop.utils.device import resolve_device
from worldloop.utils.io import atomic_write_text
from worldloop.utils.timing import seconds_per_call

ACTION_DIM = 4


def bench_policy(args, config) -> int:
    from worldloop.sims.tasks import instruction, resolve_tasks

    device = resolve_device(config.device)
    size = config.sim.image_size
    torch.manual_seed(0)
    tokenizer = ActionTokenizer.fit(torch.rand(256, ACTION_DIM) * 2 - 1)
    policy = CompactVLA(config.policy, ACTION_DIM, size, tokenizer)
    texts = [instruction(t) for t in resolve_tasks(config.sim)]
    policy.add_instructions(texts)
    policy.to(device)
    repeats = max(3, min(args.steps, 20))
    params = sum(p.numel() for p in policy.parameters())
    lines = [f"CompactVLA {params / 1e6:.1f}M parameters, {size}x{size} frames, K={policy.chunk_size}, device {device}", ""]
    lines += ["| what | batch | ms per call | per sample |", "| --- | ---: | ---: | ---: |"]

    def frames(batch: int) -> torch.Tensor:
        return torch.randint(0, 256, (batch, size, size, 3), dtype=torch.uint8, device=device)

    policy.eval()
    for batch in sorted({1, 64, config.eval.num_envs}):
        images, batch_texts = frames(batch), [texts[i % len(texts)] for i in range(batch)]

        def act():
            with _autocast(device):
                policy.act(images, batch_texts)

        seconds = seconds_per_call(act, device, repeats, warmup=2)
        lines.append(f"| act | {batch} | {seconds * 1e3:.1f} | {seconds * 1e3 / batch:.2f} ms |")

    policy.train()
    batch = config.sft.batch_size
    images, batch_texts = frames(batch), [texts[i % len(texts)] for i in range(batch)]
    target = torch.randint(0, NUM_BINS, (batch, policy.chunk_size, ACTION_DIM), device=device)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5)

    def sft_step():
        with _autocast(device):
            logits, _ = policy(images, batch_texts)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    seconds = seconds_per_call(sft_step, device, repeats, warmup=2)
    lines.append(f"| sft step | {batch} | {seconds * 1e3:.1f} | {seconds * 1e3 / batch:.2f} ms |")
    lines += ["", f"sft.steps={config.sft.steps} would take ~{seconds * config.sft.steps:.0f} s of training"]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        atomic_write_text(args.out, text)
    return 0

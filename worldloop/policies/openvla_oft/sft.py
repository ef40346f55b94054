"""Supervised fine-tuning of an OpenVLA-OFT checkpoint on a dataset's demonstrations (`worldloop sft --policy openvla-oft:DIR`).

OFT's recipe at worldloop's scale, top to bottom:

    load the checkpoint (LoRA of worldloop.lora_rank on the Llama and the projector)
    -> the dataset's action statistics (q01/q99 of the training actions, every dimension normalised) replace the
       checkpoint's; another action dimension (Meta-World's 4 against LIBERO's 7) gets a fresh L1 head
    -> AdamW + warm-up/cosine over the LoRA and the heads; each step: a random batch of (frame, instruction,
       action chunk), random shift, the L1 loss of the continuous head + the token head's cross-entropy
    -> OUT in the published layout (LoRA merged), tb/ beside it, sft_results.json.

Under torchrun it is data-parallel as the compact VLA's SFT (:mod:`worldloop.utils.distributed`): every rank loads
the checkpoint, draws and shifts the same global batch and trains on its rows of it; the gradients of the LoRA and
the heads are averaged, so every rank steps alike; rank 0 alone writes. There is no resume: a rerun starts again
from the checkpoint.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from worldloop.policies.openvla_oft.configuration import ActionStatistics
from worldloop.policies.sft import AUGMENT_SHIFT, GRAD_CLIP, WEIGHT_DECAY, _autocast, build_samples, episode_summary, publish_model, random_shift, select_episodes, warmup_cosine


def dataset_statistics(chunks: torch.Tensor, suite: str, percentiles: tuple[float, float] = (1.0, 99.0)) -> ActionStatistics:
    """Bounds of the training actions (N, K, A): their low/high percentiles (OpenVLA's q01/q99), every dimension normalised."""
    actions = chunks[:, 0].double()
    low, high = (torch.quantile(actions, p / 100, dim=0).float() for p in percentiles)
    return ActionStatistics(low, high, torch.ones(len(low), dtype=torch.bool), suite)


def finetune_openvla_oft(config, policy_spec: str, dataset: str | Path, out: str | Path, episodes_per_task: int = 0) -> dict[str, Any]:
    from tqdm import tqdm

    from worldloop.config import save_config
    from worldloop.data.dataset import TrajectoryDataset, split_episodes
    from worldloop.policies import load_policy
    from worldloop.policies.openvla_oft.modeling import OpenVLAOFT
    from worldloop.utils import distributed
    from worldloop.utils.device import resolve_device
    from worldloop.utils.io import atomic_write_json

    sft, out = config.sft, Path(out)
    device = resolve_device(config.device)
    main, mine = distributed.is_main(), distributed.rows(sft.batch_size, "sft.batch_size")
    torch.manual_seed(config.seed)
    policy = load_policy(policy_spec, device)
    if not isinstance(policy, OpenVLAOFT):
        raise ValueError(f"sft --policy fine-tunes an OpenVLA-OFT checkpoint (openvla-oft:DIR); {policy_spec} is a {type(policy).__name__}")
    ds = TrajectoryDataset(dataset)
    if ds.image_size != policy.image_size:
        raise ValueError(f"{dataset} has {ds.image_size}x{ds.image_size} frames; the policy takes {policy.image_size} (worldloop.frame_size in its config.json)")
    train_ids, held_ids = split_episodes(ds, seed=config.seed)
    chosen = select_episodes([episode_summary(ds, i) for i in train_ids], episodes_per_task)
    train = build_samples((ds.episode(i) for i in chosen), policy.chunk_size, list(ds.tasks))
    policy.use_statistics(dataset_statistics(train.chunks, Path(dataset).name))
    if main:
        print(f"sft: fine-tuning {policy_spec} on {len(chosen)} episodes ({len(train)} samples) of {dataset}; actions normalised to its q01/q99")

    trainable = [p for p in policy.parameters() if p.requires_grad]
    distributed.broadcast_tensors(trainable)  # a fresh L1 head starts alike on every rank (the frozen weights are the checkpoint's)
    optimizer = torch.optim.AdamW(trainable, lr=sft.lr, weight_decay=WEIGHT_DECAY, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine(s, sft.warmup_steps, sft.steps))
    sampler = torch.Generator().manual_seed(config.seed)
    out.mkdir(parents=True, exist_ok=True)
    if main:
        save_config(config, out)
    writer = distributed.summary_writer(str(out / "tb"))
    started, losses = time.time(), {}
    policy.train()
    for step in tqdm(range(sft.steps), desc="sft", dynamic_ncols=True, disable=None if main else True):
        index = torch.randint(len(train), (sft.batch_size,), generator=sampler)  # the global batch; this rank trains on ``mine``
        images = random_shift(train.frames[index], AUGMENT_SHIFT, sampler)[mine]
        index = index[mine]
        texts = [train.instructions[i] for i in train.instruction_ids[index].tolist()]
        with _autocast(device):
            losses = policy.sft_loss(images, texts, train.chunks[index])
        optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        distributed.average_gradients(trainable)
        torch.nn.utils.clip_grad_norm_(trainable, GRAD_CLIP)
        optimizer.step()
        scheduler.step()
        losses = {name: distributed.all_mean(value.item()) for name, value in losses.items()}
        for name, value in losses.items():
            writer.add_scalar(f"train/{name}", value, step + 1)
    writer.close()
    policy.eval()
    results = {"steps": sft.steps, "train_samples": len(train), "held_out_samples": 0, "final_train_loss": losses["loss"],
               "held_out_loss": None, "held_out_token_accuracy": None, "seconds": time.time() - started, "policy": str(policy_spec),
               "dataset": str(dataset), "train_episodes": chosen, "trained_parameters": sum(p.numel() for p in trainable),
               "processes": distributed.world_size()}  # fmt: skip
    if main:
        publish_model(policy, out)
        atomic_write_json(out / "sft_results.json", results)
    distributed.barrier()  # the other ranks end once the model is written
    return results

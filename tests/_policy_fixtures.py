"""Shared helpers of the policy tests: a tiny config and synthetic episodes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch._dynamo  # noqa: F401  loads triton's LLVM now: loaded after Mesa's (EGL rendering) it segfaults


from worldloop.config import load_config

OPEN, CLOSE = "open the drawer", "close the drawer"
IMAGE = 32
TINY = [
    "policy.vision_widths=[8,8,16,16]",
    "policy.width=32",
    "policy.depth=2",
    "policy.heads=2",
    "policy.image_grid=2",
    "sft.batch_size=16",
    "sft.warmup_steps=2",
    "sft.lr=0.003",
]


def tiny_config(*overrides: str):
    return load_config("tiny-cpu", [*TINY, *overrides])


@dataclass
class Episode:
    frames: np.ndarray
    actions: np.ndarray
    success: np.ndarray
    instruction: str
    task_index: int
    index: int


def synthetic_episodes(count: int, seed: int = 0, length: int = 12) -> list[Episode]:
    """Episodes whose frames all look alike (noise around one scene) and whose instruction alone decides
    the first action dimension: +0.8 to open, -0.8 to close; the others follow the step index."""
    rng = np.random.default_rng(seed)
    scene = np.random.default_rng(123).integers(0, 256, (IMAGE, IMAGE, 3))
    episodes = []
    for i in range(count):
        opening = i % 2 == 0
        frames = np.clip(scene + rng.integers(-20, 21, (length, IMAGE, IMAGE, 3)), 0, 255).astype(np.uint8)
        actions = np.repeat(np.linspace(-0.5, 0.5, length, dtype=np.float32)[:, None], 4, axis=1)
        actions[:, 0] = (0.8 if opening else -0.8) + rng.normal(0, 0.05, length)
        success = np.zeros(length, dtype=bool)
        success[-1] = True
        episodes.append(Episode(frames, actions, success, OPEN if opening else CLOSE, int(not opening), i))
    return episodes


def tiny_policy(config=None, action_dim: int = 4, value_head: bool = False):
    from worldloop.policies.compact_vla.modeling import CompactVLA
    from worldloop.policies.tokenizer import ActionTokenizer

    config = config or tiny_config()
    config.policy.value_head = value_head
    torch.manual_seed(0)
    tokenizer = ActionTokenizer.fit(torch.rand(64, action_dim) * 2 - 1)
    policy = CompactVLA(config.policy, action_dim, IMAGE, tokenizer)
    policy.add_instructions([OPEN, CLOSE])
    return policy


def images(batch: int, size: int = IMAGE, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (batch, size, size, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))

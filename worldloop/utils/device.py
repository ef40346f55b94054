"""Choosing the torch device and precision."""

from __future__ import annotations

import contextlib

import torch


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' -> cuda when available, else cpu; anything else is passed to torch.device. Under torchrun a CUDA device
    is the GPU of the process's LOCAL_RANK (:mod:`worldloop.utils.distributed`)."""
    from worldloop.utils.distributed import device_of_rank

    if name == "auto":
        return device_of_rank(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    device = device_of_rank(torch.device(name))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device '{name}' was asked for but torch sees no CUDA device")
    if device.type == "cuda":
        # cuDNN times its kernels once per input shape and keeps the fastest: our shapes are fixed
        # (the video VAE's causal 3D convolutions above all)
        torch.backends.cudnn.benchmark = True
    return device


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """bf16 autocast on GPU, full precision on CPU (CPU bf16 is slow and changes results)."""
    return torch.bfloat16 if device.type == "cuda" else None


def autocast(device: torch.device):
    """The context that computes in :func:`autocast_dtype` on ``device``: bf16 autocast on GPU, nothing on CPU."""
    dtype = autocast_dtype(device)
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()

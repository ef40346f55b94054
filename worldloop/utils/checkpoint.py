"""Training checkpoints that are written atomically and resume exactly.

A checkpoint is a folder ``RUN/checkpoints/step_000100/`` holding, per module, a safetensors file
of its weights, and one ``state.pt`` (optimizer, scheduler and RNG states, the step and any small
extras). The folder is built under a temporary name and renamed in one step, then ``latest`` is
rewritten atomically to point at it: a crash at any moment leaves the previous checkpoint usable.

Under torchrun (:mod:`worldloop.utils.distributed`) every rank calls :func:`save_checkpoint`; rank 0 alone writes,
with every rank's RNG states, and each rank restores its own on resume.
"""

from __future__ import annotations

import math
import random
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from worldloop.utils import distributed
from worldloop.utils.io import atomic_dir, atomic_write_text

CHECKPOINTS = "checkpoints"
EVALUATIONS = 4
"""Held-out evaluations of a `worldloop sft` or `train-reward` run, each with a checkpoint (a resume point): every
quarter of its steps, and at the end (the metaworld-gpu preset's sft.steps 800 and reward.training.steps 2000 had them
every 200 and 500 steps)."""


def evaluation_interval(steps: int) -> int:
    """Steps between the held-out evaluations and checkpoints of a run of ``steps`` steps (:data:`EVALUATIONS`)."""
    return max(1, math.ceil(steps / EVALUATIONS))


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    modules: dict[str, torch.nn.Module],
    stateful: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    keep: int = 2,
) -> Path:
    """Save weights of ``modules``, ``state_dict()`` of ``stateful`` (optimizers, schedulers,
    generators) and ``extra`` at ``step``; keep the newest ``keep`` checkpoints. With several ranks, every rank
    calls it and rank 0 writes (the weights and states are rank 0's: the ranks keep them equal)."""
    root = Path(run_dir) / CHECKPOINTS
    final = root / f"step_{step:09d}"
    rng_per_rank = distributed.gather_objects(rng_state())
    if not distributed.is_main():
        distributed.barrier()  # rank 0 is writing
        return final
    with atomic_dir(final) as tmp:
        for name, module in modules.items():
            tensors = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
            save_file(_untie(tensors), tmp / f"{name}.safetensors")
        torch.save(
            {
                "step": step,
                "stateful": {k: v.state_dict() if hasattr(v, "state_dict") else v.get_state() for k, v in (stateful or {}).items()},
                "rng": rng_per_rank[0],
                **({"rng_per_rank": rng_per_rank} if len(rng_per_rank) > 1 else {}),
                "extra": extra or {},
            },
            tmp / "state.pt",
        )
    atomic_write_text(root / "latest", final.name + "\n")
    for old in sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    distributed.barrier()
    return final


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    found = complete_checkpoints(run_dir)
    return found[0] if found else None


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """A run's complete checkpoints (those with a ``state.pt``), newest first: the one ``latest`` points at, then the others."""
    root = Path(run_dir) / CHECKPOINTS
    complete = sorted((p for p in root.glob("step_*") if (p / "state.pt").is_file()), reverse=True)
    pointer = root / "latest"
    if pointer.is_file():
        named = root / pointer.read_text().strip()
        if named in complete:
            complete = [named] + [p for p in complete if p != named]
    return complete


def announce_resume(who: str, checkpoint: Path, step: int) -> None:
    """The one line every resumable verb prints when it goes on from a checkpoint."""
    print(f"{who}: resuming from {checkpoint} at step {step}", flush=True)


class DamagedCheckpoint(ValueError):
    """A checkpoint file that cannot be read (truncated, overwritten) or holds weights that are not finite."""


def resume(
    run_dir: str | Path,
    who: str,
    modules: dict[str, torch.nn.Module],
    stateful: dict[str, Any] | None = None,
    check: Callable[[Path, dict[str, Any]], None] | None = None,
) -> tuple[Path, int, dict[str, Any]] | None:
    """Restore the newest checkpoint of ``run_dir`` that can be read, announcing it as ``who``; returns
    (checkpoint, step, extra), or None when the run has none. A damaged checkpoint is named and the one
    before it used; when every checkpoint is damaged the error names them all. ``check(checkpoint, extra)``
    may refuse a checkpoint this run cannot go on from (it raises, and nothing is restored)."""
    damaged = []
    for checkpoint in complete_checkpoints(run_dir):
        try:
            step, extra = load_checkpoint(checkpoint, modules, stateful, check=check)
        except DamagedCheckpoint as error:
            damaged.append(str(error))
            if distributed.is_main():
                print(f"{who}: warning: {error}; trying the checkpoint before it", flush=True)
            continue
        if distributed.is_main():
            announce_resume(who, checkpoint, step)
        return checkpoint, step, extra
    if damaged:
        raise DamagedCheckpoint(f"no checkpoint of {run_dir} can be read: {'; '.join(damaged)}; "
                                "rerun with --overwrite to start again, or give a new --out")  # fmt: skip
    return None


def load_checkpoint(
    path: str | Path,
    modules: dict[str, torch.nn.Module],
    stateful: dict[str, Any] | None = None,
    restore_rng: bool = True,
    check: Callable[[Path, dict[str, Any]], None] | None = None,
) -> tuple[int, dict[str, Any]]:
    """Restore what :func:`save_checkpoint` wrote; returns (step, extra). A file that cannot be read, or weights
    that are not finite, raise :class:`DamagedCheckpoint` naming the file before anything is restored;
    ``check(path, extra)`` runs before anything is restored too."""
    path = Path(path)
    try:
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    except Exception as error:  # truncated: RuntimeError (zip reader), EOFError, UnpicklingError
        raise DamagedCheckpoint(f"checkpoint file {path / 'state.pt'} cannot be read ({str(error)[:120]})") from error
    if check is not None:
        check(path, state["extra"])
    weights = {}
    for name in modules:
        file = path / f"{name}.safetensors"
        if not file.is_file():
            raise FileNotFoundError(f"checkpoint {path} has no weights for '{name}' ({file.name})")
        try:
            weights[name] = read_finite_weights(file)
        except ValueError as error:
            raise DamagedCheckpoint(str(error)) from error
    for name, module in modules.items():
        module.load_state_dict(weights[name])
    for name, obj in (stateful or {}).items():
        if name not in state["stateful"]:
            raise KeyError(f"checkpoint {path} has no state for '{name}'")
        if hasattr(obj, "load_state_dict"):
            obj.load_state_dict(state["stateful"][name])
        else:
            obj.set_state(state["stateful"][name])
    if restore_rng:  # this rank's own states when the checkpoint holds as many ranks' as run now, else rank 0's
        per_rank = state.get("rng_per_rank", [])
        set_rng_state(per_rank[distributed.rank()] if len(per_rank) == distributed.world_size() else state["rng"])
    return int(state["step"]), state["extra"]


def read_finite_weights(file: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors ``file``; a file that cannot be read or holds a NaN or infinite weight is a
    ValueError naming it (and the first such tensor)."""
    try:
        tensors = load_file(file, device="cpu")
    except Exception as error:  # safetensors raises its own error types
        raise ValueError(f"{file} cannot be read ({str(error)[:120]}); the file may be truncated or corrupt") from error
    for key, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ValueError(f"{file} holds weights that are not finite ({bad} of {tensor.numel()} values of '{key}' are NaN or "
                             "infinite); the file is damaged or its training diverged: train it again or restore the file")  # fmt: skip
    return tensors


def _untie(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory (tied weights): give each its own copy."""
    seen: set[int] = set()
    out = {}
    for key, tensor in tensors.items():
        ptr = tensor.untyped_storage().data_ptr() if tensor.numel() else -1
        out[key] = tensor.clone() if ptr in seen else tensor
        seen.add(ptr)
    return out

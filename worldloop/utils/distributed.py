"""Data parallelism over the processes that ``torchrun`` starts, in one place.

``torchrun --nproc-per-node N -m worldloop train-wm ...`` starts N copies of the verb with RANK, WORLD_SIZE and
LOCAL_RANK in their environment; :func:`init` joins them into one process group (NCCL on GPUs, gloo on CPU) and
gives each the GPU of its LOCAL_RANK. The training loops then do what one process does, with three differences:

* every rank draws the same global batch (same seed, same generator) and trains on its own rows of it
  (:func:`rows`), so a run is the same training whatever the number of processes;
* after ``backward`` the gradients are averaged over the ranks (:func:`average_gradients`), so every rank takes
  the same optimizer step and the weights stay equal;
* rank 0 alone writes checkpoints, TensorBoard, results and progress bars (:func:`is_main`); every rank resumes.

Evaluations that run many independent episodes (RL's reality checks and the judge's replay calibration,
:class:`worldloop.diagnostics.reality.RealityCheck`) are dealt out instead: each rank runs every N-th episode
(:func:`dealt`), and the per-episode records come back together in their one-process order on every rank
(:func:`gather_dealt`), which then summarises them as one process would.

Not launched by torchrun (no WORLD_SIZE in the environment), nothing here does anything: rank 0 of 1.
"""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta
from typing import Any, Iterable, Iterator

import torch
import torch.distributed as dist


def launched() -> bool:
    """Whether this process was started by torchrun (or anything else that sets its variables)."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


_alone = False  # set by :func:`alone`


def active() -> bool:
    """Whether this process is one of several in a process group (and not, for now, working :func:`alone`)."""
    return not _alone and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@contextlib.contextmanager
def alone() -> Iterator[bool]:
    """``with alone() as working:`` rank 0 (``working`` True) does the work inside as if it were the only process (the
    one-process baseline of a scaling benchmark); the other ranks (False) skip it and wait for it at the end."""
    global _alone
    working = is_main()
    _alone = working
    try:
        yield working
    finally:
        _alone = False
        barrier()


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0)) if active() else 0


def is_main() -> bool:
    """Rank 0: the process that writes files, logs and progress bars."""
    return rank() == 0


def init(device_name: str = "auto") -> None:
    """Join torchrun's process group once: NCCL when this process trains on a GPU (``device_name`` 'auto' with a
    GPU visible, or 'cuda...'), gloo otherwise. Does nothing when not launched by torchrun."""
    if not launched() or (dist.is_available() and dist.is_initialized()):
        return
    on_gpu = torch.cuda.is_available() and (device_name == "auto" or device_name.startswith("cuda"))
    if on_gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    # rank 0 alone runs some long stretches (encoding the clips, RL's refinement rounds) while the others wait for it
    dist.init_process_group("nccl" if on_gpu else "gloo", timeout=timedelta(hours=2))


def close() -> None:
    """Leave the process group (at the end of a verb)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def device_of_rank(device: torch.device) -> torch.device:
    """``device`` for this rank: a CUDA device becomes the GPU of LOCAL_RANK, anything else stays."""
    return torch.device("cuda", local_rank()) if device.type == "cuda" and active() else device


def share(total: int, what: str) -> int:
    """This rank's part of ``total`` items (a global batch, the RL groups); ``what`` names the setting in the error."""
    if total % world_size():
        raise ValueError(f"{what}={total} cannot be split evenly over {world_size()} processes: make it a multiple of {world_size()}")
    return total // world_size()


def rows(total: int, what: str) -> slice:
    """This rank's rows of a global batch of ``total`` rows (the setting ``what``, named if it does not split evenly)."""
    part = share(total, what)
    return slice(rank() * part, (rank() + 1) * part)


def dealt(total: int) -> range:
    """This rank's items of ``total`` dealt in turn, as cards: rank r of W holds items r, r + W, r + 2W, ... (all of
    them in one process). Dealt rather than cut in blocks, each rank gets a mix of a task-major list's tasks."""
    return range(rank(), total, world_size())


def gather_dealt(mine: list[Any]) -> list[Any]:
    """Every rank's ``mine`` (its :func:`dealt` items' records, in order, picklable) back in the order of the items
    they were dealt from, on every rank."""
    if not active():
        return list(mine)
    every = gather_objects(list(mine))
    joined: list[Any] = [None] * sum(len(part) for part in every)
    for position, part in enumerate(every):
        joined[position :: world_size()] = part
    return joined


def seed_per_rank(seed: int) -> None:
    """Give each rank its own global random stream (rank 0 keeps ``seed``): for what each rank draws for itself, such
    as the actions its own environments sample. Does nothing in one process."""
    if active():
        torch.manual_seed(seed + 1_000_003 * rank())


def barrier() -> None:
    if active():
        dist.barrier()


def _backend_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


@torch.no_grad()
def average_gradients(parameters: Iterable[torch.nn.Parameter]) -> None:
    """Average the gradients of ``parameters`` over the ranks, in one all-reduce (a parameter without a gradient on
    this rank counts as a zero gradient, so every rank reduces the same tensors). Call it between ``backward`` and
    gradient clipping: every rank then clips and steps alike."""
    if not active():
        return
    parameters = [p for p in parameters if p.requires_grad]
    for p in parameters:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in parameters]
    flat = torch.cat([g.flatten().float() for g in grads]).to(_backend_device())
    dist.all_reduce(flat)
    flat /= world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


@torch.no_grad()
def broadcast_parameters(module: torch.nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank (the ranks start from the same weights whatever their own
    initialisation did)."""
    broadcast_tensors([*module.parameters(), *module.buffers()])


@torch.no_grad()
def broadcast_tensors(tensors: Iterable[torch.Tensor]) -> None:
    """Rank 0's values of ``tensors`` (parameters, buffers) on every rank, in place."""
    if not active():
        return
    for tensor in tensors:
        moved = tensor.data.to(_backend_device())
        dist.broadcast(moved, 0)
        tensor.data.copy_(moved)


def all_sum(values: torch.Tensor | list[float] | float) -> torch.Tensor:
    """The element-wise sum over the ranks of ``values`` (returned as a float64 CPU tensor)."""
    tensor = torch.as_tensor(values, dtype=torch.float64).clone()
    if active():
        moved = tensor.to(_backend_device())
        dist.all_reduce(moved)
        tensor = moved.cpu()
    return tensor


def all_mean(value: float) -> float:
    """The mean over the ranks of one number (each rank's number weighs the same)."""
    return float(all_sum(value)) / world_size()


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    if not active():
        return [obj]
    gathered: list[Any] = [None] * world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def reduce_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """One iteration's metrics over all ranks: the mean of each over the ranks that report it (the ranks hold equal
    shares), the largest of a '..._max' and the smallest of a '..._min'."""
    if not active():
        return metrics
    every = gather_objects(metrics)
    names = list(dict.fromkeys(name for one in every for name in one))
    reduced = {}
    for name in names:
        values = [one[name] for one in every if name in one]
        reduced[name] = max(values) if name.endswith("_max") else min(values) if name.endswith("_min") else sum(values) / len(values)
    return reduced


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` (picklable) on every rank."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, 0)
    return box[0]


class _Silent:
    """Stands in for a SummaryWriter on ranks other than 0."""

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


def summary_writer(log_dir: str, **kwargs: Any) -> Any:
    """A TensorBoard SummaryWriter on rank 0, one that writes nothing on the other ranks."""
    if not is_main():
        return _Silent()
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir, **kwargs)

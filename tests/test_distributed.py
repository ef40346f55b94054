"""Data parallelism on CPU with gloo: 2 processes train like 1 on the same global batch, resume, and only rank 0 writes."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import os
import socket
import tempfile

import pytest
import torch
from safetensors.torch import load_file

from worldloop.utils import distributed

CPU = torch.device("cpu")


def run_ranks(function, world_size: int, *args):
    """``function(*args)`` in ``world_size`` fresh processes joined by gloo, as torchrun would start them; their
    return values in rank order."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as results:
        torch.multiprocessing.spawn(_rank_main, args=(world_size, port, results, function, args), nprocs=world_size, join=True)
        return [torch.load(Path(results) / f"{rank}.pt", weights_only=False) for rank in range(world_size)]


def _rank_main(rank: int, world_size: int, port: int, results: str, function, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    distributed.init("cpu")
    try:
        torch.save(function(*args), Path(results) / f"{rank}.pt")
    finally:
        distributed.close()


def _counting_writes(function, *args):
    """``function(*args)`` while counting the checkpoint files and TensorBoard writers this process makes."""
    from worldloop.utils import checkpoint

    counts = {"checkpoint_files": 0, "summary_writers": 0}
    real_save, real_writer = checkpoint.save_file, distributed.summary_writer

    def save_file(*a, **k):
        counts["checkpoint_files"] += 1
        return real_save(*a, **k)

    def summary_writer(*a, **k):
        writer = real_writer(*a, **k)
        counts["summary_writers"] += not isinstance(writer, distributed._Silent)
        return writer

    checkpoint.save_file, distributed.summary_writer = save_file, summary_writer
    return function(*args), counts


# ------------------------------------------------------------------------------------------------- world model


def _world_model_step(out: Path):
    from _worldmodel_fixtures import square_episodes, tiny_vae
    from worldloop.worldmodel.configuration import WorldModelConfig
    from worldloop.worldmodel.train import train_world_model

    config = WorldModelConfig(steps=1, batch_size=4, lr=1e-2, log_every=1, sample_every=1000, checkpoint_every=1000, sampling_steps=2,
                              clip_stride=4, action_dropout=0.5)  # fmt: skip
    _, counts = _counting_writes(train_world_model, config, square_episodes(3, seed=1, length=16), tiny_vae(), out, CPU)
    return counts


def test_world_model_step_on_two_ranks_matches_one_process(tmp_path):
    """One optimizer step on a global batch of 4 clips, 2 per gloo rank, gives the weights of one process's step on the
    same 4 clips (same noise, same dropped actions); rank 0 alone writes the checkpoint, TensorBoard and the model."""
    one = _world_model_step(tmp_path / "one")
    two = run_ranks(_world_model_step, 2, tmp_path / "two")
    assert one["checkpoint_files"] == 2 and [c["checkpoint_files"] for c in two] == [2, 0]  # dit and ema
    assert [c["summary_writers"] for c in two] == [1, 0]
    assert len(list((tmp_path / "two" / "tb").iterdir())) == 1
    assert (tmp_path / "two" / "results.json").is_file()
    first = load_file(tmp_path / "one" / "checkpoints" / "step_000000001" / "dit.safetensors")
    second = load_file(tmp_path / "two" / "checkpoints" / "step_000000001" / "dit.safetensors")
    for name, weight in first.items():
        torch.testing.assert_close(second[name], weight, rtol=1e-4, atol=1e-5, msg=name)
    # the step moved the weights far beyond that tolerance, so the comparison can fail: after the first step the EMA
    # holds 0.9 of it (decay 1/10), so the step is 10 times the distance between the weights and their EMA
    ema = load_file(tmp_path / "one" / "checkpoints" / "step_000000001" / "ema.safetensors")
    assert max(10 * float((first[name] - ema[name]).abs().max()) for name in first) > 5e-4

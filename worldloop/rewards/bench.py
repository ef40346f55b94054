"""``worldloop bench reward``: judge throughput in windows/s at several batch sizes.

Measured: the ResNet-18 classifier, and TOPReward with a random-weight Qwen3-VL at tiny and (on
GPU) at the full Qwen3-VL-8B dimensions (8.77 B parameters, bf16), built from a config: the
speed is the real model's, the scores are meaningless (real weights are not available here).
TOPReward is timed with its inputs built on the device (``inputs`` column ``device``, the default) and
by the transformers processor (``processor``); ``prep%`` is the share of a call spent building the
inputs (timed alone), the rest being the model's forward.

    worldloop bench reward [--sizes 64 128 256] [--out TABLE.txt]
    python -m worldloop.rewards.bench --out OUT_DIR [--image-size 128 256] [--sizes tiny 8b] [--batches 1 8 32 64]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from worldloop.utils.device import resolve_device
from worldloop.utils.timing import seconds_per_call

HEADER = f"{'judge':<16}{'inputs':>10}{'image':>6}{'batch':>6}{'tokens':>8}{'ms/call':>10}{'windows/s':>11}{'prep%':>7}"


def format_row(row: dict) -> str:
    head = f"{row['judge']:<16}{row.get('inputs', '-'):>10}{row['image_size']:>6}{row['batch']:>6}{row.get('tokens_per_window', ''):>8}"
    if "error" in row:
        return head + f"  {row['error']}"
    share = f"{100 * row['inputs_share']:>7.1f}" if "inputs_share" in row else f"{'-':>7}"
    return head + f"{row['ms']:>10.1f}{row['windows_per_s']:>11.1f}" + share


def _emit(rows: list[dict], row: dict) -> None:
    rows.append(row)
    print(format_row(row), flush=True)


def bench_classifier(device: torch.device, image_size: int, input_size: int, batches: list[int], repeats: int) -> list[dict]:
    from worldloop.rewards.classifier import SuccessClassifier

    judge = SuccessClassifier(["task"], input_size=input_size).to(device).eval()
    rows = []
    for batch in batches:
        windows = torch.randint(0, 256, (batch, 1, image_size, image_size, 3), dtype=torch.uint8, device=device)
        seconds = seconds_per_call(lambda: judge.score(windows, ["task"] * batch), device, repeats)
        _emit(rows, {"judge": "classifier", "image_size": image_size, "batch": batch, "ms": 1e3 * seconds, "windows_per_s": batch / seconds})
    return rows


def bench_topreward(device: torch.device, size: str, image_sizes: list[int], batches: list[int], repeats: int, reward_config: Any) -> list[dict]:
    from worldloop.rewards.qwen_random import build_processor, build_qwen_tokenizer, build_random_qwen3_vl
    from worldloop.rewards.topreward import TOPReward

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    start = time.perf_counter()
    model = build_random_qwen3_vl(size, dtype=dtype, device=device)
    processor = build_processor(build_qwen_tokenizer())
    build_seconds = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    rows = []
    instruction = "Open the drawer by pulling its handle."
    for image_size in image_sizes:
        for on_device in (True, False):
            for batch in batches:
                config = dataclasses.replace(reward_config.topreward, max_batch=batch)  # one forward per call
                judge = TOPReward(model, processor, config, device, on_device=on_device)
                windows = torch.randint(0, 256, (batch, judge.window, image_size, image_size, 3), dtype=torch.uint8, device=device)
                instructions = [instruction] * batch
                row = {"judge": f"topreward-{size}", "inputs": "device" if on_device else "processor", "params_billion": params / 1e9,
                       "image_size": image_size, "batch": batch}  # fmt: skip
                row["tokens_per_window"] = int(judge.inputs(windows[:1], [instruction])["input_ids"].shape[1])
                try:
                    seconds = seconds_per_call(lambda: judge.score(windows, instructions), device, repeats)
                    inputs_seconds = seconds_per_call(lambda: judge.inputs(windows, instructions), device, repeats)
                except torch.OutOfMemoryError:
                    _emit(rows, {**row, "error": "out of memory"})
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                    break
                _emit(rows, {**row, "ms": 1e3 * seconds, "windows_per_s": batch / seconds, "inputs_ms": 1e3 * inputs_seconds,
                             "inputs_share": min(inputs_seconds / seconds, 1.0), "build_s": build_seconds})  # fmt: skip
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def format_table(rows: list[dict]) -> str:
    return "\n".join([HEADER] + [format_row(row) for row in rows])


def bench_reward(
    config: Any,
    out: str | Path | None = None,
    sizes: tuple[str, ...] | None = None,
    image_sizes: tuple[int, ...] | None = None,
    batches: tuple[int, ...] | None = None,
) -> list[dict]:
    """Throughput rows (printed as a table; written to ``out/bench_reward.json`` when ``out`` is given)."""
    device = resolve_device(config.device)
    on_gpu = device.type == "cuda"
    sizes = sizes or (("tiny", "8b") if on_gpu else ("tiny",))
    image_sizes = list(image_sizes or (config.sim.image_size,))
    batches = list(batches or ((1, 8, 32, 64) if on_gpu else (1, 4)))
    repeats = 3 if on_gpu else 1
    rows = []
    print(HEADER, flush=True)
    for image_size in image_sizes:
        rows += bench_classifier(device, image_size, config.reward.classifier.input_size, batches + ([256] if on_gpu else []), repeats)
    for size in sizes:
        rows += bench_topreward(device, size, image_sizes, batches, repeats, config.reward)
    if out is not None:
        from worldloop.utils.io import atomic_write_json, atomic_write_text

        atomic_write_json(Path(out) / "bench_reward.json", {"device": str(device), "torch": torch.__version__, "rows": rows})
        atomic_write_text(Path(out) / "bench_reward.txt", format_table(rows) + "\n")
    return rows


def bench_reward_target(args: argparse.Namespace, config: Any) -> int:
    """``worldloop bench reward [--sizes 64 128 256] [--out FILE]``: judge throughput table."""
    rows = bench_reward(config, image_sizes=tuple(args.sizes))
    if args.out:
        from worldloop.utils.io import atomic_write_text

        atomic_write_text(args.out, format_table(rows) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    from worldloop.config import load_config

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None)
    parser.add_argument("--preset", default="tiny-cpu")
    parser.add_argument("--sizes", nargs="*", default=None, help="Qwen3-VL sizes: tiny, 8b")
    parser.add_argument("--image-size", nargs="*", type=int, default=None, help="window frame sides in pixels")
    parser.add_argument("--batches", nargs="*", type=int, default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    config = load_config(args.preset, args.overrides)
    bench_reward(config, args.out, tuple(args.sizes or ()) or None, tuple(args.image_size or ()) or None, tuple(args.batches or ()) or None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Open-loop evaluation of a world model on held-out real trajectories.

Every held-out episode starts from its real first frame; the world model then replays the recorded
actions chunk by chunk with no real frame ever fed back. Generated frame k is compared with real
frame k. Per horizon h the metrics average frames 1..h over the episodes at least h + 1 frames long,
next to the copy-last-frame baseline (every prediction = the last real frame the model saw, o_0),
with the standard error of the model's margin over the episodes (the margins are paired: same frames).

Does the model follow the actions? The same episodes are rolled out a second time from the same first
frames and seeds, driven by the next held-out episode's actions instead of their own. The PSNR lost
(Genie's controllability ΔPSNR) says how much the actions decide what the model renders: near 0, it
plays the task's usual motion whatever the policy does, and an imagined rollout succeeds as often as the
data did. Compare it between models on the same episodes: how far another episode's actions lead
elsewhere depends on the data. With a simulator (eval-wm --counterfactual) the swapped-actions frames are
also checked against the simulator's under the same actions (``counterfactual.py``): how far they *should* go.

Does the model keep what does not move? ``psnr_still`` is the PSNR over the pixels where the real frame
still equals the first one (every channel within ``STILL_TOLERANCE``): the table, and the objects before
the robot touches them. Copy-last-frame is exact there by construction, so it has no baseline; it is
for comparing models. Small objects that fade cost the whole-frame PSNR little and this much more
(the 2026-12-01 fading-objects run's models lost the task objects within a few chunks).

What caps the model? ``vae_psnr`` is the VAE's own reconstruction of the real frames, encoded and decoded chunk
by chunk (each chunk after the frame before it): a world model decoded through this VAE renders the future about
that well at best, so a world model near it needs a better VAE, one far below it a better DiT.

Every metric is also reported per task (``per_task``, keyed by instruction): the pooled rows can hide
the one scene a model renders badly.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from worldloop.utils.io import atomic_write_json
from worldloop.worldmodel.metrics import STILL_TOLERANCE, feature_metrics_status, masked_psnr, psnr, sharpness, ssim
from worldloop.worldmodel.rollout import WorldModel, autocast


@torch.no_grad()
def open_loop(
    model: WorldModel, episodes: Sequence[Any], horizon: int, seed: int = 0, actions_of: Sequence[Any] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """Roll all ``episodes`` out together for ``horizon`` frames, driven by the recorded actions of
    ``actions_of`` (default: the episodes themselves; one per episode).

    Returns real (N, horizon, H, W, 3), generated (N, horizon, H, W, 3) (frames 1..horizon), a
    validity mask (N, horizon) (the episode has that frame) and the rollout's new frames per second."""
    chunk = model.chunk_size
    chunks = math.ceil(horizon / chunk)
    length = chunks * chunk
    first = torch.stack([torch.as_tensor(np.asarray(e.frames[0])) for e in episodes])
    actions_of = episodes if actions_of is None else actions_of
    if len(actions_of) != len(episodes):
        raise ValueError(f"open_loop: {len(actions_of)} action sequences for {len(episodes)} episodes")
    real, actions, valid = [], [], []
    for e, driver in zip(episodes, actions_of):
        frames, acts = np.asarray(e.frames), np.asarray(driver.actions, dtype=np.float32)
        have = min(len(frames) - 1, length)
        pad_frames = np.repeat(frames[-1:], length - have, axis=0)
        real.append(np.concatenate([frames[1 : 1 + have], pad_frames])[:length])
        acts = acts[:length]
        actions.append(np.concatenate([acts, np.zeros((length - len(acts), acts.shape[1]), np.float32)]))
        valid.append(np.arange(length) < have)
    real_t = torch.as_tensor(np.stack(real))
    actions_t = torch.as_tensor(np.stack(actions)).to(model.device)
    model.reset(first.to(model.device), seeds=[seed + i for i in range(len(episodes))])
    generated = []
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for c in range(chunks):
        generated.append(model.step(actions_t[:, c * chunk : (c + 1) * chunk]))
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    fps = len(episodes) * length / max(seconds, 1e-9)
    return real_t[:, :horizon], torch.cat(generated, dim=1).cpu()[:, :horizon], torch.as_tensor(np.stack(valid))[:, :horizon], fps


def horizon_metrics(
    real: torch.Tensor, generated: torch.Tensor, baseline: torch.Tensor, valid: torch.Tensor, horizons: Sequence[int],
    other_actions: torch.Tensor | None = None, codec: torch.Tensor | None = None,
) -> dict[str, Any]:
    """PSNR/SSIM averaged over frames 1..h, per horizon, for the model and copy-last-frame, and the
    standard error over episodes of the model's margin (model - copy, each episode's mean over 1..h), and the
    model's sharpness over the real frames' (``metrics.sharpness``; 1: as much fine detail, < 1: blurrier).
    With ``other_actions`` (the model's frames under other episodes' actions): their PSNR and the
    action ΔPSNR (model - other actions) with its standard error over episodes. ``baseline`` is the first
    frame repeated (copy-last-frame in open loop): ``psnr_still`` is measured where the real frame equals it.
    With ``codec`` (the real frames through the VAE alone): ``vae_psnr``, the ceiling of a model decoded through it."""
    model_psnr, model_ssim = psnr(generated, real), ssim(generated, real)  # (N, T)
    model_sharpness, real_sharpness = sharpness(generated), sharpness(real)
    still = (real.short() - baseline.short()).abs().amax(dim=-1) <= STILL_TOLERANCE  # (N, T, H, W)
    still_psnr = masked_psnr(generated, real, still)  # NaN where nothing stayed still
    base_psnr, base_ssim = psnr(baseline, real), ssim(baseline, real)
    other_psnr = psnr(other_actions, real) if other_actions is not None else None
    codec_psnr = psnr(codec, real) if codec is not None else None
    results = {}
    for h in horizons:
        episodes = valid[:, h - 1]  # episodes that have frame h
        if not episodes.any():
            continue
        mask = valid[episodes, :h].float()

        def mean(values: torch.Tensor) -> float:  # over the frames each episode has, skipping NaN (psnr_still where nothing stayed)
            return mean_finite(values[episodes, :h], mask)

        def margin_stderr(model: torch.Tensor, copy: torch.Tensor) -> float:
            per_episode = ((model - copy)[episodes, :h] * mask).sum(1) / mask.sum(1)
            return float(per_episode.std() / math.sqrt(len(per_episode))) if len(per_episode) > 1 else float("nan")

        real_detail = mean(real_sharpness)
        results[str(h)] = {
            "episodes": int(episodes.sum()),
            "psnr": mean(model_psnr), "copy_last_frame_psnr": mean(base_psnr), "psnr_margin_stderr": margin_stderr(model_psnr, base_psnr),
            "ssim": mean(model_ssim), "copy_last_frame_ssim": mean(base_ssim), "ssim_margin_stderr": margin_stderr(model_ssim, base_ssim),
            "psnr_at_h": float(model_psnr[episodes, h - 1].mean()), "copy_last_frame_psnr_at_h": float(base_psnr[episodes, h - 1].mean()),
            "psnr_still": mean(still_psnr), "still_fraction": mean(still.float().mean(dim=(-2, -1))),
            "sharpness_ratio": mean(model_sharpness) / real_detail if real_detail > 0 else float("nan"),
        }  # fmt: skip
        if codec_psnr is not None:
            results[str(h)]["vae_psnr"] = mean(codec_psnr)
        if other_psnr is not None:
            row, other = results[str(h)], mean(other_psnr)
            row |= {"psnr_other_actions": other, "action_delta_psnr": row["psnr"] - other,
                    "action_delta_psnr_stderr": margin_stderr(model_psnr, other_psnr)}
    return results


def per_task_metrics(
    episodes: Sequence[Any], real: torch.Tensor, generated: torch.Tensor, baseline: torch.Tensor, valid: torch.Tensor,
    horizons: Sequence[int], other_actions: torch.Tensor | None = None, codec: torch.Tensor | None = None,
) -> dict[str, dict[str, Any]]:
    """``horizon_metrics`` of each task's episodes (keyed by instruction; {} for a single task): a model can
    render one scene well and another badly (the window tasks' thin frames blur from the first chunk, CPU
    follow-up of the 2026-12-02 chunk-by-chunk-decoding run), and RL in imagination is only as good as its tasks' scenes."""
    tasks = [getattr(e, "instruction", "") for e in episodes]
    if len(set(tasks)) < 2:
        return {}
    rows = {}
    for task in sorted(set(tasks)):
        index = torch.tensor([i for i, t in enumerate(tasks) if t == task])
        other = other_actions[index] if other_actions is not None else None
        through = codec[index] if codec is not None else None
        rows[task] = horizon_metrics(real[index], generated[index], baseline[index], valid[index], horizons, other, through)
    return rows


def per_episode_metrics(
    episodes: Sequence[Any], real: torch.Tensor, generated: torch.Tensor, baseline: torch.Tensor, valid: torch.Tensor, horizons: Sequence[int],
    other_actions: torch.Tensor | None = None,
) -> list[dict[str, Any]]:
    """Each episode's PSNR over frames 1..h (the model's, copy-last-frame's and, with ``other_actions``, the model's
    under the next episode's actions) at every horizon it reaches, with its dataset index and instruction: two
    world models (or two samplings of one) evaluated on the same episodes can then be compared episode by
    episode (``paired_change``), not only by their means."""
    curves = {"psnr": psnr(generated, real), "copy_last_frame_psnr": psnr(baseline, real)}
    if other_actions is not None:
        curves["psnr_other_actions"] = psnr(other_actions, real)
    rows = []
    for i, episode in enumerate(episodes):
        reached = [h for h in horizons if bool(valid[i, h - 1])]
        row = {"episode": int(getattr(episode, "index", i)), "instruction": getattr(episode, "instruction", "")}
        rows.append(row | {key: {str(h): float(curve[i, :h].mean()) for h in reached} for key, curve in curves.items()})
    return rows


def paired_change(before: dict[str, Any], after: dict[str, Any], key: str = "psnr") -> dict[str, dict[str, float]]:
    """Per horizon, the mean change of ``key`` from ``before`` to ``after`` (two eval-wm metrics.json dicts) over
    the episodes both reached, with its paired standard error: sampling choices such as action guidance move
    these numbers by less than their unpaired standard errors, which the shared episodes mostly cancel.
    ``key`` is a per-episode curve ("psnr", "copy_last_frame_psnr", "psnr_other_actions") or
    "action_delta_psnr" (psnr - psnr_other_actions)."""

    def values(metrics: dict[str, Any], h: str) -> dict[int, float]:
        rows = metrics.get("per_episode")
        if rows is None:
            raise ValueError("metrics without per_episode values (eval-wm before they were written): nothing to pair")
        if key == "action_delta_psnr":
            if any("psnr_other_actions" not in row for row in rows):
                raise ValueError("metrics without per-episode psnr_other_actions (one episode, or eval-wm before they were written)")
            return {row["episode"]: row["psnr"][h] - row["psnr_other_actions"][h] for row in rows if h in row["psnr"]}
        return {row["episode"]: row[key][h] for row in rows if h in row[key]}

    changes = {}
    for h in before.get("horizons", {}):
        a, b = values(before, h), values(after, h)
        shared = sorted(a.keys() & b.keys())
        if not shared:
            continue
        diff = torch.tensor([b[e] - a[e] for e in shared], dtype=torch.float64)
        stderr = float(diff.std() / math.sqrt(len(shared))) if len(shared) > 1 else float("nan")
        changes[h] = {"change": float(diff.mean()), "stderr": stderr, "episodes": len(shared)}
    return changes


def recipe_runs(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The margins over copy-last-frame of one recipe's training runs (name -> its eval-wm metrics.json dict), per
    horizon every run reached: each run's margin and its SE over episodes, the mean over runs, and the spread between
    them (the largest margin less the smallest): one training run is no measurement of a recipe, and the spread
    between two says how far one run's number lies from the next's."""
    if len(runs) < 2:
        raise ValueError(f"a recipe's spread needs two or more training runs' eval-wm metrics, got {len(runs)}")
    horizons = [h for h in next(iter(runs.values()))["horizons"] if all(h in m["horizons"] for m in runs.values())]
    table = {}
    for h in horizons:
        margins = {name: m["horizons"][h]["psnr"] - m["horizons"][h]["copy_last_frame_psnr"] for name, m in runs.items()}
        table[h] = {"runs": {name: {"margin": margins[name], "stderr": m["horizons"][h]["psnr_margin_stderr"],
                                    "episodes": m["horizons"][h]["episodes"]} for name, m in runs.items()},
                    "mean": sum(margins.values()) / len(margins), "spread": max(margins.values()) - min(margins.values())}  # fmt: skip
    return {"runs": list(runs), "horizons": table}


def recipe_runs_table(result: dict[str, Any]) -> str:
    """:func:`recipe_runs` as a markdown table: a row per horizon, a column per run, the mean and the spread."""
    names = result["runs"]
    lines = ["| frames | " + " | ".join(names) + " | mean | spread |", "| ---: |" + " ---: |" * (len(names) + 2)]
    for h, row in result["horizons"].items():
        cells = [f"{row['runs'][n]['margin']:+.2f} ± {row['runs'][n]['stderr']:.2f} ({row['runs'][n]['episodes']})" for n in names]
        lines.append(f"| {h} | " + " | ".join(cells) + f" | {row['mean']:+.2f} | {row['spread']:.2f} |")
    return "\n".join(lines)


def mean_finite(values: torch.Tensor, weights: torch.Tensor) -> float:
    """The ``weights``-weighted mean of the finite ``values`` (NaN when there are none)."""
    finite = torch.isfinite(values)
    weights = weights * finite
    return float((values.nan_to_num() * weights).sum() / weights.sum()) if weights.sum() > 0 else float("nan")


@torch.no_grad()
def through_vae(model: WorldModel, first: torch.Tensor, real: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """The real frames 1..T (N, T, H, W, 3) encoded by the model's VAE and decoded by its decoder chunk by chunk, as the
    world model renders them: each chunk of ``model.chunk_size`` frames as one clip after the frame before it (the last chunk
    padded with its last frame). What the VAE alone keeps of them, in clips as short as those it learned."""
    from worldloop.worldmodel.vae import decode, encode

    n, length = real.shape[:2]
    chunk = model.chunk_size
    pad = -length % chunk
    frames = torch.cat([first[:, None], real, real[:, -1:].expand(-1, pad, -1, -1, -1)], dim=1)  # (N, 1 + k chunk, ...)
    chunks = (length + pad) // chunk
    windows = torch.stack([frames[:, c * chunk : (c + 1) * chunk + 1] for c in range(chunks)], dim=1).flatten(0, 1)
    parts = []
    for start in range(0, len(windows), batch_size):
        with autocast(model.device):
            latents = encode(model.vae, windows[start : start + batch_size].to(model.device))
            parts.append(decode(getattr(model, "decoding_vae", model.vae), latents)[:, 1:].cpu())  # world_model.decoder's
    return torch.cat(parts).reshape(n, chunks * chunk, *real.shape[2:])[:, :length]


def strip(*videos: torch.Tensor, every: int = 8) -> np.ndarray:
    """One PNG-able image: every ``every``-th frame of each (T, H, W, 3) video, one row per video (real on top,
    generated below)."""
    length = videos[0].shape[0]
    picks = list(range(every - 1, length, every)) or [length - 1]
    return torch.cat([torch.cat([video[i] for i in picks], dim=1) for video in videos], dim=0).numpy()


def evaluate_world_model(
    model: WorldModel, episodes: Sequence[Any], horizons: Sequence[int], out: str | Path, fps: int = 20, videos: int = 4, seed: int = 0,
    sim_config: Any = None,
) -> dict[str, Any]:
    """Open-loop metrics for every horizon the data allows; writes OUT/metrics.json, mp4s and PNG strips.
    With ``sim_config``, the swapped-actions rollouts are checked against the simulator's (``counterfactual``)."""
    from PIL import Image

    from worldloop.data.video import write_mp4
    from worldloop.utils.draw import side_by_side

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not episodes:
        raise ValueError("eval-wm: no held-out episodes to evaluate on")
    longest = max(len(e.frames) - 1 for e in episodes)
    usable = sorted(h for h in horizons if h <= longest)
    skipped = sorted(h for h in horizons if h > longest)
    if not usable:
        raise ValueError(f"eval-wm: every horizon {list(horizons)} is longer than the longest held-out episode ({longest} frames after the first)")
    if sim_config is not None:  # before minutes of rollouts
        from worldloop.worldmodel.counterfactual import counterfactual_metrics, recorded_starts, simulate

        if len(episodes) < 2:
            raise ValueError("eval-wm: the simulator check swaps actions between episodes and needs at least 2 held-out episodes")
        recorded_starts(episodes)
    real, generated, valid, rollout_fps = open_loop(model, episodes, max(usable), seed)
    first = torch.stack([torch.as_tensor(np.asarray(e.frames[0])) for e in episodes])
    baseline = first[:, None].expand_as(real)
    codec = through_vae(model, first, real)
    other, drivers = None, list(episodes[1:]) + [episodes[0]]
    if len(episodes) > 1:  # the same starts and seeds, each driven by the next episode's actions
        _, other, _, _ = open_loop(model, episodes, max(usable), seed, actions_of=drivers)
    metrics: dict[str, Any] = {
        "horizons": horizon_metrics(real, generated, baseline, valid, usable, other, codec),
        "per_task": per_task_metrics(episodes, real, generated, baseline, valid, usable, other, codec),
        "per_episode": per_episode_metrics(episodes, real, generated, baseline, valid, usable, other),
        "skipped_horizons": skipped,
        **feature_metrics_status(),
        "rollout_frames_per_second": rollout_fps,
        "num_envs": len(episodes),
        "device": str(model.device),
        "sampling": {"steps": model.sampling_steps, "shift": model.shift, "decode": model.decode_mode, "memory_noise": model.memory_noise,
                     "decoder": getattr(model, "spec", {}).get("decoder")},
        "model": {k: model.spec[k] for k in ("size", "image_size", "context_channels")},
    }
    if sim_config is not None:  # both action sequences in one simulator run of 2N environments
        simulated, running = simulate(sim_config, list(episodes) * 2, drivers + list(episodes), max(usable))
        (simulated_other, simulated_own), (running_other, running_own) = simulated.chunk(2), running.chunk(2)
        compared = valid & running_other & running_own
        metrics["counterfactual"] = counterfactual_metrics(real, generated, other, simulated_other, simulated_own, compared, usable)
    for i in range(min(videos, len(episodes))):
        n = int(valid[i].sum())
        if n == 0:
            continue
        write_mp4(out / f"episode_{i:02d}_real_vs_generated.mp4", side_by_side(real[i, :n], generated[i, :n]), fps=fps)
        Image.fromarray(strip(real[i, :n], generated[i, :n])).save(out / f"episode_{i:02d}_strip.png")
        n = int(compared[i].sum()) if sim_config is not None else 0
        if n:  # rows: recorded, model (own actions), simulator and model under the swap
            Image.fromarray(strip(real[i, :n], generated[i, :n], simulated_other[i, :n], other[i, :n])).save(out / f"episode_{i:02d}_counterfactual.png")
    atomic_write_json(out / "metrics.json", metrics)
    return metrics


def describe(metrics: dict[str, Any]) -> list[str]:
    """A few lines for a reader of :func:`evaluate_world_model`'s metrics: each horizon's PSNR and SSIM beside
    copy-last-frame's, and the rollout speed."""
    lines = []
    for horizon, m in metrics["horizons"].items():
        margin = m["psnr"] - m["copy_last_frame_psnr"]
        lines.append(f"{horizon} frames: PSNR {m['psnr']:.2f} dB, copy-last-frame {m['copy_last_frame_psnr']:.2f} "
                     f"(margin {margin:+.2f} ± {m['psnr_margin_stderr']:.2f}); SSIM {m['ssim']:.3f} vs {m['copy_last_frame_ssim']:.3f} "
                     f"(n={m['episodes']} episodes)")  # fmt: skip
    if metrics.get("skipped_horizons"):
        lines.append(f"horizons {metrics['skipped_horizons']} skipped: longer than every held-out episode")
    lines.append(f"rollouts at {metrics['rollout_frames_per_second']:.1f} new frames/s ({metrics['num_envs']} episodes at once on {metrics['device']})")
    return lines

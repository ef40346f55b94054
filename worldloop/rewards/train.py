"""Training the success classifier (``worldloop train-reward``), top to bottom.

labelled frames (see labels.py) -> class-balanced batches (half success, half failure) ->
world-model artefact augmentations on the device -> BCE -> AdamW step; every quarter of the steps
(:data:`worldloop.utils.checkpoint.EVALUATIONS`): held-out AUROC to TensorBoard and an atomic checkpoint (exact resume). At the end the
classifier is saved to ``RW/model`` and its held-out metrics to ``RW/metrics.json``.

Under torchrun (:mod:`worldloop.utils.distributed`) every rank draws and augments the same global batch and trains on
its own rows (BatchNorm statistics are each rank's, as with DDP), the gradients are averaged, and rank 0 alone
evaluates, checkpoints and writes the judge.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from worldloop.rewards.augment import world_model_artefacts
from worldloop.rewards.classifier import MODEL_SUBFOLDER, SuccessClassifier
from worldloop.rewards.configuration import RewardConfig
from worldloop.rewards.labels import LabelledFrames, require_success_frames
from worldloop.rewards.metrics import at_threshold, auroc, episode_verdict_metrics, max_kappa_threshold, per_episode, streak_scores, suggest_thresholds
from worldloop.utils import distributed
from worldloop.utils.checkpoint import evaluation_interval, resume, save_checkpoint
from worldloop.utils.device import autocast_dtype
from worldloop.utils.io import atomic_write_json

HELD_OUT_FRACTION = 0.2
"""Share of each task's episodes that train-reward keeps out for the judge's metrics and its threshold (RW/metrics.json)."""
WEIGHT_DECAY = 1e-4
"""AdamW weight decay of the classifier's training."""


@torch.no_grad()
def predict(model: SuccessClassifier, data: LabelledFrames, batch_size: int = 256) -> np.ndarray:
    """P(success) for every frame of ``data``."""
    model.eval()
    dtype = autocast_dtype(model.device)
    out = []
    for start in range(0, len(data), batch_size):
        frames = data.frames[start : start + batch_size]
        with torch.autocast(model.device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(model.prepare(frames), data.task[start : start + batch_size].to(model.device))
        out.append(torch.sigmoid(logits.float()).cpu())
    return torch.cat(out).numpy()


def episode_scores(probabilities: np.ndarray, data: LabelledFrames, verdict_every: int, success_chunks: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per episode of ``data``: its score under the rule the environments apply (an environment stepped in chunks of
    ``verdict_every`` actions judges the frames whose times are multiples of it, and calls the episode a success once
    ``success_chunks`` consecutive verdicts cross the threshold: :func:`~worldloop.rewards.metrics.streak_scores`),
    whether the simulator says the episode succeeded, and its task."""
    times, episode = data.time.cpu().numpy(), data.episode.cpu().numpy()
    judged = (times % verdict_every) == 0
    probabilities = np.asarray(probabilities, dtype=np.float64)
    ids, number, scores, success = per_episode(episode, probabilities, data.success.cpu().numpy(), judged)
    if success_chunks > 1:
        order = np.lexsort((times, number))  # by episode, then time
        order = order[judged[order]]
        bounds = np.searchsorted(number[order], np.arange(len(ids) + 1))
        scores = streak_scores([probabilities[order[a:b]] for a, b in zip(bounds[:-1], bounds[1:])], success_chunks)
    task = np.zeros(len(ids), dtype=np.int64)
    task[number] = data.task.cpu().numpy()
    return scores, success, task


def episode_summary(probabilities: np.ndarray, data: LabelledFrames, threshold: float, verdict_every: int, success_chunks: int = 1) -> dict:
    """How the frame threshold does where it is used: success_once per episode, judged vs the simulator."""
    scores, success, task = episode_scores(probabilities, data, verdict_every, success_chunks)
    return {**episode_verdict_metrics(success, scores >= threshold, task.tolist()), "verdict_every": verdict_every, "success_chunks": success_chunks}


def evaluate(model: SuccessClassifier, data: LabelledFrames, verdict_every: int = 8, success_chunks: int = 1) -> dict:
    probabilities = predict(model, data)
    labels = data.success.cpu().numpy()
    return {
        "frames": len(labels),
        "success_frames": int(labels.sum()),
        "auroc": auroc(probabilities, labels),
        "at_threshold": at_threshold(probabilities, labels, model.threshold),
        "suggested_threshold": suggest_thresholds(probabilities, labels),
        "episodes": episode_summary(probabilities, data, model.threshold, verdict_every, success_chunks),
    }


def balanced_batch(positives: torch.Tensor, negatives: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Indices: half drawn (with replacement) from the success frames, half from the failure frames."""
    half = batch_size // 2
    pick_pos = positives[torch.randint(len(positives), (half,), device=positives.device)]
    pick_neg = negatives[torch.randint(len(negatives), (batch_size - half,), device=negatives.device)]
    return torch.cat([pick_pos, pick_neg])


def train_classifier(
    train: LabelledFrames,
    held_out: LabelledFrames | None,
    reward: RewardConfig,
    out: str | Path,
    device: torch.device,
    seed: int = 0,
    also_evaluate: dict[str, LabelledFrames] | None = None,
    threshold_on: str = "held_out",
    verdict_every: int = 8,
    success_chunks: int = 1,
) -> dict:
    """Train, checkpoint, evaluate and save; returns the metrics written to ``out/metrics.json``
    (with one entry per ``also_evaluate`` set, e.g. held-out frames replayed in a world model).
    With reward.training.threshold_from other than 'fixed', the saved threshold is chosen on the frames
    named ``threshold_on`` ('held_out' or a key of ``also_evaluate``). ``verdict_every``: the chunk
    size of the environments the judge will end episodes in (one verdict per chunk), for the
    episode-level metrics and 'episode_kappa', whose standard-error rules reward.calibrate sets; ``success_chunks``: the
    consecutive verdicts that make an episode a success there (rl.success_chunks). ``reward``: the
    classifier to build (reward.classifier), how to train it (reward.training) and to choose its threshold."""
    from tqdm import tqdm

    out = Path(out)
    require_success_frames(train, held_out)
    torch.manual_seed(seed)
    config, architecture = reward.training, reward.classifier
    main, mine = distributed.is_main(), distributed.rows(config.batch_size, "reward.training.batch_size")
    model = SuccessClassifier(train.instructions, architecture.input_size, architecture.threshold, int(train.frames.shape[1]))
    if architecture.pretrained_backbone:
        model.load_backbone(architecture.pretrained_backbone)
    model.to(device)
    distributed.broadcast_parameters(model)
    # fused: one kernel per step, on the CPU too (unfused, the update of ResNet-18's 11M weights took 40 % of a CPU step)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=WEIGHT_DECAY, fused=True)
    step = 0
    resumed = resume(out, "train-reward", {"model": model}, {"optimizer": optimizer})
    if resumed is not None:
        step = resumed[1]

    data = train.to(device)  # uint8 frames live on the device: batches are gathered there
    positives = torch.nonzero(data.success).squeeze(1)
    negatives = torch.nonzero(~data.success).squeeze(1)
    dtype = autocast_dtype(device)
    writer = distributed.summary_writer(str(out / "tb"))
    progress = tqdm(total=config.steps, initial=step, desc="train-reward", unit="step", dynamic_ncols=True, disable=not main)
    while step < config.steps:
        model.train()
        index = balanced_batch(positives, negatives, config.batch_size)  # the global batch; this rank trains on ``mine``
        images = model.prepare(data.frames[index])
        images = world_model_artefacts(images)  # frames degraded like world-model output
        index, images = index[mine], images[mine]
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(images, data.task[index])
        loss = F.binary_cross_entropy_with_logits(logits.float(), data.success[index].float())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        distributed.average_gradients(model.parameters())
        optimizer.step()
        step += 1
        bce = distributed.all_mean(loss.item())
        progress.update(1)
        progress.set_postfix(loss=f"{bce:.3f}")
        writer.add_scalar("train/bce", bce, step)
        if step % evaluation_interval(config.steps) == 0 or step == config.steps:
            if main and held_out is not None and len(held_out):
                metrics = evaluate(model, held_out)
                if metrics["auroc"] is not None:
                    writer.add_scalar("held_out/auroc", metrics["auroc"], step)
            save_checkpoint(out, step, {"model": model}, {"optimizer": optimizer})
    progress.close()
    writer.close()
    if not main:  # rank 0 chooses the threshold, evaluates and saves the judge
        return distributed.broadcast_object(None)

    model.eval()
    chosen_on = choose_threshold(model, config.threshold_from, (also_evaluate or {}).get(threshold_on, held_out), threshold_on, verdict_every,
                                 reward.calibrate.threshold_tolerance_se, reward.calibrate.threshold_significance_se, success_chunks)  # fmt: skip
    model.save_pretrained(out / MODEL_SUBFOLDER)
    metrics = {
        "steps": step,
        "threshold": model.threshold,
        "threshold_chosen_on": chosen_on,
        "train": evaluate(model, train, verdict_every, success_chunks),
        "held_out": evaluate(model, held_out, verdict_every, success_chunks) if held_out is not None and len(held_out) else None,
        **{name: evaluate(model, frames, verdict_every, success_chunks) for name, frames in (also_evaluate or {}).items()},
    }
    atomic_write_json(out / "metrics.json", metrics)
    return distributed.broadcast_object(metrics)


def choose_threshold(model: SuccessClassifier, rule: str, data: LabelledFrames | None, name: str, verdict_every: int = 8,
                     tolerance_se: float = 0.0, significance_se: float = 0.0, success_chunks: int = 1) -> str:  # fmt: skip
    """Set ``model.threshold`` by ``rule`` on ``data`` (called ``name``): 'max_f1' or 'youden' over its
    frames, 'episode_kappa' over its episodes judged once per ``verdict_every`` frames (the highest
    threshold within ``tolerance_se`` standard errors of the best kappa, among those more than
    ``significance_se`` standard errors above 0). Returns what it was chosen on ('fixed' when the rule is
    'fixed', the data lack a class or no threshold agrees beyond chance, with a note)."""
    if rule == "fixed":
        return "fixed"
    labels = data.success.cpu().numpy() if data is not None and len(data) else np.zeros(0, bool)
    if rule == "episode_kappa" and len(labels):
        scores, success, task = episode_scores(predict(model, data), data, verdict_every, success_chunks)
        threshold = max_kappa_threshold(scores, success, task, tolerance_se, significance_se)
        if threshold is None:
            print(f"train-reward: threshold_from={rule} needs episodes that succeed and episodes that fail in '{name}', and a "
                  f"threshold whose kappa is more than {significance_se:g} SE above 0; keeping threshold {model.threshold}")  # fmt: skip
            return "fixed"
        model.threshold = threshold
        streak = f", a success after {success_chunks} in a row" if success_chunks > 1 else ""
        return f"{rule} on {name} ({len(scores)} episodes, a verdict every {verdict_every} frames{streak}, the highest within {tolerance_se:g} SE of the best)"
    if not labels.any() or labels.all():
        print(f"train-reward: threshold_from={rule} needs success and failure frames in '{name}'; keeping threshold {model.threshold}")
        return "fixed"
    model.threshold = float(suggest_thresholds(predict(model, data), labels)[rule])
    return f"{rule} on {name}"

"""The bookkeeping around RL's loop (:func:`worldloop.rl.trainer.train`): what it checkpoints and resumes, what it
logs, who watches it, and what it leaves in its run folder. The algorithm itself stays in the trainer.

A run folder holds tb/ (TensorBoard), checkpoints/ (atomic, the newest KEEP_CHECKPOINTS kept; a rerun resumes from
the latest), results.json, results.md, curves.png, policy/ (the final policy) and, when a refiner refined the world
model, world_model/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from worldloop.rl.configuration import RLConfig
from worldloop.rl.curves import plot_curves
from worldloop.rl.summary import results_table
from worldloop.utils import distributed
from worldloop.utils.checkpoint import resume, save_checkpoint
from worldloop.utils.io import atomic_write_json, atomic_write_text

SHOWN = ("env/success_once", "env/return", "env/episode_len", "rollout/kept_groups", "actor/policy_loss", "actor/approx_kl_before_update",
         "actor/approx_kl", "actor/clip_fraction", "actor/entropy", "actor/grad_norm", "actor/update_steps", "critic/value_loss",
         "world_model/refine_real_success", "world_model/refine_loss_new_before", "world_model/refine_loss_new_after", "time/iteration")  # fmt: skip
"""The metrics of the console's line per iteration."""
KEEP_CHECKPOINTS = 2
"""Newest checkpoints kept on disk."""


class RLRun:
    """One RL run's folder, checkpoints, logs and watchers. ``modules`` and ``stateful`` are what a checkpoint holds
    (the policy, its optimizer, and a refiner's own); ``refiner`` (None unless it refines, rl.refine.every) and
    ``monitor`` (:class:`worldloop.diagnostics.monitor.RunMonitor`, optional) are checkpointed and restored with them."""

    def __init__(self, out: str | Path, rl: RLConfig, modules: dict[str, Any], stateful: dict[str, Any], refiner: Any = None, monitor: Any = None,
                 console: bool = True):  # fmt: skip
        self.out, self.rl, self.refiner, self.monitor, self.console = Path(out), rl, refiner, monitor, console
        self.out.mkdir(parents=True, exist_ok=True)
        self.modules = modules | (refiner.modules if refiner is not None else {})
        self.stateful = stateful | (refiner.stateful if refiner is not None else {})
        self.history: list[dict[str, Any]] = []
        self.writer: SummaryWriter | None = None

    def start(self, policy: Any) -> tuple[int, bool]:
        """Resume from the latest checkpoint, if any. Returns the first iteration to run and whether the run has
        already ended (a run that stopped stays stopped)."""
        start = 0
        resumed = resume(self.out, "rl", self.modules, self.stateful)
        if resumed is not None:
            _, start, extra = resumed
            self.history = extra["history"]
            if extra.get("refining") and self.refiner is None:  # its refined world model lives in the checkpoint: without it the run would go on in the old one
                raise ValueError(f"{self.out} refined its world model on the policy's real rollouts (rl.refine.every); resume it with the same rl.refine_* settings")
            if self.refiner is not None:
                self.refiner.restore(start)
            if self.monitor is not None:
                self.monitor.restore(extra, self.history)
        self.writer = distributed.summary_writer(str(self.out / "tb"), purge_step=start)  # rank 0 writes
        if self.monitor is not None:
            self.monitor.start(policy, start, self.writer)
        ended = self.monitor is not None and self.monitor.stopped
        return start, distributed.broadcast_object(ended)  # every rank's monitor decides alike; rank 0's counts

    def after_iteration(self, policy: Any, done_iterations: int, metrics: dict[str, float]) -> bool:
        """Log an iteration's metrics; the monitor watches (reality checks, warnings, stop rules); an atomic
        checkpoint every rl.checkpoint_every iterations and at the end. Returns whether the run ends here."""
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, done_iterations)
        self.history.append({"iteration": done_iterations} | metrics)
        if self.console:
            tqdm.write(f"it {done_iterations}: " + " ".join(f"{name} {metrics[name]:.4g}" for name in SHOWN if name in metrics))
        ended = done_iterations == self.rl.iterations
        decision = self.monitor.after_iteration(policy, done_iterations, metrics) if self.monitor is not None else ended
        ended = distributed.broadcast_object(decision)  # rank 0's decision, which every rank's monitor also made
        if ended or done_iterations % self.rl.checkpoint_every == 0:
            watched = self.monitor.state() if self.monitor is not None else {}
            save_checkpoint(self.out, done_iterations, self.modules, self.stateful,
                            {"history": self.history, "refining": self.refiner is not None} | watched, keep=KEEP_CHECKPOINTS)  # fmt: skip
        return ended

    def finish(self, policy: Any) -> dict[str, Any]:
        """The final policy (OUT/policy), the refined world model (OUT/world_model), results.json, results.md and curves.png."""
        self.writer.close()
        policy.eval()
        if not distributed.is_main():  # rank 0 finishes the run and writes its results
            return distributed.broadcast_object(None)
        watched = self.monitor.finish(policy) if self.monitor is not None else {}
        policy.save_pretrained(self.out / "policy")
        if self.refiner is not None:
            self.refiner.save(self.out / "world_model")
        shuffled = self.rl.diagnostics.shuffled_scores
        results = {"iterations": len(self.history), "algorithm": self.rl.algorithm, "shuffled_scores": shuffled, "history": self.history,
                   "evaluations": [], "warnings": [], "stopped": None} | watched  # fmt: skip
        atomic_write_json(self.out / "results.json", results)
        fell = results["stopped"]
        stop_line = "" if not fell else (f"\nStopped at iteration {fell['iteration']}: real success fell ({'; '.join(fell['fallen'])}); "
                                         f"the final policy is iteration {fell['policy_from']}'s.\n")  # fmt: skip
        control = ("A control run (rl.diagnostics.shuffled_scores=true): each rollout was credited with another's score from its group.\n\n"
                   if shuffled else "")  # fmt: skip
        atomic_write_text(self.out / "results.md", control + results_table(results["evaluations"], self.history) + stop_line)
        plot_curves(results, self.out / "curves.png")
        return distributed.broadcast_object(results)

"""Everything a run watches besides its loss: the reality checks, the warnings, the stop rules and the time budget.

The trainer (:func:`worldloop.rl.trainer.train`) knows nothing of this module: it takes any ``monitor`` with the
methods of :class:`RunMonitor` (``restore``, ``state``, ``start``, ``after_iteration``, ``finish``) and calls them at
the start of a run, after each iteration and at its end. :class:`RunMonitor`:

- every ``rl.checks.every`` iterations (and before the first and after the last) runs the reality check: real-simulator
  success and imagined success from the same initial states, and where their gap comes from (TensorBoard, console,
  ``OUT/evaluations.json`` at once);
- turns each check and each iteration's metrics into warnings (:mod:`worldloop.diagnostics.warnings`);
- stops the run when real success falls (``rl.diagnostics.stop_when_real_falls_se``, keeping the weights of the last
  check at which it held) or when ``rl.time_limit_min`` would be passed.

Under torchrun every rank has its monitor and runs its share of each check's episodes; the checks' results are all
the episodes' on every rank (:class:`worldloop.diagnostics.reality.RealityCheck`), so every monitor warns and stops
alike. Rank 0 alone prints and writes (TensorBoard, evaluations.json, the held weights), and its clock decides when
the time is up.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm import tqdm

from worldloop.diagnostics.warnings import (
    REAL_FELL,
    SILENT_ITERATIONS,
    imagination_gap_diagnosis,
    imagination_tracking_diagnosis,
    imagined_only_gain_diagnosis,
    real_success_fall,
    silence_diagnosis,
    time_is_up,
    update_diagnosis,
    world_model_exploited_diagnosis,
)
from worldloop.rl.configuration import RLConfig
from worldloop.rl.summary import agreement_text, gap_steps, imagined_actions_line, rate_text, since_first_line, sources_line, tracking_line
from worldloop.rl.trainer import train
from worldloop.utils import distributed
from worldloop.utils.io import atomic_path, atomic_write_json


class RunMonitor:
    """The reality checks, warnings and stop rules of one run (see the module's docstring).

    ``reality_check``: called as ``reality_check(policy, name)`` and returning its result (a
    :class:`worldloop.diagnostics.reality.RealityCheck`); None: warnings and the time budget only."""

    def __init__(self, rl: RLConfig, out: str | Path, reality_check: Callable[[Any, str], dict[str, Any]] | None = None, console: bool = True):
        self.rl, self.out, self.reality_check = rl, Path(out), reality_check
        self.console, self.writes = console and distributed.is_main(), distributed.is_main()  # under torchrun, rank 0 speaks and writes
        self.held_path = self.out / "policy_held.pt"  # the weights of the last check at which real success held
        self.evaluations: list[dict[str, Any]] = []
        self.warnings: list[dict[str, Any]] = []
        self.silent = 0  # consecutive GRPO iterations in which every group was filtered out
        self.fell: dict[str, Any] | None = None  # rl.diagnostics.stop_when_real_falls_se: the check at which real success fell
        self.writer: Any = None
        self.eval_seconds = 0.0  # the latest check's duration, what the final one is expected to take
        self.slowest_iteration = 0.0

    # -- what the trainer calls -----------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the monitor (a resumed run restores it)."""
        return {"evaluations": self.evaluations, "stopped": self.fell, "warnings": self.warnings, "silent": self.silent}

    def restore(self, saved: dict[str, Any], history: list[dict[str, Any]]) -> None:
        self.evaluations, self.fell = saved.get("evaluations", []), saved.get("stopped")
        self.warnings, self.silent = saved.get("warnings", []), saved.get("silent", 0)  # absent in checkpoints from before they were kept
        self.eval_seconds = self.evaluations[-1].get("seconds", 0.0) if self.evaluations else 0.0
        self.slowest_iteration = max((h["time/iteration"] for h in history), default=0.0)

    def start(self, policy: Any, iteration: int, writer: Any) -> None:
        """At the run's start (or resume): the first reality check when none was made."""
        self.writer = writer
        self.run_began = time.perf_counter()  # rl.time_limit_min counts from here, the first check included
        if self.reality_check is not None and iteration == 0:
            self.evaluate(policy, 0)
            self.held_or_fallen(policy, 0)

    @property
    def stopped(self) -> bool:
        """Real success has fallen (rl.diagnostics.stop_when_real_falls_se): no more training."""
        return self.fell is not None

    def after_iteration(self, policy: Any, iteration: int, metrics: dict[str, float]) -> bool:
        """After ``iteration`` iterations: warnings from its ``metrics``, the reality check when one is due.
        Returns whether the run ends here."""
        self.diagnose_update(iteration, metrics)
        self.slowest_iteration = max(self.slowest_iteration, metrics["time/iteration"])
        checking = self.reality_check is not None
        evaluating = checking and bool(self.rl.checks.every) and iteration % self.rl.checks.every == 0
        out_of_time = time_is_up(time.perf_counter() - self.run_began, self.slowest_iteration, self.eval_seconds if checking else 0.0,
                                 evaluating, self.rl.time_limit_min)  # fmt: skip
        out_of_time = distributed.broadcast_object(out_of_time)  # rank 0's clock: every rank checks (or stops) alike
        last = iteration == self.rl.iterations or out_of_time
        if checking and (last or evaluating):
            self.evaluate(policy, iteration)
            self.fell = self.held_or_fallen(policy, iteration)
        if out_of_time and self.console:
            tqdm.write(f"rl: time limit of {self.rl.time_limit_min} min reached after {iteration} iterations")
        return last or self.stopped

    def finish(self, policy: Any) -> dict[str, Any]:
        """At the end: the weights of the last check at which real success held go back into ``policy`` when it fell;
        returns what results.json adds (the checks, the warnings, why it stopped)."""
        if self.fell and self.fell["policy_from"] != self.fell["iteration"]:
            device = next(policy.parameters()).device
            policy.load_state_dict(torch.load(self.held_path, map_location=device, weights_only=True)["policy"])
        return {"evaluations": self.evaluations, "warnings": self.warnings, "stopped": self.fell}

    # -- the diagnostics ------------------------------------------------------------------------

    def warn(self, iteration: int, message: str, once: bool = True) -> None:
        """Record (and print) a diagnosis; ``once``: only the first of its kind (the text before ':') per run."""
        kind = message.split(":")[0]
        if once and any(w["message"].split(":")[0] == kind for w in self.warnings):
            return
        self.warnings.append({"iteration": iteration, "message": message})
        if self.console:
            tqdm.write(f"rl: WARNING {message}")

    def diagnose_update(self, iteration: int, metrics: dict[str, float]) -> None:
        """GRPO without an informative group for SILENT_ITERATIONS iterations; an update that moved the policy far."""
        silent = self.rl.algorithm == "grpo" and metrics.get("rollout/kept_groups", 1.0) == 0.0
        self.silent = self.silent + 1 if silent else 0
        if self.silent == SILENT_ITERATIONS:
            self.warn(iteration, silence_diagnosis(metrics, SILENT_ITERATIONS), once=False)
        jump = update_diagnosis(metrics, iteration)
        if jump:
            self.warn(iteration, jump)

    def evaluate(self, policy: Any, iteration: int) -> None:
        """One reality check: logged, printed, its warnings made, kept on disk at once."""
        began = time.perf_counter()
        policy.eval()
        result = self.reality_check(policy, f"iteration_{iteration:04d}") | {"iteration": iteration}
        self.evaluations.append(result)
        self.writer.add_scalar("eval/success_once", result["real"]["success_once"], iteration)
        self.writer.add_scalar("eval/success_once_stderr", result["real"]["stderr"], iteration)
        for task, numbers in result["real"]["per_task"].items():
            self.writer.add_scalar(f"eval/{task}/success_once", numbers["success_once"], iteration)
        line = f"eval @ {iteration}: real {rate_text(result['real'])}"
        if "imagined" in result:
            self.writer.add_scalar("eval/success_once_imagined", result["imagined"]["success_once"], iteration)
            if "imagined_keyframes" in result:  # the same policy in imagination from KIR keyframes
                self.writer.add_scalar("eval/success_once_imagined_keyframes", result["imagined_keyframes"]["success_once"], iteration)
                for task, numbers in result["imagined_keyframes"]["per_task"].items():
                    self.writer.add_scalar(f"eval/{task}/success_once_imagined_keyframes", numbers["success_once"], iteration)
            self.writer.add_scalar("eval/imagination_gap", result["imagined"]["success_once"] - result["real"]["success_once"], iteration)
            self.writer.add_scalar("eval/agreement", result["agreement"], iteration)
            if result.get("kappa") is not None:
                self.writer.add_scalar("eval/kappa", result["kappa"], iteration)
            line += f" | imagined {rate_text(result['imagined'])} | agreement {agreement_text(result)}"
            if "imagined_keyframes" in result:
                line += f" | imagined from keyframes {rate_text(result['imagined_keyframes'])}"
            acted = result.get("imagined_actions_in_reality")
            if acted is not None:  # the imagined episodes' actions, done in the simulator
                self.writer.add_scalar("eval/success_once_imagined_actions_in_reality", acted["success_once"], iteration)
                line += f"\n  {imagined_actions_line(acted)}"
            for row in result.get("tracking", []):
                self.writer.add_scalar(f"eval/tracking/psnr_after_{row['chunks']}_chunks", row["psnr"], iteration)
                self.writer.add_scalar(f"eval/tracking/psnr_initial_frame_after_{row['chunks']}_chunks", row["psnr_initial_frame"], iteration)
                for name in ("token_agreement", "token_distance", "token_agreement_reconstructed", "token_distance_reconstructed",
                             "token_agreement_reconstructed_imagined"):
                    if name in row:
                        self.writer.add_scalar(f"eval/tracking/{name}_after_{row['chunks']}_chunks", row[name], iteration)
                if row["kappa"] is not None:
                    self.writer.add_scalar(f"eval/tracking/kappa_after_{row['chunks']}_chunks", row["kappa"], iteration)
            for name, source in result.get("gap_sources", {}).items():
                self.writer.add_scalar(f"eval/success_once_{name}", source["success_once"], iteration)
                if source["kappa"] is not None:
                    self.writer.add_scalar(f"eval/kappa_{name}", source["kappa"], iteration)
            if result.get("gap_sources"):
                for name, step in gap_steps(result).items():  # per task: where imagination is faithful, and where RL moved it
                    for task, kappa in (step.get("per_task_kappa") or {}).items():
                        if kappa["kappa"] is not None:
                            self.writer.add_scalar(f"eval/{task}/kappa_{name}", kappa["kappa"], iteration)
            if result.get("tracking"):
                line += "\n  " + tracking_line(result["tracking"])
            if result.get("gap_sources"):
                line += "\n  " + sources_line(result)
            for warning in (imagination_gap_diagnosis(result), imagination_tracking_diagnosis(result),
                            world_model_exploited_diagnosis(self.evaluations[0], result), imagined_only_gain_diagnosis(self.evaluations[0], result)):  # fmt: skip
                if warning:
                    self.warn(iteration, warning)
        since = since_first_line(self.evaluations[0], result)
        if since:  # the criterion's numbers on the console (and so in the log) at every check, not only in results.json
            line += "\n  " + since
        self.eval_seconds = result["seconds"] = time.perf_counter() - began
        self.writer.add_scalar("time/eval", self.eval_seconds, iteration)
        # every check so far, kept as soon as it is made: a run cut short (a machine taken away) keeps them, per-episode verdicts included
        if self.writes:
            atomic_write_json(self.out / "evaluations.json", {"evaluations": self.evaluations, "warnings": self.warnings})
        if self.console:
            tqdm.write(line)

    def held_or_fallen(self, policy: Any, iteration: int) -> dict[str, Any] | None:
        """rl.diagnostics.stop_when_real_falls_se: where this evaluation's real success fell below the first's, why; else its weights are held."""
        if self.rl.diagnostics.stop_when_real_falls_se <= 0:
            return None
        fallen = real_success_fall(self.evaluations[0], self.evaluations[-1], self.rl.diagnostics.stop_when_real_falls_se)
        if not fallen:
            if self.writes:
                with atomic_path(self.held_path) as tmp:
                    torch.save({"iteration": iteration, "policy": policy.state_dict()}, tmp)
            return None
        # none held: a run resumed with the option that began without it; its final policy is then this one
        held = torch.load(self.held_path, map_location="cpu", weights_only=True)["iteration"] if self.held_path.is_file() else iteration
        self.warn(iteration, f"{REAL_FELL} at iteration {iteration}: {'; '.join(fallen)} against iteration {self.evaluations[0]['iteration']}; "
                        f"training stops and the final policy is iteration {held}'s (rl.diagnostics.stop_when_real_falls_se={self.rl.diagnostics.stop_when_real_falls_se:g})",
             once=False)  # fmt: skip
        return {"iteration": iteration, "fallen": fallen, "policy_from": held}


def train_watched(policy: Any, env: Any, rl: RLConfig, out: str | Path, seed: int = 0, tasks: list[int | str] | None = None,
                  reality_check: Callable[[Any, str], dict[str, Any]] | None = None, refiner: Any | None = None, console: bool = True,
                  progress_bar: bool = True) -> dict[str, Any]:
    """:func:`worldloop.rl.trainer.train` watched by a :class:`RunMonitor` over ``reality_check``: what ``worldloop rl`` runs."""
    monitor = RunMonitor(rl, out, reality_check, console)
    return train(policy, env, rl, out, seed=seed, tasks=tasks, monitor=monitor, refiner=refiner, console=console, progress_bar=progress_bar)


class Diagnostics:
    """What ``worldloop rl`` injects into :func:`worldloop.rl.app.run_rl` (its ``watch``): the reality checks and the
    judge's calibration (:func:`worldloop.diagnostics.reality.rl_checks`), and a :class:`RunMonitor` over them."""

    def checks(self, config: Any, policy: Any, world_model: Any, judge: Any, dataset: Any, device: Any, closers: list,
               tasks: list[str], out: Path, keyframes: str | None = None) -> tuple[Any, Any, list[str]]:  # fmt: skip
        from worldloop.diagnostics.reality import rl_checks

        return rl_checks(config, policy, world_model, judge, dataset, device, closers, tasks, out, keyframes)

    def monitor(self, rl: RLConfig, out: str | Path, reality_check: Callable[[Any, str], dict[str, Any]] | None) -> RunMonitor:
        return RunMonitor(rl, out, reality_check)


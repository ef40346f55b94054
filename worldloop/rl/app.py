"""``worldloop rl``'s application, top to bottom: its inputs loaded, what it trains in, what watches it, the algorithm.

    the judge (its threshold, or a fidelity gate's per task) -> the training environment (imagined in the world model
    from a dataset's first frames and KIR's keyframes, or the real simulator) -> what watches the run (``watch``:
    reality checks, the judge's calibration, the tasks imagination tracks) -> the world model's refinement rounds
    (rl.refine.every) -> :func:`worldloop.rl.trainer.train`

What watches a run is injected: the command passes :class:`worldloop.diagnostics.monitor.Diagnostics`, and this
package never imports the diagnostics (the layer test holds it to that). A watch is any object with the two methods
of :class:`Watch`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol

from worldloop.rl.configuration import RLConfig


class Watch(Protocol):
    """What watches an RL run besides its loss."""

    def checks(self, config: Any, policy: Any, world_model: Any, judge: Any, dataset: Any, device: Any, closers: list,
               tasks: list[str], out: Path, keyframes: str | None = None) -> tuple[Any, Any, list[str]]:  # fmt: skip
        """Before training: (the reality check called as ``check(policy, name)`` or None, the judge's calibration or
        None, the simulator tasks to train on). Environments it opens go into ``closers``."""

    def monitor(self, rl: RLConfig, out: str | Path, reality_check: Callable[[Any, str], dict[str, Any]] | None) -> Any:
        """The trainer's ``monitor`` (``restore``, ``state``, ``start``, ``after_iteration``, ``finish``) over ``reality_check``."""


def run_rl(config: Any, policy: Any, out: str | Path, imagined: bool, world_model: Any = None, judge: str | None = None,
           dataset: str | None = None, keyframes: str | None = None, tasks: list[str] | None = None, progress_bar: bool = True,
           device: Any = "cpu", judge_task_thresholds: dict[str, float] | None = None, watch: Watch | None = None) -> dict[str, Any] | None:  # fmt: skip
    """What ``worldloop rl`` runs once its inputs are loaded: the training environment (imagined in ``world_model``,
    judged by the ``judge`` folder or topreward:PATH, from ``dataset``'s first frames and the ``keyframes``; or the real
    simulator), what ``watch`` checks before and during training (under torchrun each rank runs its share of the
    checks' episodes), the world model's refinement rounds (rl.refine.every), then the trainer. ``judge_task_thresholds``
    (simulator task -> threshold, a fidelity gate's): the judge's own threshold for those tasks. ``watch`` None: no
    checks and no monitor. Closes every environment it opens; returns the results on rank 0, None on the others."""
    from worldloop.data.dataset import TrajectoryDataset
    from worldloop.policies.compact_vla.modeling import with_value_head
    from worldloop.rl.envs import instruction_of, load_rl_judge, training_env
    from worldloop.rl.refine import world_model_refiner
    from worldloop.rl.trainer import train
    from worldloop.utils import distributed

    rl = config.rl
    policy = with_value_head(policy) if rl.algorithm == "ppo" else policy
    num_envs = distributed.share(rl.num_groups, "rl.num_groups") * rl.group_size  # this rank's environments
    closers = []
    try:
        judge_model = load_rl_judge(judge, device, config) if judge else None
        if judge_model is not None and judge_task_thresholds:
            judge_model.task_thresholds = {instruction_of(task): threshold for task, threshold in judge_task_thresholds.items()}
        episodes = TrajectoryDataset(dataset) if dataset else None
        env, instructions, sim_tasks = training_env(config, imagined, world_model, judge_model, episodes, keyframes, tasks, device, num_envs)
        closers.append(env)
        check, calibration, kept = None, None, sim_tasks
        if watch is not None:
            check, calibration, kept = watch.checks(config, policy, world_model, judge_model, episodes, device, closers, sim_tasks, Path(out), keyframes)
        if kept != sim_tasks:  # rl.train_tasks=tracked
            sim_tasks, instructions = kept, [instruction_of(task) for task in kept]
        refiner = None
        if imagined and rl.refine.every > 0:
            refiner = world_model_refiner(config, world_model, episodes, sim_tasks, out, calibration)
            if refiner.real_env is not None:  # under torchrun, rank 0's
                closers.append(refiner.real_env)
        monitor = watch.monitor(rl, out, check) if watch is not None else None
        results = train(policy, env, rl, out, seed=config.seed, tasks=instructions, monitor=monitor, refiner=refiner, progress_bar=progress_bar)
    finally:
        for opened in closers:
            opened.close()
    return results if distributed.is_main() else None

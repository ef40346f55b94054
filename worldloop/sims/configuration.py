"""Configuration of the real simulators and of the scripted experts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from worldloop.utils.registry import SIMULATORS


METAWORLD_CAMERAS = ("corner", "corner2", "corner3", "corner4", "topview", "behindGripper", "gripperPOV")
"""Cameras of Meta-World's Sawyer scene."""
LIBERO_CAMERAS = ("agentview", "robot0_eye_in_hand")
"""Cameras of LIBERO's scenes: the third-person view and the wrist camera."""
LIBERO_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10")
"""LIBERO's task suites (10 tasks each, 50 fixed initial states per task)."""
LIBERO_TASKS: dict[str, list[str]] = {suite: [f"{suite}-{index}" for index in range(10)] for suite in LIBERO_SUITES}
"""LIBERO's task names by suite, in the benchmark's order (task order 0)."""


def task_tables() -> list[tuple[str, Any]]:
    """(sim.backend name, its task table) of every registered simulator that offers one (its class's ``task_table``:
    :class:`worldloop.sims.tasks.TaskTable`): Meta-World's first, then the others by name, LIBERO's last (its
    instructions take LIBERO's import, seconds)."""
    names = sorted(SIMULATORS.names(), key=lambda name: (name != "metaworld", name == "libero", name))
    tables = [(name, getattr(SIMULATORS.get(name), "task_table", None)) for name in names]
    return [(name, table) for name, table in tables if table is not None]


def task_table(backend: str) -> Any:
    """The task table of simulator ``backend`` (a registered name or 'package.module:Class'); None when it offers none."""
    return getattr(SIMULATORS.get(backend), "task_table", None)


@dataclass
class SimConfig:
    """A vectorised real simulator."""

    backend: str = "metaworld"
    """Which simulator runs the tasks: a name in worldloop.utils.registry.SIMULATORS ('metaworld', 'libero') or a 'package.module:Class'."""
    suite: str = "mt10"
    """Named task suite (Meta-World: 'mt10', 'mt50'; LIBERO: 'libero_spatial', 'libero_object', 'libero_goal', 'libero_10'); ignored when `tasks` is set."""
    tasks: list[str] = field(default_factory=list)
    """Explicit task names (e.g. ['reach-v3', 'drawer-open-v3'], or ['libero_spatial-4']: suite and task index); empty means the whole suite."""
    image_size: int = 64
    """Side of the square RGB frames in pixels (64, 128 or 256)."""
    camera: str = "corner"
    """Camera the frames are rendered from (Meta-World: corner, corner2, corner3, corner4, topview, behindGripper, gripperPOV;
    LIBERO: agentview, robot0_eye_in_hand)."""
    max_steps: int = 0
    """Episode length limit in simulator steps (truncation); 0: the task's convention (Meta-World 200; LIBERO-Spatial 220,
    -Object 280, -Goal 300, -10 520, counted after LIBERO's 10 settling steps)."""
    chunk_size: int = 8
    """Actions per chunk: one `step` executes this many actions and returns this many frames."""
    success_hold_steps: int = 0
    """Steps an episode continues after its first success before it ends (0: end at success)."""
    num_workers: int = 2
    """Simulator worker processes; environments are spread over them (1: step everything in this process)."""

    def validate(self) -> None:
        if self.image_size not in (64, 128, 256):
            raise ValueError(f"image_size={self.image_size} is not supported; allowed: 64, 128, 256")
        if ":" not in self.backend and self.backend not in SIMULATORS:
            raise ValueError(f"sim.backend '{self.backend}' is unknown; registered: {', '.join(SIMULATORS.names())}; or give 'package.module:Class'")
        self.check_names()
        if self.chunk_size < 1 or self.max_steps < 0 or self.num_workers < 1 or self.success_hold_steps < 0:
            raise ValueError("chunk_size and num_workers must be >= 1, max_steps and success_hold_steps >= 0")


    def check_names(self) -> None:
        """The camera, suite and tasks against the simulator's own task table (a simulator without one: unchecked)."""
        table = task_table(self.backend)
        if table is None:
            return
        if table.cameras and self.camera not in table.cameras:
            raise ValueError(f"camera='{self.camera}' is not a {table.name} camera; allowed: {', '.join(table.cameras)}")
        tables = [other for _, other in task_tables()]
        suite = self.suite.lower()
        known = list(dict.fromkeys([*(s for other in tables for s in other.suites), *table.suites]))
        if suite not in known:
            raise ValueError(f"suite='{self.suite}' is unknown; allowed: {', '.join(known)}")
        if not self.tasks and suite not in table.suites:
            raise ValueError(f"suite='{self.suite}' is not a suite of sim.backend='{self.backend}'")
        others = [other for other in tables if other is not table]
        if any(table.canonical(str(t)) is None and any(other.canonical(str(t)) for other in others) for t in self.tasks):
            raise ValueError(f"sim.tasks {self.tasks} mixes in tasks of another simulator than sim.backend='{self.backend}'")

def use_suite(sim_config: SimConfig, suite: str) -> None:
    """Point ``sim_config`` at ``suite`` (clearing sim.tasks), switching sim.backend to the registered simulator whose
    suite it is and, when sim.camera is not one of that simulator's, to its first camera (LIBERO: agentview;
    Meta-World: corner). A backend given as 'package.module:Class' keeps itself."""
    owners = {name: table for name, table in task_tables() if suite.lower() in table.suites}
    if not owners and not (":" in sim_config.backend and suite.lower() in getattr(task_table(sim_config.backend), "suites", {})):
        known = [s for _, table in task_tables() for s in table.suites]
        raise ValueError(f"suite '{suite}' is unknown; allowed: {', '.join(known)}")
    sim_config.suite, sim_config.tasks = suite.lower(), []
    if sim_config.backend in SIMULATORS and owners and sim_config.backend not in owners:
        sim_config.backend = next(iter(owners))
    cameras = getattr(task_table(sim_config.backend), "cameras", ())
    if cameras and sim_config.camera not in cameras:
        sim_config.camera = cameras[0]


@dataclass
class ExpertConfig:
    """Meta-World's scripted per-task policies, made imperfect on purpose."""

    action_noise: float = 0.0
    """Std of Gaussian noise added to every expert action of a noisy episode (actions live in [-1, 1])."""
    perturb_prob: float = 0.0
    """Probability that a noisy episode contains one perturbation, after which the expert resumes (it starts between
    steps 10 and 120; half hold the gripper in the wrong state, half are random actions: worldloop.sims.experts)."""
    perturb_steps: int = 20
    """Length of a perturbation in steps."""
    def validate(self) -> None:
        if self.action_noise < 0 or not 0 <= self.perturb_prob <= 1 or self.perturb_steps < 0:
            raise ValueError("action_noise >= 0, 0 <= perturb_prob <= 1 and perturb_steps >= 0 are required")

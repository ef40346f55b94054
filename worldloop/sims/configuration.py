"""Configuration of the real simulators and of the scripted experts."""

from __future__ import annotations

from dataclasses import dataclass, field

from worldloop.utils.registry import SIMULATORS


METAWORLD_CAMERAS = ("corner", "corner2", "corner3", "corner4", "topview", "behindGripper", "gripperPOV")
"""Cameras of Meta-World's Sawyer scene."""
LIBERO_CAMERAS = ("agentview", "robot0_eye_in_hand")
"""Cameras of LIBERO's scenes: the third-person view and the wrist camera."""
LIBERO_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10")
"""LIBERO's task suites (10 tasks each, 50 fixed initial states per task)."""
LIBERO_TASKS: dict[str, list[str]] = {suite: [f"{suite}-{index}" for index in range(10)] for suite in LIBERO_SUITES}
"""LIBERO's task names by suite, in the benchmark's order (task order 0)."""
SUITES = ("mt10", "mt50") + LIBERO_SUITES
"""Named task suites (Meta-World's task lists come from its registry: worldloop.sims.tasks)."""


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
        if self.backend == "metaworld" and self.camera not in METAWORLD_CAMERAS:
            raise ValueError(f"camera='{self.camera}' is not a Meta-World camera; allowed: {', '.join(METAWORLD_CAMERAS)}")
        if self.backend == "libero" and self.camera not in LIBERO_CAMERAS:
            raise ValueError(f"camera='{self.camera}' is not a LIBERO camera; allowed: {', '.join(LIBERO_CAMERAS)}")
        if self.suite.lower() not in SUITES:
            raise ValueError(f"suite='{self.suite}' is unknown; allowed: {', '.join(SUITES)}")
        if self.backend in ("metaworld", "libero") and not self.tasks and (self.suite.lower() in LIBERO_SUITES) != (self.backend == "libero"):
            raise ValueError(f"suite='{self.suite}' is not a suite of sim.backend='{self.backend}'")
        if self.backend in ("metaworld", "libero") and any(str(t).startswith("libero") != (self.backend == "libero") for t in self.tasks):
            raise ValueError(f"sim.tasks {self.tasks} mixes in tasks of another simulator than sim.backend='{self.backend}'")
        if self.chunk_size < 1 or self.max_steps < 0 or self.num_workers < 1 or self.success_hold_steps < 0:
            raise ValueError("chunk_size and num_workers must be >= 1, max_steps and success_hold_steps >= 0")


def use_suite(sim_config: SimConfig, suite: str) -> None:
    """Point ``sim_config`` at ``suite`` (clearing sim.tasks), switching sim.backend to the suite's simulator and, when
    sim.camera is not one of that simulator's, to its default camera (LIBERO: agentview; Meta-World: corner)."""
    if suite.lower() not in SUITES:
        raise ValueError(f"suite '{suite}' is unknown; allowed: {', '.join(SUITES)}")
    sim_config.suite, sim_config.tasks = suite.lower(), []
    libero = sim_config.suite in LIBERO_SUITES
    if sim_config.backend in ("metaworld", "libero"):
        sim_config.backend = "libero" if libero else "metaworld"
        cameras = LIBERO_CAMERAS if libero else METAWORLD_CAMERAS
        if sim_config.camera not in cameras:
            sim_config.camera = cameras[0] if libero else "corner"


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

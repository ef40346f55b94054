"""The simulator side of :class:`worldloop.sims.metaworld.MetaWorldVecEnv`.

A :class:`SimWorker` owns a few environment *slots* and steps a whole action chunk for all of
them per call. It runs either inside the caller's process (one worker) or in a child process
(:func:`worker_main`), where it answers one message per chunk over a pipe. This module imports
no torch, so child processes start fast.

One slot = one running episode, with its own step counter and done flag. Building a Meta-World
environment takes ~0.3 s and ~150 MB, so a worker keeps the environments of finished episodes
for reuse by later resets of the same task, at most one idle environment per slot.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
import warnings
from dataclasses import dataclass

import numpy as np

from worldloop.sims.experts import ExpertPlan, ScriptedExpert
from worldloop.utils.gl import RenderingUnavailable

DEFAULT_MAX_STEPS = 200
"""Meta-World's episode length when sim.max_steps is 0."""

STATE_DIM = 39
"""Meta-World's observation vector: hand, gripper, two objects (pos + quat), previous frame, goal."""
ACTION_DIM = 4
"""Meta-World's action: end-effector delta xyz and gripper, each in [-1, 1]."""


class MetaWorldTask:
    """One Meta-World environment of one task with a headless renderer and per-seed goals."""

    def __init__(self, task: str, image_size: int, camera: str, max_steps: int):
        import mujoco
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS

        env = ALL_V3_ENVIRONMENTS[task]()
        # The goal is part of the observation (the scripted experts read it), and every reset draws
        # the goal and object positions from the env's own generator, which `reset(seed)` re-seeds:
        # different seeds give different scenes, the same seed the same scene.
        env._partially_observable = False
        del env.sawyer_observation_space  # cached property, recomputed with the goal included
        env._set_task_called = True
        env._freeze_rand_vec = False
        env.seeded_rand_vec = True
        env.max_path_length = max(env.max_path_length, max_steps)
        self.env = env
        self.task = task
        self.max_steps = max_steps

        model = env.model
        self.camera_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        if self.camera_id < 0:
            names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) for i in range(model.ncam)]
            raise ValueError(f"unknown camera '{camera}' for {task}; allowed: {', '.join(names)}")
        # An offscreen buffer of exactly the frame size: rendering into Meta-World's default 640x480
        # buffer is ~3x slower with software OpenGL.
        model.vis.global_.offwidth = image_size
        model.vis.global_.offheight = image_size
        try:
            self.renderer = mujoco.Renderer(model, image_size, image_size)
        except Exception as error:  # mujoco.FatalError, or PyOpenGL failing to load the backend's library
            raise RenderingUnavailable.from_error(error) from error
        self.renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0  # ~3x faster rendering (docs/benchmarks.md)
        self.upside_down = False

    def reset(self, seed: int) -> np.ndarray:
        self.env.seed(int(seed))
        observation, _ = self.env.reset()
        # Several Meta-World cameras look at the table with their "up" axis pointing down, so they
        # render the scene rotated by 180 degrees; turning the frame back keeps it unmirrored.
        camera_up = self.env.data.cam_xmat[self.camera_id].reshape(3, 3)[:, 1]
        self.upside_down = bool(camera_up[2] < 0)
        return observation

    def step(self, action: np.ndarray) -> tuple[np.ndarray, bool]:
        observation, _, _, _, info = self.env.step(action)
        return observation, bool(info["success"])

    def state(self, observation: np.ndarray) -> np.ndarray:
        return observation.astype(np.float32)

    def render(self) -> np.ndarray:
        """(H, W, 3) uint8, right side up."""
        self.renderer.update_scene(self.env.data, camera=self.camera_id)
        frame = self.renderer.render()
        return np.ascontiguousarray(frame[::-1, ::-1]) if self.upside_down else frame.copy()

    def close(self) -> None:
        self.renderer.close()
        self.env.close()


@dataclass
class Episode:
    """Bookkeeping of the episode running in one slot."""

    task: str
    sim: MetaWorldTask  # or another simulator's task object
    expert: ScriptedExpert
    observation: np.ndarray  # what the simulator's expert reads
    frame: np.ndarray
    steps: int = 0
    first_success: int = -1  # step count at the first success, -1 before
    success: bool = False
    done: bool = False


class SimWorker:
    """Steps the episodes of a few environment slots, a whole action chunk per call.

    The simulator-specific parts are :meth:`make_task` and :meth:`make_expert`; a task object has
    ``task``, ``max_steps``, ``reset(seed) -> observation``, ``step(action) -> (observation, success)``,
    ``render()``, ``state(observation)`` and ``close()`` (Meta-World: :class:`MetaWorldTask`)."""

    state_dim = STATE_DIM
    action_dim = ACTION_DIM

    def make_task(self, task: str):
        c = self.config
        return MetaWorldTask(task, c.image_size, c.camera, c.max_steps or DEFAULT_MAX_STEPS)

    def make_expert(self, task: str, sim, plan: ExpertPlan) -> ScriptedExpert:
        return ScriptedExpert(task, plan)

    def __init__(self, sim_config, num_slots: int, render: bool = True):
        self.config = sim_config
        self.render = render  # False: black frames, physics only
        self.num_slots = num_slots
        self.episodes: list[Episode | None] = [None] * num_slots
        self.idle: list[MetaWorldTask] = []  # environments of finished episodes, least recently used first
        warnings.filterwarnings("ignore", message="Constant\\(s\\) may be too high")

    def reset(self, items: list[tuple[str, int, ExpertPlan]]) -> dict[str, np.ndarray]:
        """Start one episode per slot from (task, seed, expert plan)."""
        c = self.config
        frames, states = [], []
        self.idle += [episode.sim for episode in self.episodes if episode is not None]
        self.episodes = [None] * self.num_slots
        for slot, (task, seed, plan) in enumerate(items):
            reusable = [i for i, sim in enumerate(self.idle) if sim.task == task]
            sim = self.idle.pop(reusable[-1]) if reusable else self.make_task(task)
            observation = sim.reset(seed)
            episode = Episode(task, sim, self.make_expert(task, sim, plan), observation, self._render(sim))
            self.episodes[slot] = episode
            frames.append(episode.frame)
            states.append(sim.state(observation))
        while len(self.idle) > self.num_slots:
            self.idle.pop(0).close()
        return {"frames": np.stack(frames), "state": np.stack(states)}

    def step(self, actions: np.ndarray | None) -> dict[str, np.ndarray]:
        """Execute (num_slots, K, A) actions, or K closed-loop expert actions when ``actions`` is None."""
        c = self.config
        K = c.chunk_size
        n, size = self.num_slots, c.image_size
        out = {
            "frames": np.empty((n, K, size, size, 3), np.uint8),
            "success": np.zeros((n, K), bool),
            "done": np.zeros((n, K), bool),
            "state": np.empty((n, K, self.state_dim), np.float32),
            "actions": np.zeros((n, K, self.action_dim), np.float32),
            "steps": np.zeros(n, np.int64),
        }
        for slot, episode in enumerate(self.episodes):
            if episode is None:
                raise RuntimeError("step before reset")
            for k in range(K):
                if not episode.done:
                    if actions is None:
                        action = episode.expert.act(episode.observation, episode.steps)
                    else:
                        action = actions[slot, k]
                    episode.observation, episode.success = episode.sim.step(action)
                    episode.frame = self._render(episode.sim)
                    episode.steps += 1
                    if episode.success and episode.first_success < 0:
                        episode.first_success = episode.steps
                    held = episode.first_success >= 0 and episode.steps >= episode.first_success + c.success_hold_steps
                    episode.done = held or episode.steps >= (c.max_steps or episode.sim.max_steps)
                    out["actions"][slot, k] = action
                out["frames"][slot, k] = episode.frame
                out["success"][slot, k] = episode.success
                out["done"][slot, k] = episode.done
                out["state"][slot, k] = episode.sim.state(episode.observation)
            out["steps"][slot] = episode.steps
        return out

    def _render(self, sim) -> np.ndarray:
        """The frame after the last step; black when rendering is off (physics only)."""
        if self.render:
            return sim.render()
        size = self.config.image_size
        return np.zeros((size, size, 3), np.uint8)

    def close(self) -> None:
        for sim in self.idle + [episode.sim for episode in self.episodes if episode is not None]:
            sim.close()
        self.idle, self.episodes = [], [None] * self.num_slots


def _die_with_parent() -> None:
    """Linux: ask the kernel to SIGTERM this process when its parent dies (no orphans even mid-chunk)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            PR_SET_PDEATHSIG = 1
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except OSError:
            pass


def worker_main(conn, sim_config, num_slots: int, parent_pid: int, worker_class: type = SimWorker, render: bool = True) -> None:
    """Child-process loop: one (command, payload) message in, one (status, result) message out."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    _die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        return
    worker = None
    try:
        worker = worker_class(sim_config, num_slots, render)
        while True:
            try:
                command, payload = conn.recv()
            except (EOFError, OSError):  # the parent is gone
                break
            if command == "close":
                break
            try:
                result = getattr(worker, command)(payload)
                conn.send(("ok", result))
            except Exception as error:  # report to the parent, keep serving
                conn.send(("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))
    except (BrokenPipeError, EOFError, OSError):
        pass
    finally:
        if worker is not None:
            worker.close()
        conn.close()

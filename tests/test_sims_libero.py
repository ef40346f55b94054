"""LIBERO behind the VecEnv protocol: tasks and configuration (always), and, where the [libero] extra is installed,
a real LIBERO-Spatial environment: a step, a reset to a fixed initial state, the scripted experts (Spatial, Object
and Goal), a collected dataset.

One environment takes 4-8 s to build, so the simulator tests share one (module scope) where they can.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])

import numpy as np
import pytest
import torch

from worldloop.config import ConfigError, load_config
from worldloop.rl.evaluate import eval_seed
from worldloop.sims.configuration import SimConfig, use_suite
from worldloop.sims.libero_setup import MISSING, libero_available
from worldloop.sims.tasks import check_task, resolve_tasks

needs_libero = pytest.mark.skipif(not libero_available(), reason=MISSING)


# --------------------------------------------------------------------------------------------
# Without LIBERO: names, suites, configuration


def test_libero_suites_name_ten_tasks_each_and_bad_names_say_so():
    assert resolve_tasks(SimConfig(backend="libero", suite="libero_spatial", camera="agentview")) == [f"libero_spatial-{i}" for i in range(10)]
    assert check_task("libero_10-9") == "libero_10-9"
    with pytest.raises(ValueError, match="libero_spatial, libero_object"):
        check_task("libero_spatial-10")
    with pytest.raises(ValueError, match="not a suite of sim.backend='metaworld'"):
        SimConfig(suite="libero_goal").validate()
    with pytest.raises(ValueError, match="not a LIBERO camera"):
        SimConfig(backend="libero", suite="libero_goal", camera="corner").validate()
    with pytest.raises(ValueError, match="mixes in tasks"):
        SimConfig(tasks=["reach-v3", "libero_object-1"]).validate()


def test_suite_option_picks_the_suites_simulator_and_camera():
    config = SimConfig(tasks=["reach-v3"])
    use_suite(config, "libero_object")
    assert (config.backend, config.suite, config.tasks, config.camera) == ("libero", "libero_object", [], "agentview")
    config.validate()
    use_suite(config, "MT10")
    assert (config.backend, config.suite, config.camera) == ("metaworld", "mt10", "corner")


def test_standard_protocol_starts_episode_e_from_initial_state_e():
    assert [eval_seed("libero_spatial-3", e, 2**31) for e in (0, 1, 49)] == [0, 1, 49]
    assert eval_seed("reach-v3", 0, 2**31) >= 2**31  # Meta-World keeps its own scene seeds


def test_libero_presets_load_and_keep_the_suites_conventions():
    cpu, gpu = load_config("libero-cpu"), load_config("libero-spatial-gpu")
    assert cpu.sim.backend == gpu.sim.backend == "libero" and cpu.sim.max_steps == gpu.sim.max_steps == 0  # 0: 220 for Spatial
    assert gpu.eval.episodes_per_task == 50 and gpu.eval.greedy and gpu.sim.tasks == []  # 10 tasks x 50 initial states
    assert gpu.rl.max_steps % gpu.sim.chunk_size == 0 and gpu.rl.max_steps >= 220
    with pytest.raises(ConfigError, match="not a LIBERO camera"):
        load_config("libero-cpu", ["sim.camera=corner"])


# --------------------------------------------------------------------------------------------
# With LIBERO


@pytest.fixture(scope="module")
def spatial_env():
    from worldloop.sims.libero import LiberoVecEnv

    config = SimConfig(backend="libero", suite="libero_spatial", tasks=["libero_spatial-0"], camera="agentview", image_size=64, num_workers=1)
    config.validate()
    with LiberoVecEnv(config, num_envs=1) as env:
        yield env


@needs_libero
def test_libero_step_gives_frames_state_and_no_success_for_standing_still(spatial_env):
    env = spatial_env
    reset = env.reset([0], [0])
    assert reset.frames.shape == (1, 64, 64, 3) and reset.frames.dtype == torch.uint8 and reset.frames.float().std() > 10
    assert reset.state.shape == (1, 8) and env.action_dim == 7 and env.max_steps == 220
    assert reset.instructions == ["pick up the black bowl between the plate and the ramekin and place it on the plate"]
    still = torch.zeros(1, env.chunk_size, 7)
    still[..., -1] = -1.0
    step = env.step(still)
    assert step.frames.shape == (1, env.chunk_size, 64, 64, 3) and step.state.shape == (1, env.chunk_size, 8)
    assert not step.success.any() and not step.done.any() and int(env.elapsed_steps[0]) == env.chunk_size
    # the objects settled before the episode began: standing still moves nothing (hand position within 1 cm)
    assert torch.allclose(step.state[0, -1, :3], reset.state[0, :3], atol=0.01)
    # right side up: agentview looks down at the table from above the robot's far side, so the bright table fills the
    # lower half of the frame and the darker floor and walls the upper edge
    frame = reset.frames[0].float()
    assert frame[-16:].mean() > frame[:8].mean()


@needs_libero
def test_reset_starts_from_the_fixed_initial_state_of_the_seed(spatial_env):
    from worldloop.sims.libero import SETTLE_STEPS
    from worldloop.sims.libero_setup import init_states

    env = spatial_env
    states = init_states("libero_spatial-0")
    assert states.shape[0] == 50 and SETTLE_STEPS == 10
    first = env.reset([0], [3]).state
    assert torch.equal(env.reset([0], [53]).state, first)  # seed % 50: the same initial state, the same settled scene
    assert not torch.equal(env.reset([0], [4]).state, first)
    env.step(torch.full((1, env.chunk_size, env.action_dim), 0.5))  # an episode's commands do not carry into the next one
    assert torch.equal(env.reset([0], [3]).state, first)
    worker = env._local
    bowl = worker.episodes[0].observation["akita_black_bowl_1_pos"]
    # the bowl stands on the table (objects start ~7 cm above it and settle in the 10 no-op steps)
    assert 0.88 < bowl[2] < 0.92


@needs_libero
@pytest.mark.parametrize("task, init_state", [("libero_spatial-0", 7), ("libero_spatial-4", 18)])  # 4: the bowl in the drawer
def test_spatial_expert_puts_the_bowl_on_the_plate(task, init_state):
    from worldloop.sims.libero import LiberoVecEnv

    config = SimConfig(backend="libero", suite="libero_spatial", tasks=[task], camera="agentview", num_workers=1)
    with LiberoVecEnv(config, num_envs=1, render=False) as env:
        env.reset([0], [init_state])
        success, done = False, False
        while not done:
            step, actions = env.step_expert()
            success, done = success or bool(step.success.any()), bool(step.done[0, -1])
            assert actions.shape == (1, env.chunk_size, 7) and actions.abs().max() <= 1.0
        steps = int(env.elapsed_steps[0])
    assert success and steps < 220  # ended at its first success, well inside the suite's 220 steps


@needs_libero
def test_object_expert_puts_a_tall_bottle_in_the_basket_and_uncovered_goal_tasks_are_refused():
    from worldloop.sims.libero import LiberoVecEnv

    config = SimConfig(backend="libero", suite="libero_object", tasks=["libero_object-2", "libero_goal-0"], camera="agentview", num_workers=1)
    with LiberoVecEnv(config, num_envs=1, render=False) as env:  # 2: the salad dressing, 14.6 cm tall and 22 g
        env.reset([0], [3])
        success, done = False, False
        while not done:
            step, actions = env.step_expert()
            success, done = success or bool(step.success.any()), bool(step.done[0, -1])
            assert actions.shape == (1, env.chunk_size, 7) and actions.abs().max() <= 1.0
        assert success and int(env.elapsed_steps[0]) < 280  # ended at its first success, inside the suite's 280 steps
        env.reset([1], [0])  # "open the middle drawer": not covered by the Goal expert; the error names the task and its goal
        with pytest.raises(ValueError, match=r"no scripted expert for libero_goal-0: .*does not cover the goal \(open wooden_cabinet_1_middle_region\)"):
            env.step_expert()


@needs_libero
def test_goal_expert_succeeds_once_at_each_task_it_covers():
    """One episode of each LIBERO-Goal task the expert covers (1: the bowl on the stove, 2: the wine bottle on the
    cabinet's top, 4: the bowl on the cabinet's top, 6: the cream cheese in the bowl, 8: the bowl on the plate), in one
    environment."""
    from worldloop.sims.libero import LiberoVecEnv

    tasks = ["libero_goal-1", "libero_goal-2", "libero_goal-4", "libero_goal-6", "libero_goal-8"]
    config = SimConfig(backend="libero", suite="libero_goal", tasks=tasks, camera="agentview", num_workers=1)
    with LiberoVecEnv(config, num_envs=1, render=False) as env:
        assert env.max_steps == 300
        for index, init_state in zip(range(len(tasks)), (11, 17, 23, 29, 37)):
            env.reset([index], [init_state])
            success, done = False, False
            while not done:
                step, actions = env.step_expert()
                success, done = success or bool(step.success.any()), bool(step.done[0, -1])
                assert actions.shape == (1, env.chunk_size, 7) and actions.abs().max() <= 1.0
            assert success, tasks[index]
            assert int(env.elapsed_steps[0]) < 200, tasks[index]  # ended at its first success, well inside the 300 steps


@needs_libero
def test_collect_on_libero_writes_a_lerobot_v3_dataset(tmp_path):
    from worldloop.data.collect import collect
    from worldloop.data.dataset import TrajectoryDataset

    config = load_config("libero-cpu", ["sim.tasks=[libero_spatial-0]", "sim.max_steps=24", "collect.num_envs=1"])
    out = tmp_path / "ds"
    summary = collect(config, out, episodes_per_task=1, progress=False)
    assert summary["overall"]["episodes"] == 1
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert info["features"]["action"]["shape"] == [7] and info["features"]["observation.state"]["shape"] == [8]
    episode = next(TrajectoryDataset(out).episodes())
    assert len(episode) == 24 and episode.frames.shape == (24, 64, 64, 3) and episode.frames[0].std() > 10
    assert episode.actions.shape == (24, 7) and np.abs(episode.actions).max() <= 1.0
    assert episode.instruction.startswith("pick up the black bowl between the plate and the ramekin")

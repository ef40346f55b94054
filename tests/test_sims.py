"""The real-simulator layer: Meta-World behind the VecEnv protocol, tasks, scripted experts.

Small and real: 64x64 frames, a few envs, a few hundred simulator steps in total.
"""

from __future__ import annotations

import os
import subprocess
import sys

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])

import pytest
import torch

from worldloop.envs.protocol import REWARD_SCALE, VecEnv
from worldloop.sims import make_env
from worldloop.sims.configuration import ExpertConfig, SimConfig
from worldloop.sims.experts import ExpertPlan, plan_episode
from worldloop.sims.metaworld import MetaWorldVecEnv
from worldloop.sims.tasks import INSTRUCTIONS, check_task, instruction, resolve_tasks, suite_tasks

F, T = False, True

MT10 = [
    "reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3",
    "drawer-close-v3", "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3",
]  # fmt: skip


def sim_config(**overrides) -> SimConfig:
    values = dict(image_size=64, num_workers=1, max_steps=120, chunk_size=8)
    values.update(overrides)
    config = SimConfig(**values)
    config.validate()
    return config


@pytest.fixture(scope="module")
def env():
    """One in-process env with two slots, shared by the cheap tests."""
    env = MetaWorldVecEnv(sim_config(tasks=["reach-v3", "drawer-close-v3", "button-press-topdown-v3"]), num_envs=2)
    yield env
    env.close()


def test_suites_and_instructions():
    assert suite_tasks("mt10") == MT10
    mt50 = suite_tasks("MT50")
    assert len(mt50) == 50 and set(MT10) <= set(mt50)
    texts = [instruction(t) for t in mt50]
    assert all(texts) and len(set(texts)) == 50, "every MT50 task needs its own instruction"
    assert set(INSTRUCTIONS) == set(mt50)
    assert instruction("drawer-open") == "open the drawer"
    assert resolve_tasks(SimConfig(tasks=["push-v3", "reach"])) == ["push-v3", "reach-v3"]
    assert resolve_tasks(SimConfig()) == MT10
    with pytest.raises(ValueError, match="drawer-open-v3"):
        check_task("drawer-opne")
    with pytest.raises(ValueError, match="unknown task suite"):
        suite_tasks("mt11")


def test_a_dataset_of_meta_world_instructions_maps_to_its_tasks_without_importing_libero():
    """sim_tasks reads Meta-World's table first: LIBERO (seconds to import, where the extra is installed) only for an
    instruction that table lacks; an instruction of no simulator is refused by name."""
    code = ("import sys; from worldloop.sims.tasks import instruction, sim_tasks; "
            "print(sim_tasks([instruction('reach-v3'), instruction('drawer-open-v3')]), 'libero' in sys.modules)")  # fmt: skip
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")[-2]
    assert shown == "['reach-v3', 'drawer-open-v3'] False"
    from worldloop.config import ConfigError
    from worldloop.sims.tasks import sim_tasks

    with pytest.raises(ConfigError, match="are not simulator tasks"):
        sim_tasks(["reach the goal position", "juggle three balls"])

def test_reset_and_step_shapes(env):
    assert isinstance(env, VecEnv)
    first = env.reset(task_ids=[0, "drawer-close-v3"], seeds=[0, 1])
    assert first.frames.shape == (2, 64, 64, 3) and first.frames.dtype == torch.uint8
    assert first.state.shape == (2, 39) and first.state.dtype == torch.float32
    assert first.instructions == ["reach the goal with the gripper", "close the drawer"]
    assert env.instructions == first.instructions
    out = env.step(torch.zeros(2, 8, 4))
    assert out.frames.shape == (2, 8, 64, 64, 3) and out.frames.dtype == torch.uint8
    assert out.success.shape == (2, 8) and out.success.dtype == torch.bool
    assert out.done.shape == (2, 8) and out.done.dtype == torch.bool
    assert out.reward.shape == (2,) and out.reward.dtype == torch.float32
    assert out.truncated.shape == (2,) and out.truncated.dtype == torch.bool
    assert out.state.shape == (2, 8, 39)
    assert env.elapsed_steps.tolist() == [8, 8]
    assert not torch.equal(out.frames[0, -1], first.frames[0]), "the arm settles: frames must change"


def _red_centroid(frame: torch.Tensor) -> tuple[float, float]:
    """(row, column) of the red Sawyer arm's pixels."""
    f = frame.int()
    rows, cols = torch.nonzero((f[..., 0] > 120) & (f[..., 1] < 70) & (f[..., 2] < 70), as_tuple=True)
    return rows.float().mean().item(), cols.float().mean().item()


def test_frames_are_right_side_up(env):
    first = env.reset(task_ids=[0, 0], seeds=[0, 0])
    f = first.frames[0].int()
    wood_rows = torch.nonzero((f[..., 0] > f[..., 2] + 30) & (f[..., 1] > f[..., 2] + 10))[:, 0]
    assert wood_rows.float().mean() > 32 + 6, "the table top must fill the lower part of the image"

    def move(direction, chunks=2):
        actions = torch.zeros(2, 8, 4)
        actions[..., :3] = torch.tensor(direction, dtype=torch.float32)
        for _ in range(chunks):
            out = env.step(actions)
        return out.state[0, -1, :3], _red_centroid(out.frames[0, -1])

    low, (row_low, _) = move([0, 0, -1])
    high, (row_high, _) = move([0, 0, 1], chunks=4)
    assert high[2] > low[2] + 0.15
    assert row_high < row_low - 2, "raising the gripper must move the arm up in the image"
    right, (_, col_right) = move([1, 0, 0])
    left, (_, col_left) = move([-1, 0, 0], chunks=4)
    assert right[0] > left[0] + 0.2
    # The corner camera looks along world +y from the robot's left front: world +x is image right
    # for an unmirrored picture (a vertical flip alone would mirror it).
    assert col_right > col_left + 2


def test_seeds_set_goals_and_first_frames(env):
    a = env.reset(task_ids=[0, 0], seeds=[3, 3])
    assert torch.equal(a.frames[0], a.frames[1]) and torch.equal(a.state[0], a.state[1])
    b = env.reset(task_ids=[0, 0], seeds=[3, 4])
    assert torch.equal(b.frames[0], a.frames[0]), "same seed, same first frame"
    assert not torch.allclose(b.state[0, -3:], b.state[1, -3:]), "different seeds must give different goals"
    assert not torch.equal(b.frames[0], b.frames[1])


def test_clean_expert_succeeds_on_three_mt10_tasks():
    config = sim_config(tasks=["reach-v3", "drawer-close-v3", "button-press-topdown-v3"], max_steps=150)
    with MetaWorldVecEnv(config, num_envs=3) as env:
        env.reset(task_ids=[0, 1, 2], seeds=[10, 11, 12])
        total_reward = torch.zeros(3)
        success = torch.zeros(3, dtype=torch.bool)
        while True:
            out, actions = env.step_expert()
            assert actions.shape == (3, 8, 4) and actions.abs().max() <= 1
            total_reward += out.reward
            success |= out.success.any(dim=1)
            assert not out.truncated.any()
            if out.done[:, -1].all():
                break
        assert success.all(), f"expert failed: {success.tolist()}"
        assert (env.elapsed_steps < config.max_steps).all(), "episodes end at success, before the time limit"
        assert torch.allclose(total_reward, torch.full((3,), REWARD_SCALE))
        # After the end nothing is simulated: frames repeat, done stays, the counter stops.
        steps = env.elapsed_steps
        out, actions = env.step_expert()
        assert out.done.all() and torch.equal(env.elapsed_steps, steps) and (actions == 0).all()
        assert torch.equal(out.frames[:, 0], out.frames[:, -1]) and (out.reward == 0).all()


def test_a_success_reached_and_lost_within_a_chunk_is_credited():
    """R is 'has succeeded by the end of the chunk': a success at step 2 of a 4-step chunk that is gone by
    step 4 earns c once (the loss mask closes at that chunk, so S = c), and nothing more later."""
    env = MetaWorldVecEnv(sim_config(chunk_size=4), num_envs=2)
    env._started = True  # the worker's results are made up below; no scene is simulated
    chunks = [
        [[F, T, F, F], [F, F, F, F]],  # env 0: success mid-chunk, lost by its end
        [[F, F, F, F], [F, F, F, T]],  # env 1: success at the chunk's last step
        [[F, F, F, F], [T, T, T, T]],
    ]

    def fake_call(command, payloads):
        success = torch.tensor(chunks.pop(0)).numpy()
        return {"frames": torch.zeros(2, 4, 64, 64, 3, dtype=torch.uint8).numpy(), "success": success, "done": success.copy() & False,
                "state": torch.zeros(2, 4, 39).numpy(), "actions": torch.zeros(2, 4, 4).numpy(), "steps": torch.zeros(2, dtype=torch.int64).numpy()}

    env._call = fake_call
    try:
        rewards = [env.step(torch.zeros(2, 4, 4)).reward.tolist() for _ in range(3)]
    finally:
        env.close()
    c = REWARD_SCALE
    assert rewards == [[c, 0.0], [0.0, c], [0.0, 0.0]]


def test_noisy_expert_produces_failures():
    expert = ExpertConfig(action_noise=0.3, perturb_prob=1.0, perturb_steps=25)
    plans = [plan_episode(expert, noisy=True, seed=s, perturb_start=(20, 30)) for s in range(3)]
    assert all(20 <= p.perturb_start <= 30 and p.perturb_length == 25 and p.noise_std == 0.3 for p in plans)
    assert plan_episode(expert, noisy=True, seed=1, perturb_start=(20, 30)) == plans[1], "a plan is a function of its seed"
    assert all(10 <= plan_episode(expert, noisy=True, seed=s).perturb_start <= 120 for s in range(20))
    assert plan_episode(expert, noisy=False, seed=0) == ExpertPlan(seed=0) and ExpertPlan(seed=0).is_clean
    # A clean pick-place takes ~55-75 steps; a 25-step perturbation leaves too little time.
    with MetaWorldVecEnv(sim_config(tasks=["pick-place-v3"], max_steps=64), num_envs=3) as env:
        env.reset(task_ids=[0, 0, 0], seeds=[0, 1, 2], expert_plans=plans)
        success = torch.zeros(3, dtype=torch.bool)
        truncated = torch.zeros(3, dtype=torch.bool)
        total_reward = torch.zeros(3)
        while True:
            out, _ = env.step_expert()
            success |= out.success.any(dim=1)
            truncated |= out.truncated
            total_reward += out.reward
            if out.done[:, -1].all():
                break
    assert (~success).any(), "perturbed episodes must include failures"
    assert torch.equal(truncated, ~success), "failures end by the time limit"
    assert torch.equal(total_reward, success.float() * 5.0)


def test_expert_noise_is_a_new_draw_every_step():
    """A noisy episode's action noise: one draw per step from the plan's seeded generator (collections are reproducible)."""
    import numpy as np

    from worldloop.sims.experts import ScriptedExpert

    observation = np.zeros(39)  # the hand at its goal: the clean reach action is 0, nothing clips
    assert not ScriptedExpert("reach-v3", ExpertPlan(seed=3)).act(observation, 0).any()
    expert = ScriptedExpert("reach-v3", ExpertPlan(noise_std=0.1, seed=3))
    white = np.stack([expert.act(observation, step) for step in range(12)])
    draws = np.random.default_rng([3, 104729]).normal(0.0, 0.1, size=(12, 4))  # one draw per step, in order
    assert np.allclose(white, np.clip(draws, -1, 1).astype(np.float32)) and len({tuple(row) for row in white}) == 12


def test_parallel_workers_match_in_process():
    tasks = ["reach-v3", "window-close-v3"]
    actions = torch.rand(3, 3, 8, 4, generator=torch.Generator().manual_seed(0)) * 2 - 1
    frames = {}
    for workers in (1, 2):
        with MetaWorldVecEnv(sim_config(tasks=tasks, num_workers=workers), num_envs=3) as env:
            chunks = [env.reset(task_ids=[0, 1, 1], seeds=[5, 6, 7]).frames]
            chunks += [env.step(a).frames.flatten(0, 1) for a in actions]
            frames[workers] = torch.cat(chunks)
            processes = list(env._processes)
            assert len(processes) == (0 if workers == 1 else 2) and env.worker_pids() == [p.pid for p in processes]
        assert not any(p.is_alive() for p in processes), "close() must end the workers"
    assert torch.equal(frames[1], frames[2])


def test_bench_sim_times_the_configured_simulator_and_reads_each_workers_memory(tmp_path):
    from worldloop.cli import main

    out = tmp_path / "sim.txt"
    assert main(["bench", "sim", "--preset", "micro", "--sizes", "64", "--workers", "1", "2", "--steps", "8", "--envs-per-worker", "1", "--out", str(out)]) == 0
    header, *rows = out.read_text().splitlines()[1:]
    assert header.split()[-1] == "MiB/worker" and [row.split()[1] for row in rows] == ["1", "2"]
    in_process, workers = rows[0].split(), rows[1].split()
    assert in_process[-1] == "-" and 20 < float(workers[-1]) < 4096  # a worker holds MuJoCo, its scenes and a GL context
    assert float(workers[3]) > 0 and "metaworld" in out.read_text().splitlines()[0]


def test_bad_input_gives_clear_errors(env):
    with pytest.raises(ValueError, match="did you mean drawer-open-v3"):
        MetaWorldVecEnv(sim_config(tasks=["drawer-opne-v3"]), num_envs=1)
    with pytest.raises(ValueError, match="camera"):
        MetaWorldVecEnv(SimConfig(camera="top"), num_envs=1)  # an unvalidated config
    with pytest.raises(ValueError, match="camera"):
        sim_config(camera="top")
    with pytest.raises(RuntimeError, match="reset"):
        MetaWorldVecEnv(sim_config(tasks=["reach-v3"]), num_envs=1).step(torch.zeros(1, 8, 4))
    with pytest.raises(ValueError, match="one task id and one seed per environment"):
        env.reset(task_ids=[0, 0], seeds=[0])
    with pytest.raises(ValueError, match="non-negative integers"):
        env.reset(task_ids=[0, 0], seeds=[0, -1])
    with pytest.raises(ValueError, match="out of range"):
        env.reset(task_ids=[0, 7], seeds=[0, 1])
    with pytest.raises(ValueError, match="unknown Meta-World task"):
        env.reset(task_ids=[0, "reach-v9"], seeds=[0, 1])
    env.reset(task_ids=[0, 0], seeds=[0, 1])
    with pytest.raises(ValueError, match=r"expected \(num_envs, chunk_size, action_dim\) = \(2, 8, 4\)"):
        env.step(torch.zeros(2, 8, 3))
    with pytest.raises(TypeError, match="floating point"):
        env.step(torch.zeros(2, 8, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="NaN"):
        env.step(torch.full((2, 8, 4), float("nan")))
    assert env.elapsed_steps.tolist() == [0, 0], "rejected actions must not step the simulator"
    with pytest.raises(ValueError, match="image_size"):
        sim_config(image_size=100)
    assert isinstance(make_env(sim_config(tasks=["reach-v3"]), 1), MetaWorldVecEnv)

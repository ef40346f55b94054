"""Shared test set-up: headless rendering, one torch thread, and a small real dataset.

The environment variables must be set before anything imports mujoco, which is why they are
set at the top of this file (pytest imports conftest before the test modules).
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch._dynamo  # noqa: E402,F401  loads triton's LLVM first: loaded after Mesa's (EGL rendering, in-process sims) it segfaults

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _same_random_state_for_every_test():
    """Each test starts from the same global random state, whatever ran before it in its process, so
    a test's outcome does not depend on how xdist spreads the suite or in which order it runs."""
    import random

    import numpy as np

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


LONGEST_FIRST = ("test_the_readme_quickstart_runs_as_written_on_the_micro_preset",)
"""Tests of minutes, run before the rest: under xdist the other workers share the rest of the suite while they run."""


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.originalname not in LONGEST_FIRST)  # stable: the rest keep their order


TINY_TASKS = ("reach-v3", "button-press-topdown-v3")
TINY_OVERRIDES = [
    f"sim.tasks=[{','.join(TINY_TASKS)}]",
    "sim.image_size=64",
    "sim.max_steps=48",
    "sim.num_workers=1",
    "collect.num_envs=4",
]
"""A real collection of 2 MT10 tasks x 2 episodes (episode 0 clean, episode 1 noisy), 48 steps at most."""


@pytest.fixture(scope="package")  # tests/ and everything below it: once per test run (per test process)
def tiny_dataset(tmp_path_factory) -> Path:
    """Root of a LeRobot v3.0 dataset made by a real ``collect`` (read it with TrajectoryDataset).

    2 tasks (reach, button-press-topdown) x 2 episodes at 64x64, at most 48 steps each; the clean
    reach episode succeeds, so it holds successes and failures. Built once per test run, by the first
    test that asks, and shared by every test: treat as read-only.
    """
    from worldloop.config import load_config
    from worldloop.data.collect import collect

    config = load_config("tiny-cpu", TINY_OVERRIDES)
    root = tmp_path_factory.mktemp("tiny_dataset") / "dataset"
    collect(config, root, episodes_per_task=2, progress=False)
    return root

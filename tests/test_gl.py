"""Headless rendering without help: the CLI picks an OpenGL backend itself, and says what to install when none works."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import TINY_OVERRIDES

from worldloop.data.dataset import TrajectoryDataset
from worldloop.utils.gl import default_gl_backend


def _libraries(*present):
    return lambda name: f"lib{name}.so.1" if name in present else None


def test_default_backend_is_egl_then_osmesa_and_keeps_the_users_choice():
    environ = {}
    assert default_gl_backend(environ, "Linux", _libraries("EGL", "OSMesa")) == "egl"
    assert environ == {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"}

    environ = {}
    assert default_gl_backend(environ, "Linux", _libraries("OSMesa")) == "osmesa"
    assert environ == {"MUJOCO_GL": "osmesa", "PYOPENGL_PLATFORM": "osmesa"}

    environ = {"MUJOCO_GL": "glfw"}
    assert default_gl_backend(environ, "Linux", _libraries("EGL")) == "glfw"
    assert environ == {"MUJOCO_GL": "glfw"}

    environ = {}
    assert default_gl_backend(environ, "Linux", _libraries()) is None
    assert environ == {}
    assert default_gl_backend(environ, "Darwin", _libraries("EGL")) is None
    assert environ == {}


def _plain_shell_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY")}
    return {**env, **extra}


def _collect(out, env):
    command = [sys.executable, "-m", "worldloop", "collect", "--out", str(out), "--episodes-per-task", "1", "--no-progress"]
    return subprocess.run([*command, *TINY_OVERRIDES], env=env, capture_output=True, text=True, timeout=300)


def test_collect_renders_in_a_plain_shell_without_MUJOCO_GL(tmp_path):
    done = _collect(tmp_path / "ds", _plain_shell_env())
    assert done.returncode == 0, done.stderr[-2000:]
    dataset = TrajectoryDataset(tmp_path / "ds")
    assert dataset.num_episodes == 2
    frames = next(iter(dataset.episodes())).frames
    assert frames.std() > 0  # a rendered scene, not a blank buffer


def test_collect_without_a_working_backend_names_what_to_install(tmp_path):
    done = _collect(tmp_path / "ds", _plain_shell_env(MUJOCO_GL="glfw"))  # glfw without a display cannot render
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()
    error = next(line for line in last if line.startswith("worldloop collect: error:"))
    assert "MUJOCO_GL=glfw" in error and "apt-get install libegl1" in error and "libosmesa6" in error
    assert "Traceback" not in done.stderr.split("worldloop collect: error:")[0]

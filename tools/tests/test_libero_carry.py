"""LIBERO's payload for a GPU host: which installed files it keeps, and robosuite without numba."""

import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from libero_carry import NUMBA_FREE_ROBOSUITE, carried_files, left_out  # noqa: E402
from worldloop.sims.libero_setup import libero_available

pytestmark = pytest.mark.skipif(not libero_available(), reason="LIBERO is not installed")


def installed(name: str) -> Path:
    """An installed file, given as ``package/inner/path``."""
    package, _, inner = name.partition("/")
    return Path(importlib.util.find_spec(package).submodule_search_locations[0]).resolve() / inner


def test_the_code_travels_and_of_the_data_only_what_the_scenes_opened():
    mesh = "robosuite/models/assets/robots/panda/meshes/hand.stl"
    files = carried_files({installed(mesh)})
    assert files[mesh] == installed(mesh)
    for code in ("robosuite/utils/numba.py", "libero/libero/envs/env_wrapper.py", "bddl/logic_base.py", "future/utils/__init__.py", "gym/__init__.py"):
        assert code in files
    assert "robosuite-1.4.0.dist-info/METADATA" in files and "robosuite-1.4.0.dist-info/RECORD" not in files
    sawyer = installed("robosuite/models/assets/robots/sawyer/meshes/base.obj")  # installed, but not opened
    assert sawyer.exists() and left_out({installed(mesh)}, files) == []
    assert left_out({installed(mesh), sawyer, Path(sys.executable).resolve()}, files) == [str(sawyer)]  # only the packages' own
    assert not any(name.endswith((".stl", ".obj", ".png", ".xml", ".bddl", ".init", ".pruned_init")) for name in files if name != mesh)
    assert not any(name.startswith(("robosuite/demos/", "past/", "libfuturize/")) or "__pycache__" in name for name in files)


def test_robosuite_jits_with_numba_and_runs_plain_without_it(monkeypatch):
    import robosuite.macros as macros

    def helpers():
        namespace = {}
        exec(compile(NUMBA_FREE_ROBOSUITE, "robosuite/utils/numba.py", "exec"), namespace)
        return namespace["jit_decorator"]

    def double(x):
        return 2 * x

    monkeypatch.setattr(macros, "ENABLE_NUMBA", True)
    monkeypatch.setattr(macros, "CACHE_NUMBA", False)
    if importlib.util.find_spec("numba") is not None:
        jitted = helpers()(double)
        assert jitted is not double and jitted(3.0) == 6.0
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba now raises ImportError
    assert helpers()(double) is double

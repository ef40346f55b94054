"""What an offline GPU host needs beyond its image, in one call's load: ``.site/site.tar.xz`` and ``.gl``.

    .venv/bin/python tools/site_carry.py            # from the repository root; ~2 min on 2 cores

``.site/site.tar.xz`` is a site-packages tree for CPython 3.12: diffusers, Meta-World (only the assets MT10's models
open), MuJoCo 3.3.0, gymnasium, PyOpenGL, glfw and PyAV. ``.gl`` holds Debian's glvnd loaders (libEGL, libOpenGL,
libGL): the H100 image of 2026-12-07 had neither PyAV nor any of them. On the host, ``source tools/setup.sh .gl .site``.
A call carries the tracked files (~14 MB) and these (~42 MB) within its 64 MiB.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WHEELS = ["diffusers==0.42.1", "metaworld==3.1.1", "mujoco==3.3.0", "gymnasium==1.4.0", "farama-notifications",
          "pyopengl", "glfw", "importlib-metadata", "av==19.0.2"]  # fmt: skip
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
GL_PACKAGES = ["libegl1", "libglvnd0", "libopengl0", "libgl1", "libglx0"]
DROPPED = ["OpenGL/DLLS"]  # Windows' DLLs


def reachable_assets(assets: Path, models: list[str]) -> set[str]:
    """Names of the files under ``assets`` that the model files ``models`` (names) open, directly or through includes.

    MuJoCo resolves an include against the main model's folder, not the including file's; matching by file name
    (Meta-World's names are unique) sidesteps both."""
    names = set(models)
    xmls = list(assets.rglob("*.xml"))
    while True:
        before = len(names)
        for xml in xmls:
            if xml.name in names:
                names.update(Path(m.group(1)).name for m in re.finditer(r'file="([^"]+)"', xml.read_text()))
        if len(names) == before:
            return names


def mt10_models() -> list[str]:
    """The model files of Meta-World's MT10 tasks, read from this interpreter's Meta-World (it must be 3.1.1)."""
    from importlib.metadata import version

    from metaworld.env_dict import MT10_V3

    if version("metaworld") != "3.1.1":
        raise SystemExit(f"site_carry.py: this Python has metaworld {version('metaworld')}; run it with one that has 3.1.1 (.venv/bin/python)")
    return [Path(cls.model_name.fget(cls.__new__(cls))).name for cls in MT10_V3.values()]


def prune_metaworld(site: Path) -> float:
    """Delete the Meta-World assets under ``site`` that no MT10 model opens; return the MB removed."""
    assets = site / "metaworld" / "assets"
    keep = reachable_assets(assets, mt10_models())
    dropped = [p for p in assets.rglob("*") if p.is_file() and p.name not in keep]
    size = sum(p.stat().st_size for p in dropped)
    for p in dropped:
        p.unlink()
    return size / 1e6


def build_site(out: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        wheels, site = Path(tmp) / "wheels", Path(tmp) / "site"
        target = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"]
        for platform in PLATFORMS:
            target += ["--platform", platform]
        pip = [sys.executable, "-m", "pip", "-q"]
        subprocess.run([*pip, "download", "--no-deps", *target, "-d", str(wheels), *WHEELS], check=True)
        subprocess.run([*pip, "install", "--no-index", "--no-deps", "--no-compile", "--ignore-requires-python",
                        *target, "--target", str(site), *map(str, sorted(wheels.glob("*.whl")))], check=True)  # fmt: skip
        print(f"site_carry.py: dropped {prune_metaworld(site):.1f} MB of Meta-World assets no MT10 task opens")
        for name in DROPPED:
            shutil.rmtree(site / name, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        archive = out / "site.tar.xz"
        partial = archive.with_suffix(".xz.partial")
        with open(partial, "wb") as sink:
            tar = subprocess.Popen(["tar", "-cf", "-", "-C", str(site), "."], stdout=subprocess.PIPE)
            subprocess.run(["xz", "-T2", "-9e"], stdin=tar.stdout, stdout=sink, check=True)
            if tar.wait():
                raise SystemExit("site_carry.py: tar failed")
        partial.replace(archive)
    return archive


def fetch_gl(out: Path) -> None:
    if shutil.which("apt-get") is None:
        raise SystemExit(f"site_carry.py: no apt-get here to download {', '.join(GL_PACKAGES)}: run it on a Debian or Ubuntu machine")
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["apt-get", "download", *GL_PACKAGES], cwd=out, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, default=Path(".site"))
    parser.add_argument("--gl", type=Path, default=Path(".gl"))
    args = parser.parse_args()
    fetch_gl(args.gl)
    archive = build_site(args.site)
    print(f"site_carry.py: {archive} {archive.stat().st_size / 1e6:.1f} MB; {args.gl}: {', '.join(GL_PACKAGES)}")


if __name__ == "__main__":
    main()

"""Headless OpenGL for MuJoCo: a default backend chosen before mujoco loads, and a clear error where none works.

MuJoCo reads ``MUJOCO_GL`` once, when it is first imported; unset on Linux it tries GLFW, which needs a
display, and a plain shell without one then dies at the first rendered frame with "an OpenGL platform
library has not been loaded". :func:`default_gl_backend` runs when ``worldloop`` is imported (every CLI
verb and ``python -m worldloop`` pass through it): it keeps the user's own ``MUJOCO_GL`` and otherwise
picks EGL, then OSMesa, whichever library the system has. It only looks the libraries up, it loads
nothing (a GL driver loaded this early would come before torch's own libraries).
"""

from __future__ import annotations

import ctypes.util
import os
import platform
from collections.abc import Callable, MutableMapping

BACKENDS = (("egl", "EGL"), ("osmesa", "OSMesa"))
"""(MUJOCO_GL value, library name) in the order they are tried."""

INSTALL_HINT = (
    "install an offscreen OpenGL library, e.g. on Debian/Ubuntu `apt-get install libegl1 libgl1 libegl-mesa0 "
    "libgl1-mesa-dri` (EGL) or `apt-get install libosmesa6` (OSMesa), or set MUJOCO_GL to a backend that works "
    "here (egl, osmesa, or glfw with a display)"
)


class RenderingUnavailable(RuntimeError):
    """MuJoCo could not open an OpenGL context with the backend in effect."""

    @classmethod
    def from_error(cls, error: BaseException) -> RenderingUnavailable:
        backend = os.environ.get("MUJOCO_GL") or "unset"
        return cls(f"MuJoCo cannot render with MUJOCO_GL={backend} ({type(error).__name__}: {error}); {INSTALL_HINT}")


def default_gl_backend(
    environ: MutableMapping[str, str] = os.environ,
    system: str | None = None,
    find_library: Callable[[str], str | None] = ctypes.util.find_library,
) -> str | None:
    """Set MUJOCO_GL (and PYOPENGL_PLATFORM to match) unless already set; return the backend in effect.

    Linux only (macOS and Windows render through their own window systems). None: nothing set and no
    offscreen library found; rendering will then fail with :class:`RenderingUnavailable`.
    """
    if environ.get("MUJOCO_GL"):
        return environ["MUJOCO_GL"]
    if (system or platform.system()) != "Linux":
        return None
    for backend, library in BACKENDS:
        if find_library(library):
            environ["MUJOCO_GL"] = backend
            environ.setdefault("PYOPENGL_PLATFORM", backend)
            return backend
    return None

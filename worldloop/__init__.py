"""worldloop: RL post-training of VLA policies inside a learned video world model."""

from worldloop.utils.gl import default_gl_backend

__version__ = "0.1.0"

# Before anything imports mujoco: a headless rendering backend unless the user chose one.
default_gl_backend()

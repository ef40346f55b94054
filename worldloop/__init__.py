"""worldloop: RL post-training of VLA policies inside a learned video world model."""

__version__ = "0.1.0"

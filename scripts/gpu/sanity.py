"""Quick check of the H200 host: torch sees the GPU, MuJoCo renders Meta-World through EGL, diffusers imports."""
import time

import numpy as np
import torch

print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
import diffusers, transformers, mujoco, metaworld  # noqa: E401

print("diffusers", diffusers.__version__, "transformers", transformers.__version__, "mujoco", mujoco.__version__)
import gymnasium as gym

env = gym.make("Meta-World/MT1", env_name="reach-v3", render_mode="rgb_array", camera_name="corner", width=128, height=128)
env.reset(seed=0)
t = time.time()
for _ in range(200):
    env.step(env.action_space.sample())
    frame = env.render()
dt = time.time() - t
print("render", frame.shape, frame.dtype, "mean", float(np.mean(frame)), f"{200 / dt:.1f} steps/s with render")

# Sourced by the scripts/gpu/*.sh runs: headless MuJoCo through NVIDIA's EGL, unbuffered output,
# and WL=(the worldloop command) for the host's python3 (or $PY).
export MUJOCO_GL=egl PYOPENGL_PLATFORM=egl PYTHONUNBUFFERED=1
NVIDIA_EGL=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
if [ -z "${__EGL_VENDOR_LIBRARY_FILENAMES:-}" ] && [ -f "$NVIDIA_EGL" ]; then export __EGL_VENDOR_LIBRARY_FILENAMES=$NVIDIA_EGL; fi
PY=${PY:-python3}
if command -v worldloop >/dev/null; then WL=(worldloop); else WL=("$PY" -m worldloop); fi

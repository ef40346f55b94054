# Sourced by the scripts/gpu/*.sh runs: headless MuJoCo through NVIDIA's EGL, unbuffered output,
# WL=(the worldloop command) for the host's python3 (or $PY), and `step` (set LOG before calling it).
export MUJOCO_GL=egl PYOPENGL_PLATFORM=egl PYTHONUNBUFFERED=1
NVIDIA_EGL=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
if [ -z "${__EGL_VENDOR_LIBRARY_FILENAMES:-}" ] && [ -f "$NVIDIA_EGL" ]; then export __EGL_VENDOR_LIBRARY_FILENAMES=$NVIDIA_EGL; fi
PY=${PY:-python3}
if command -v worldloop >/dev/null; then WL=(worldloop); else WL=("$PY" -m worldloop); fi

step() {  # step NAME SECONDS CMD...: run with a time limit, log everything to $LOG, show the tail, keep going
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s): $*" | tee -a "$LOG"
  local start=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee -a "$LOG" | grep -v -e "it/s]" -e "s/it]" -e "Loading weights" | tail -n 8
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$LOG"
  return "$rc"
}

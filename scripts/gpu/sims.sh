#!/usr/bin/env bash
# Real-simulator speed on the GPU host: `worldloop bench sim` with MuJoCo rendering through
# NVIDIA's EGL. Assumes worldloop, its wheels and the GL libraries are installed (the lead's set-up).
# Writes $OUT/bench_sim.txt (the table) and $OUT/gl_renderer.txt; bounded to 2.5 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/gpu-sims}
mkdir -p "$OUT"
source scripts/gpu/common.sh
WORKERS=${WORKERS:-$(nproc)}; [ "$WORKERS" -gt 16 ] && WORKERS=16

# Which OpenGL renders: it must name the NVIDIA GPU, not llvmpipe (software).
timeout 15 "$PY" - >"$OUT/gl_renderer.txt" 2>&1 <<'PYEOF'
import mujoco
from OpenGL import GL
context = mujoco.GLContext(64, 64)
context.make_current()
print("GL_RENDERER:", GL.glGetString(GL.GL_RENDERER).decode(), "| GL_VERSION:", GL.glGetString(GL.GL_VERSION).decode())
context.free()
PYEOF
cat "$OUT/gl_renderer.txt"

# Shadows off (the default) at 64/128/256, one process and $WORKERS workers; then shadows on at 128
# to record the cost of shadows on this host.
timeout 120 "${WL[@]}" bench sim sim.shadows=false --sizes 64 128 256 --workers 1 "$WORKERS" --steps 96 --envs-per-worker 2 \
  --out "$OUT/bench_sim.txt"
status=$?
timeout 20 "${WL[@]}" bench sim sim.shadows=true --sizes 128 --workers 1 --steps 96 --out "$OUT/bench_sim_shadows.txt" || true

echo
echo "== worldloop bench sim on $(hostname) ($(nproc) CPUs) =="
cat "$OUT/gl_renderer.txt"
cat "$OUT/bench_sim.txt" 2>/dev/null || echo "bench sim failed (exit $status)"
cat "$OUT/bench_sim_shadows.txt" 2>/dev/null || true
exit $status

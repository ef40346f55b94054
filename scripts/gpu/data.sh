#!/usr/bin/env bash
# Trajectory collection and reading on the GPU host (MuJoCo rendering through NVIDIA's EGL):
#   1. `worldloop collect` MT10 x 5 episodes at 128x128 (metaworld-gpu preset), timed;
#   2. the same folder resumed to 50 episodes per task (the preset's dataset, 500 episodes);
#   3. TrajectoryDataset read speed: cold (decoding mp4 into the cache) and warm (from the cache).
# Assumes the lead's set-up (source scripts/gpu/setup.sh). Writes everything to $OUT
# (default runs/gpu-data): c5.log, dataset/ (+ summary.json, config.yaml), read.txt, summary.md.
# Bounded: 5 + 8 + 3 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/gpu-data}
mkdir -p "$OUT"
source scripts/gpu/common.sh
WORKERS=$(nproc); [ "$WORKERS" -gt 16 ] && WORKERS=16
COMMON=(--preset metaworld-gpu --out "$OUT/dataset" --no-progress "sim.num_workers=$WORKERS")

SECONDS=0
timeout 300 "${WL[@]}" collect "${COMMON[@]}" --episodes-per-task 5 2>&1 | tee "$OUT/c5.log"
c5_status=${PIPESTATUS[0]}
c5_time=$SECONDS
cp "$OUT/dataset/summary.json" "$OUT/summary_c5.json" 2>/dev/null || true

SECONDS=0
timeout 480 "${WL[@]}" collect "${COMMON[@]}" --episodes-per-task 50 2>&1 | tee "$OUT/c50.log"
c50_status=${PIPESTATUS[0]}
c50_time=$SECONDS

timeout 180 "$PY" - "$OUT/dataset" >"$OUT/read.txt" 2>&1 <<'PYEOF'
import shutil, sys, time
from pathlib import Path
from worldloop.data.dataset import TrajectoryDataset
root = Path(sys.argv[1])
shutil.rmtree(root / ".cache", ignore_errors=True)
for label in ("cold (decode + cache)", "warm (cache)"):
    ds = TrajectoryDataset(root)
    start, frames = time.time(), 0
    for episode in ds.episodes():
        frames += len(episode)
    dt = time.time() - start
    print(f"read {label}: {ds.num_episodes} episodes, {frames} frames in {dt:.1f} s = {ds.num_episodes / dt:.1f} ep/s, {frames / dt:.0f} frames/s")
PYEOF

{
  echo "## worldloop collect on $(hostname) ($(nproc) CPUs, $WORKERS workers)"
  echo
  echo "- MT10 x 5 (metaworld-gpu, 128x128): exit $c5_status, ${c5_time} s wall"
  echo "- resumed to MT10 x 50: exit $c50_status, ${c50_time} s wall"
  echo
  echo '```'
  sed -n '/^task /,/new episodes/p' "$OUT/c5.log"
  echo
  sed -n '/^task /,/new episodes/p' "$OUT/c50.log"
  echo
  cat "$OUT/read.txt"
  echo '```'
} >"$OUT/summary.md"
cat "$OUT/summary.md"
[ "$c5_status" = 0 ] && [ "$c50_status" = 0 ]

#!/usr/bin/env bash
# World model on one H200: train-vae + train-wm (small preset, ~8 min of training in total),
# eval-wm on held-out trajectories (vs copy-last-frame), and bench wm (tiny, small, wan2.2-5b dims).
# Usage: OUT=/path/out scripts/gpu/worldmodel.sh DATASET_DIR
#   DATASET_DIR: a Meta-World dataset written by `worldloop collect` (64x64 or 128x128).
# Env knobs: VAE_SECONDS (150), WM_SECONDS (330), SKIP_BENCH=1, PY (python with worldloop importable).
set -euo pipefail
DATA=${1:?usage: OUT=dir scripts/gpu/worldmodel.sh DATASET_DIR}
OUT=${OUT:?set OUT to the output folder}
PY=${PY:-python}
VAE_SECONDS=${VAE_SECONDS:-150}
WM_SECONDS=${WM_SECONDS:-330}
mkdir -p "$OUT"
export MUJOCO_GL=${MUJOCO_GL:-egl} PYOPENGL_PLATFORM=${PYOPENGL_PLATFORM:-egl}
IMG=$($PY -c "from worldloop.data.dataset import TrajectoryDataset as T; print(T('$DATA').image_size)")
echo "dataset $DATA at ${IMG}x${IMG}" | tee "$OUT/log.txt"
# 8x spatial VAE at 128 (16x16 latents), 4x at 64 (16x16 latents): 256 DiT tokens either way.
if [ "$IMG" -ge 128 ]; then DOWN=3; else DOWN=2; fi
COMMON=(device=cuda)
wl() { $PY -m worldloop "$@"; }

# 1. VAE (bounded by time; steps is an upper bound)
timeout $((VAE_SECONDS + 240)) $PY -m worldloop train-vae --dataset "$DATA" --out "$OUT/vae" "${COMMON[@]}" \
  vae.size=small vae.spatial_downsamples=$DOWN vae.steps=6000 vae.batch_size=16 vae.clip_frames=5 vae.lr=5e-4 \
  vae.time_limit_s=$VAE_SECONDS vae.log_every=50 vae.checkpoint_every=1000 2>&1 | grep -v "it/s]" | tail -20 | tee -a "$OUT/log.txt"

# 2. world model (small preset)
timeout $((WM_SECONDS + 300)) $PY -m worldloop train-wm --dataset "$DATA" --vae "$OUT/vae" --out "$OUT/wm" "${COMMON[@]}" \
  world_model.size=small world_model.steps=20000 world_model.batch_size=64 world_model.lr=3e-4 world_model.clip_stride=2 \
  world_model.time_limit_s=$WM_SECONDS world_model.sample_every=2000 world_model.checkpoint_every=2000 world_model.ema_decay=0.995 \
  2>&1 | grep -v "it/s]" | tail -12 | tee -a "$OUT/log.txt"

# 3. open-loop evaluation on held-out episodes
timeout 300 $PY -m worldloop eval-wm --world-model "$OUT/wm" --dataset "$DATA" --out "$OUT/eval" "${COMMON[@]}" \
  world_model.eval_episodes=32 2>&1 | tail -3 | tee -a "$OUT/log.txt" || echo "eval-wm failed" | tee -a "$OUT/log.txt"

# 4. throughput (random weights)
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout 420 $PY -m worldloop bench wm --out "$OUT/bench_wm.txt" "${COMMON[@]}" \
    'world_model.bench_sizes=[small,wan2.2-5b]' 'world_model.bench_batch_sizes=[8,32,64]' 2>&1 | tail -12 | tee -a "$OUT/log.txt" \
    || echo "bench wm failed or timed out" | tee -a "$OUT/log.txt"
fi

# 5. table
$PY - "$OUT" <<'PYEOF' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
vae = json.loads((out / "vae/metrics.json").read_text())
print(f"VAE held-out reconstruction: PSNR {vae['held_out']['psnr']:.2f} dB  SSIM {vae['held_out']['ssim']:.4f}  ({vae['steps']} steps)")
res = json.loads((out / "wm/results.json").read_text())
print(f"WM: {res['steps']} steps, final loss {res['final_loss']:.4f}, {res['parameters_millions']:.1f} M params, {res['clips']} clips")
m = json.loads((out / "eval/metrics.json").read_text())
print(f"{'horizon':>7} {'eps':>4} {'PSNR':>7} {'copy':>7} {'SSIM':>7} {'copy':>7}  beats?")
for h, r in m["horizons"].items():
    ok = r["psnr"] > r["copy_last_frame_psnr"] and r["ssim"] > r["copy_last_frame_ssim"]
    print(f"{h:>7} {r['episodes']:>4} {r['psnr']:7.2f} {r['copy_last_frame_psnr']:7.2f} {r['ssim']:7.4f} {r['copy_last_frame_ssim']:7.4f}  {'yes' if ok else 'NO'}")
print(f"rollout {m['rollout_frames_per_second']:.1f} frames/s with {m['num_envs']} envs; LPIPS/FID/FVD: {m['lpips']}")
bench = out / "bench_wm.txt"
if bench.exists():
    print(bench.read_text())
PYEOF

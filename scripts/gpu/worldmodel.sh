#!/usr/bin/env bash
# World model on one H200: train-vae + train-wm (small preset, ~8 min of training in total),
# eval-wm on held-out trajectories (vs copy-last-frame), and bench wm (tiny, small, wan2.2-5b dims).
# Usage: OUT=/path/out scripts/gpu/worldmodel.sh DATASET_DIR
#   DATASET_DIR: a Meta-World dataset written by `worldloop collect` (64x64 or 128x128).
# Env knobs: VAE_SECONDS (150), WM_SECONDS (240), VAE_STEPS ("": bounded by time alone; N: the VAE trains
# N steps, VAE_SECONDS then only caps it, so its quality does not depend on what else shares the machine),
# VAE_FROM (a VAE folder trained in an earlier lease, e.g. unpacked by `python -m worldloop.utils.parts`:
# used as it is, not trained), VAE_INIT (such a folder that the VAE trains on from, for VAE_STEPS / VAE_SECONDS
# more: a VAE grows over several leases; with WM_FROM, the DiT then continues on this VAE), WM_FROM (a world-model folder from an earlier lease, its vae/ included:
# train-wm continues it with --init for WM_SECONDS more, on its own VAE unless VAE_FROM says otherwise;
# WM_SECONDS=0: used as it is, linked as $OUT/wm and only evaluated, so what waits for it starts minutes earlier),
# CARRY (a folder: the trained DiT, and the VAE when trained here, packed there in 15 MB parts for the
# next lease; see worldloop/utils/parts.py), VAE_CHANNELS_LAST (1: vae.channels_last, session.sh sets it when
# `bench vae-train` found that layout faster), SKIP_BENCH=1, PRESET (metaworld-gpu), EXTRA (overrides),
# EVAL_MEMORY_NOISE ("": extra eval-wm runs, one per world_model.memory_noise level, e.g. "0.1 0.2"),
# EVAL_ACTION_GUIDANCE ("": extra eval-wm runs, one per world_model.action_guidance scale, e.g. "1.5 2 3"; the
# model must have trained with world_model.action_dropout > 0, e.g. EXTRA="... world_model.action_dropout=0.1"),
# EVAL_SAMPLING_STEPS ("": extra eval-wm runs, one per world_model.sampling_steps value, e.g. "10 20"),
# EVAL_COUNTERFACTUAL (1: eval-wm --counterfactual, the simulator driven by the same swapped actions; 0: off),
# EVAL_FROM (1: with WM_FROM and WM_SECONDS > 0, eval-wm of the carried model as it came too, into eval-from),
# MORE_DATA (more dataset folders, e.g. a policy's rollouts: the world model trains on them too and
# eval-wm replays their held-out episodes as well; each is waited for, MORE_DATA_WAIT_S = 300 s at most,
# until its collection wrote summary.json), WM_ALSO ("": key=value overrides of a second DiT that trains
# alongside the first, from the same start (scratch, or WM_FROM: then the overrides must keep its architecture),
# on the same data, VAE and WM_SECONDS, into $OUT/wm-also; eval-wm measures it on the same episodes (eval-also*),
# an A/B within one lease; only $OUT/wm goes downstream), PY (python with
# worldloop importable).
# Run from the repository root after `source scripts/gpu/setup.sh .whl .whl2` (diffusers + av importable).
# Wall time: ~4 min VAE, ~5.5 min WM (clip encoding + 240 s), ~1 min eval, up to 7 min bench.
set -euo pipefail
DATA=${1:?usage: OUT=dir scripts/gpu/worldmodel.sh DATASET_DIR}
OUT=${OUT:?set OUT to the output folder}
PY=${PY:-python3}
VAE_SECONDS=${VAE_SECONDS:-150}
WM_SECONDS=${WM_SECONDS:-240}
mkdir -p "$OUT"
export MUJOCO_GL=${MUJOCO_GL:-egl} PYOPENGL_PLATFORM=${PYOPENGL_PLATFORM:-egl}
IMG=$($PY -c "from worldloop.data.dataset import TrajectoryDataset as T; print(T('$DATA').image_size)")
echo "dataset $DATA at ${IMG}x${IMG}" | tee "$OUT/log.txt"
# 8x spatial VAE at 128 (16x16 latents), 4x at 64 (16x16 latents): 256 DiT tokens either way.
if [ "$IMG" -ge 128 ]; then DOWN=3; else DOWN=2; fi
read -r -a EXTRA <<< "${EXTRA:-device=cuda}"  # extra key=value overrides (a CPU dry run: EXTRA="device=cpu ...")
COMMON=(--preset "${PRESET:-metaworld-gpu}" "${EXTRA[@]}")

# 0. WM_FROM with WM_SECONDS=0: linked before anything else, so that the judge, which waits for it, can start
USE_AS_IS=0
if [ -n "${WM_FROM:-}" ] && [ "$WM_SECONDS" = 0 ] && [ -f "$WM_FROM/config.json" ]; then
  USE_AS_IS=1
  if [ -e "$OUT/wm" ] && [ ! -L "$OUT/wm" ]; then echo "$OUT/wm is a trained model: not replaced by a link to $WM_FROM" | tee -a "$OUT/log.txt"; exit 1; fi
  ln -sfn "$(cd "$WM_FROM" && pwd)" "$OUT/wm"
  echo "world model: $WM_FROM used as it is (WM_SECONDS=0), linked as $OUT/wm" | tee -a "$OUT/log.txt"
fi

# 1. VAE (bounded by time and vae.steps, whichever ends first), or VAE_FROM's, measured on this held-out split
if [ -n "${WM_FROM:-}" ]; then
  [ -f "$WM_FROM/config.json" ] || { echo "WM_FROM=$WM_FROM is not a world-model folder (no config.json)" | tee -a "$OUT/log.txt"; exit 1; }
  [ -n "${VAE_INIT:-}" ] || VAE_FROM=${VAE_FROM:-$WM_FROM/vae}
  [ "$USE_AS_IS" = 1 ] || echo "world model: continuing $WM_FROM (its DiT trains on with --init), VAE from ${VAE_FROM:-training on from $VAE_INIT}" | tee -a "$OUT/log.txt"
fi
if [ -n "${VAE_FROM:-}" ]; then VAE_ARGS=("vae.pretrained=$VAE_FROM")
else VAE_ARGS=(vae.spatial_downsamples=$DOWN vae.time_limit_s=$VAE_SECONDS ${VAE_STEPS:+vae.steps=$VAE_STEPS} ${VAE_INIT:+vae.init=$VAE_INIT})
  [ "${VAE_CHANNELS_LAST:-0}" = 1 ] && VAE_ARGS+=(vae.channels_last=true); fi
timeout $((VAE_SECONDS + 240)) $PY -m worldloop train-vae --dataset "$DATA" --out "$OUT/vae" "${COMMON[@]}" "${VAE_ARGS[@]}" \
  2>&1 | grep -v "it/s]" | tail -20 | tee -a "$OUT/log.txt"

# 2. world model (small preset) on DATASET and the MORE_DATA folders that are ready
DATASETS=("$DATA")
for MORE in ${MORE_DATA:-}; do
  for _ in $(seq $((${MORE_DATA_WAIT_S:-300} / 5))); do [ -f "$MORE/summary.json" ] && break; sleep 5; done
  if [ -f "$MORE/summary.json" ]; then DATASETS+=("$MORE"); else echo "$MORE is not collected: training without it" | tee -a "$OUT/log.txt"; fi
done
if [ "$USE_AS_IS" = 1 ]; then
  [ -z "${WM_ALSO:-}" ] || echo "WM_ALSO ignored: WM_SECONDS=0 trains no DiT" | tee -a "$OUT/log.txt"
elif [ -n "${WM_ALSO:-}" ]; then
  read -r -a ALSO <<< "$WM_ALSO"
  echo "A/B: a second DiT with ${WM_ALSO} trains alongside into $OUT/wm-also" | tee -a "$OUT/log.txt"
  timeout $((WM_SECONDS + 300)) $PY -m worldloop train-wm --dataset "${DATASETS[@]}" --vae "$OUT/vae" --out "$OUT/wm-also" "${COMMON[@]}" \
    ${WM_FROM:+--init "$WM_FROM"} world_model.time_limit_s=$WM_SECONDS "${ALSO[@]}" > "$OUT/wm-also.log" 2>&1 &
  ALSO_PID=$!
fi
if [ "$USE_AS_IS" = 0 ]; then
  timeout $((WM_SECONDS + 300)) $PY -m worldloop train-wm --dataset "${DATASETS[@]}" --vae "$OUT/vae" --out "$OUT/wm" "${COMMON[@]}" \
    ${WM_FROM:+--init "$WM_FROM"} world_model.time_limit_s=$WM_SECONDS 2>&1 | grep -v "it/s]" | tail -12 | tee -a "$OUT/log.txt"
fi

# 2a. the trained models in parts for the next lease: the DiT without its VAE and clip cache, and the VAE unless it came from one
if [ -n "${CARRY:-}" ] && [ "$USE_AS_IS" = 0 ] && [ -f "$OUT/wm/model.safetensors" ]; then
  mkdir -p "$CARRY"
  { $PY -m worldloop.utils.parts pack "$OUT/wm" "$CARRY" wm --skip vae latents.safetensors latents.json \
      && { [ -n "${VAE_FROM:-}" ] || $PY -m worldloop.utils.parts pack "$OUT/vae" "$CARRY" vae; }; } 2>&1 | tee -a "$OUT/log.txt" \
    || echo "packing for the next lease failed (the evaluations go on)" | tee -a "$OUT/log.txt"
fi

# 3. open-loop evaluation on the held-out episodes of every dataset (DATA -> PREFIX, a policy's rollouts ->
#    PREFIX-<name>: does the model follow its actions?), for the model and, with WM_ALSO, its A/B twin
COUNTERFACTUAL=(); [ "${EVAL_COUNTERFACTUAL:-1}" = 1 ] && COUNTERFACTUAL=(--counterfactual)  # the simulator under the swapped actions too
evaluate_on_held_out() {  # MODEL_DIR PREFIX
  local D NAME
  for D in "${DATASETS[@]}"; do
    [ "$D" = "$DATA" ] && NAME=$2 || NAME="$2-$(basename "$D")"
    timeout 300 $PY -m worldloop eval-wm --world-model "$1" --dataset "$D" --out "$OUT/$NAME" "${COMMON[@]}" "${COUNTERFACTUAL[@]}" \
      2>&1 | tail -3 | tee -a "$OUT/log.txt" || echo "eval-wm of $1 on $D failed" | tee -a "$OUT/log.txt"
  done
}
evaluate_on_held_out "$OUT/wm" eval
# 3a. the carried model as it came (WM_FROM), on the same episodes: what this lease's training changed (EVAL_FROM=0: skip)
if [ -n "${WM_FROM:-}" ] && [ "$USE_AS_IS" = 0 ] && [ "${EVAL_FROM:-1}" = 1 ]; then
  timeout 300 $PY -m worldloop eval-wm --world-model "$WM_FROM" --dataset "$DATA" --out "$OUT/eval-from" "${COMMON[@]}" "${COUNTERFACTUAL[@]}" \
    2>&1 | tail -3 | tee -a "$OUT/log.txt" || echo "eval-wm of $WM_FROM failed" | tee -a "$OUT/log.txt"
fi
if [ -n "${ALSO_PID:-}" ]; then
  wait "$ALSO_PID" || echo "train-wm with ${WM_ALSO} failed (see $OUT/wm-also.log)" | tee -a "$OUT/log.txt"
  grep -v "it/s]" "$OUT/wm-also.log" | tail -3 | tee -a "$OUT/log.txt"
  evaluate_on_held_out "$OUT/wm-also" eval-also
fi

# 3b. the same model sampled otherwise, on the same episodes (paired in the summary), one eval-wm per value:
#     the memory latent noised at every rollout step, action guidance (does it follow its actions more), more
#     sampler steps (are its frames sharper: sharpness ratio)
eval_variant() {  # OPTION VALUE FOLDER
  timeout 300 $PY -m worldloop eval-wm --world-model "$OUT/wm" --dataset "$DATA" --out "$OUT/$3" "${COMMON[@]}" \
    "world_model.$1=$2" 2>&1 | tail -3 | tee -a "$OUT/log.txt" || echo "eval-wm $1=$2 failed" | tee -a "$OUT/log.txt"
}
for LEVEL in ${EVAL_MEMORY_NOISE:-}; do eval_variant memory_noise "$LEVEL" "eval-memory-noise-$LEVEL"; done
for SCALE in ${EVAL_ACTION_GUIDANCE:-}; do eval_variant action_guidance "$SCALE" "eval-action-guidance-$SCALE"; done
for STEPS in ${EVAL_SAMPLING_STEPS:-}; do eval_variant sampling_steps "$STEPS" "eval-sampling-steps-$STEPS"; done

# 4. throughput (random weights)
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout 420 $PY -m worldloop bench wm --out "$OUT/bench_wm.txt" "${COMMON[@]}" 2>&1 | tail -12 | tee -a "$OUT/log.txt" \
    || echo "bench wm failed or timed out" | tee -a "$OUT/log.txt"
fi

# 5. table
$PY - "$OUT" ${WM_ALSO:-} <<'PYEOF' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def section(name, fn):
    try:
        fn()
    except Exception as error:  # one missing stage must not hide the others
        print(f"{name}: not available ({type(error).__name__}: {error})")
def vae():
    m = json.loads((out / "vae/metrics.json").read_text())
    print(f"VAE held-out reconstruction (13-frame clips): PSNR {m['held_out']['psnr']:.2f} dB  SSIM {m['held_out']['ssim']:.4f}  ({m['steps']} steps)")
def wm(folder="wm"):
    r = json.loads((out / folder / "results.json").read_text())
    total = f" ({r['steps_total']} in all)" if r.get("steps_total", r["steps"]) != r["steps"] else ""
    print(f"{folder}: {r['steps']} steps{total}, final loss {r['final_loss']:.4f}, {r['parameters_millions']:.1f} M params, {r['clips']} clips")
def ev(folder="eval"):
    m = json.loads((out / folder / "metrics.json").read_text())
    print(f"{folder} (memory_noise {m['sampling'].get('memory_noise', 0.0)}, action_guidance {m['sampling'].get('action_guidance', 1.0)}):")
    print(f"{'horizon':>7} {'eps':>4} {'PSNR':>7} {'copy':>7} {'margin SE':>9} {'SSIM':>7} {'copy':>7} {'margin SE':>9} "
          f"{'action dPSNR':>12} {'SE':>5} {'still PSNR':>10} {'sharpness':>9}  beats copy-last-frame?")
    for h, r in m["horizons"].items():
        ok = r["psnr"] > r["copy_last_frame_psnr"] and r["ssim"] > r["copy_last_frame_ssim"]
        print(f"{h:>7} {r['episodes']:>4} {r['psnr']:7.2f} {r['copy_last_frame_psnr']:7.2f} {r.get('psnr_margin_stderr', float('nan')):9.2f} "
              f"{r['ssim']:7.4f} {r['copy_last_frame_ssim']:7.4f} {r.get('ssim_margin_stderr', float('nan')):9.4f} "
              f"{r.get('action_delta_psnr', float('nan')):12.2f} {r.get('action_delta_psnr_stderr', float('nan')):5.2f} "
              f"{r.get('psnr_still', float('nan')):10.2f} {r.get('sharpness_ratio', float('nan')):9.2f}  {'yes' if ok else 'NO'}")
    print("action dPSNR: PSNR lost when each episode is replayed with the next one's actions (near 0: the model ignores them)")
    print("still PSNR: where the real frame still equals the first one (the table, untouched objects); copy-last-frame is exact there")
    print("sharpness: the model's fine detail (mean |Laplacian|) over the real frames' (1: as sharp; PSNR forgives blur, a policy may not)")
    print(f"rollout {m['rollout_frames_per_second']:.1f} frames/s with {m['num_envs']} envs; LPIPS/FID/FVD: {m['lpips']}")
    if m.get("counterfactual"):
        print("counterfactual (the simulator under the same swapped actions; PSNR in dB):")
        print(f"{'horizon':>7} {'eps':>4} {'model vs sim':>12} {'blind':>7} {'gain':>6} {'SE':>5} {'factual':>7} {'following':>9} "
              f"{'sim effect':>10} {'sim replay':>10}")
        for h, r in m["counterfactual"].items():
            print(f"{h:>7} {r['episodes']:>4} {r['counterfactual_psnr']:12.2f} {r['blind_psnr']:7.2f} {r['counterfactual_gain']:6.2f} "
                  f"{r['counterfactual_gain_stderr']:5.2f} {r['factual_psnr']:7.2f} {r['action_following']:9.2f} "
                  f"{r['simulator_action_effect_psnr']:10.2f} {r['replay_psnr']:10.2f}")
        print("gain: model vs sim minus blind (its own-action frames vs the sim under the swap); following: gain / (factual - blind),")
        print("the share of the actions' effect the model reproduces (1: as accurate under other actions as under the recorded ones)")
    tasks = m.get("per_task") or {}
    if tasks:
        first, last = min(m["horizons"], key=int), max(m["horizons"], key=int)
        print(f"per task: PSNR (copy-last-frame) at horizons {first} and {last}, still PSNR at {last}, episodes at {first}:")
        for task, rows in tasks.items():
            cells = [f"h{h} {rows[h]['psnr']:6.2f} ({rows[h]['copy_last_frame_psnr']:5.2f})" if h in rows else f"h{h} -" for h in (first, last)]
            still = rows[last]["psnr_still"] if last in rows else float("nan")
            n = rows[first]["episodes"] if first in rows else 0
            print(f"  {task[:44]:<44} n={n:<3} " + "  ".join(cells) + f"  still {still:6.2f}")
    if folder.startswith(("eval-memory-noise", "eval-action-guidance", "eval-sampling-steps", "eval-from")):  # the same episodes as eval: paired
        from worldloop.worldmodel.evaluate import paired_change
        base = json.loads((out / "eval" / "metrics.json").read_text())
        for key in ("psnr", "action_delta_psnr"):
            try:
                cells = [f"h{h} {c['change']:+.2f} ± {c['stderr']:.2f}" for h, c in paired_change(base, m, key).items()]
                print(f"paired change from eval, {key} (± paired SE): " + "  ".join(cells))
            except ValueError as error:
                print(f"paired change from eval, {key}: not available ({error})")
def bench():
    print((out / "bench_wm.txt").read_text())
for name, fn in (("vae", vae), ("wm", wm), ("eval", ev), ("bench", bench)):
    section(name, fn)
if (out / "wm-also").is_dir():
    print(f"A/B: wm-also trained with {' '.join(sys.argv[2:]) or '(its log: wm-also.log)'}")
    section("wm-also", lambda: wm("wm-also"))
for folder in sorted(p.name for p in out.glob("eval-*")):
    section(folder, lambda: ev(folder))
PYEOF

#!/usr/bin/env bash
# Reward judges on one H200 (issue 5): classifier AUROC on MetaWorld MT10 frames, TOPReward throughput.
#
#   OUT=/path/to/results bash scripts/gpu/rewards.sh [DATASET]
#
# DATASET: a MetaWorld MT10 dataset from `worldloop collect`. The classifier needs success-labelled
# frames, which exist only when collection went on after the first success (sim.success_hold_steps > 0):
# an episode's success flag describes the frame AFTER its action, and an episode that stops at its
# first success never stores that frame. When DATASET is missing or was collected with
# success_hold_steps = 0, a reward dataset (20 episodes per task, success_hold_steps=10) is collected
# into $OUT/reward-data first (~1 min).
# WORLD_MODEL: a world-model folder whose open-loop replays join the classifier's training frames.
# MORE_DATA: more dataset folders (e.g. a policy's rollouts, its failures above all) the classifier trains on.
# Steps (each time-bounded; ~4-5 min in all on the H200): [collect] -> train-reward -> calibrate-reward (held-out
# episodes) -> TOPReward path check with a tiny random Qwen3-VL folder -> TOPReward throughput at
# Qwen3-VL-8B dimensions (random weights, bf16) at batch 8/32/64 -> table.
set -uo pipefail
: "${OUT:?set OUT to the results folder}"
mkdir -p "$OUT"
if ! python3 -c "import worldloop, metaworld" 2>/dev/null; then
  # shellcheck disable=SC1091
  source scripts/gpu/setup.sh
fi
source scripts/gpu/common.sh
WL="python3 -m worldloop"
PRESET=${PRESET:-metaworld-gpu}
EXTRA=${EXTRA:-}                      # extra key=value overrides for every verb (e.g. for a CPU dry run)
COLLECT_EPISODES=${COLLECT_EPISODES:-20}
BENCH_SIZES=${BENCH_SIZES:-8b}        # Qwen3-VL sizes to benchmark (tiny, 8b); SKIP_BENCH=1 skips the benchmark
DATASET=${1:-}
LOG="$OUT/rewards.log"
: > "$LOG"

hold=0
if [ -n "$DATASET" ] && [ -f "$DATASET/config.yaml" ]; then
  hold=$(python3 -c "import yaml,sys; print((yaml.safe_load(open(sys.argv[1])).get('sim') or {}).get('success_hold_steps', 0))" "$DATASET/config.yaml")
fi
if [ -z "$DATASET" ] || [ "$hold" = "0" ]; then
  echo "dataset '${DATASET:-none}' has no stored success frames (success_hold_steps=$hold): collecting a reward dataset" | tee -a "$LOG"
  DATASET="$OUT/reward-data"
  step collect 120 $WL collect --preset $PRESET --out "$DATASET" --episodes-per-task "$COLLECT_EPISODES" --no-progress sim.success_hold_steps=10 $EXTRA
fi

# 400 s: decoding ~55k frames took ~2 minutes on the H200 host while other jobs read the same dataset.
# With WORLD_MODEL (a train-wm folder), the classifier also learns from that model's replays of the training episodes.
step train-reward 400 $WL train-reward --preset $PRESET --dataset "$DATASET" ${MORE_DATA:-} --out "$OUT/rw" ${WORLD_MODEL:+--world-model "$WORLD_MODEL"} $EXTRA
step calibrate-classifier 60 $WL calibrate-reward --preset $PRESET --judge "$OUT/rw" --dataset "$DATASET" --out "$OUT/calibrate-classifier" --split held_out $EXTRA

# The TOPReward path end to end on this host's transformers, with a tiny random Qwen3-VL folder
# (the scores are meaningless; this checks that 16 frames reach the model and the CLI works).
step topreward-tiny-folder 60 python3 -c "from worldloop.rewards.qwen_random import save_random_qwen3_vl_folder as s; s('$OUT/qwen3-vl-tiny', 'tiny')"
step calibrate-topreward-tiny 60 $WL calibrate-reward --preset $PRESET --judge "topreward:$OUT/qwen3-vl-tiny" --dataset "$DATASET" --out "$OUT/calibrate-topreward-tiny" reward.calibrate.max_episodes=10 reward.calibrate.batch_size=64 $EXTRA

# Throughput at full Qwen3-VL-8B dimensions (8.77 B parameters, random weights, bf16), 16-frame windows.
# The classifier's rows come with it (batches 8/32/64/256).
[ "${SKIP_BENCH:-0}" = 1 ] || step bench 180 python3 -m worldloop.rewards.bench --preset $PRESET $EXTRA --out "$OUT/bench" --sizes $BENCH_SIZES --image-size 128 256 --batches 8 32 64

python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(p):
    p = out / p
    return json.loads(p.read_text()) if p.is_file() else None
def f(x, digits=3):
    return "n/a" if x is None else f"{x:.{digits}f}"
rw, cal, top = load("rw/metrics.json"), load("calibrate-classifier/metrics.json"), load("calibrate-topreward-tiny/metrics.json")
print("| result | value |")
print("|---|---|")
if rw and rw.get("held_out"):
    h = rw["held_out"]; a = h["at_threshold"]
    print(f"| classifier held-out AUROC (MT10 frames, {h['frames']} frames, {h['success_frames']} success) | {f(h['auroc'])} |")
    print(f"| classifier precision / recall at {a['threshold']} | {f(a['precision'])} / {f(a['recall'])} |")
if cal:
    print(f"| classifier calibration: AUROC / VOC / trigger rate / suggested threshold (max F1) | {f(cal['auroc'])} / {f(cal['value_order_correlation']['mean'])} / {f(cal['at_threshold']['trigger_rate'])} / {f(cal['suggested_threshold']['max_f1'])} |")
if top:
    print(f"| TOPReward tiny random folder on this host: windows scored (16 frames each) | {top['windows']} |")
bench = load("bench/bench_reward.json") or {"rows": []}
for row in bench["rows"]:
    speed = row.get("error") or f"{row['windows_per_s']:.1f} windows/s ({row['ms']:.0f} ms/call, {row.get('tokens_per_window', '-')} tokens/window)"
    print(f"| {row['judge']} {row['image_size']}px batch {row['batch']} | {speed} |")
print("TOPReward numbers use random weights (real Qwen3-VL-8B weights are not available here): speed only, no judge quality.")
PY

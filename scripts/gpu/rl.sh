#!/usr/bin/env bash
# RL in imagination on the H200: masked GRPO from a base (SFT) policy inside a trained world model,
# judged by a reward model, with KIR keyframes; periodic real-simulator evaluation on a few MT10
# tasks and the imagined success from the same initial states (the imagination-reality gap).
#
#   OUT=runs/gpu-rl scripts/gpu/rl.sh POLICY WORLD_MODEL JUDGE DATASET [TASKS] [MINUTES]
#
#   POLICY       base policy folder (worldloop sft)
#   WORLD_MODEL  world-model folder (worldloop train-wm), same resolution as the dataset
#   JUDGE        classifier folder (worldloop train-reward) or topreward:/path/to/Qwen3-VL
#   DATASET      the LeRobot dataset the world model was trained on (first frames + KIR keyframes)
#   TASKS        comma-separated MT10 tasks to train and evaluate on (default: button-press-topdown-v3,drawer-open-v3)
#   MINUTES      training budget in minutes (default 6)
#
# Writes $OUT/keyframes (KIR), $OUT/rl (config, tb/, checkpoints/, results.json, results.md,
# policy/), $OUT/rl.log, $OUT/summary.md; prints the table. Extra `key=value` overrides: $OVERRIDES
# (kir and rl) and $RL_OVERRIDES (rl only); $PRESET (default metaworld-gpu). Bounded: kir 4 min,
# rl MINUTES + 5 min (evaluations, start-up). Rerunning with the same $OUT resumes the rl run.
# CODEC_EVAL=1: afterwards, the base and the final policy in the real simulator observing its frames through the world
# model's VAE (`eval --world-model`), CODEC_EVAL_EPISODES (32) per task, the same initial states, paired (`--against`):
# $OUT/eval-codec-base, $OUT/eval-codec-final, the change at the end of $OUT/summary.md (two real evaluations, the VAE on every frame).
# RAW_EVAL=1: the same observing the simulator's own frames ($OUT/eval-raw-*): with rl.diagnostics.reality_through_codec=true in
# RL_OVERRIDES the reality checks saw the simulator through the VAE, and CODEC_EVAL repeats them (greedy, the same states).
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 4 ]; then sed -n 2,23p "$0"; exit 2; fi
POLICY=$1 WM=$2 JUDGE=$3 DATASET=$4
TASKS=${5:-button-press-topdown-v3,drawer-open-v3}
MINUTES=${6:-6}
OUT=${OUT:-runs/gpu-rl}
mkdir -p "$OUT"
source scripts/gpu/common.sh
PRESET=(--preset "${PRESET:-metaworld-gpu}")
read -r -a EXTRA <<< "${OVERRIDES:-}"
read -r -a RL_EXTRA <<< "${RL_OVERRIDES:-}"

# 1. KIR keyframes: demonstrations' gripper changes and contacts + the base policy's failed real rollouts.
if [ ! -f "$OUT/keyframes/index.json" ]; then
  timeout 240 "${WL[@]}" kir "${PRESET[@]}" --dataset "$DATASET" --policy "$POLICY" --out "$OUT/keyframes" \
    "sim.tasks=[$TASKS]" rl.kir_failure_episodes_per_task=8 "${EXTRA[@]}" 2>&1 | tee "$OUT/kir.log"
fi
KF_ARGS=(--keyframes "$OUT/keyframes"); KIR_RATIO=0.5
if [ ! -f "$OUT/keyframes/index.json" ]; then echo "kir failed: training from first frames only"; KF_ARGS=(); KIR_RATIO=0; fi

# 2. Masked GRPO in imagination: 8 groups x 8 rollouts, temperature 1.6; real eval every 5 iterations
#    on TASKS, 32 episodes per task (the same seeds each time), imagined success from the same states.
timeout $(( MINUTES * 60 + 300 )) "${WL[@]}" rl "${PRESET[@]}" --policy "$POLICY" --world-model "$WM" --judge "$JUDGE" \
  --dataset "$DATASET" "${KF_ARGS[@]}" --tasks "$TASKS" --out "$OUT/rl" --no-progress \
  rl.kir_ratio=$KIR_RATIO rl.num_groups=8 rl.group_size=8 rl.iterations=1000 rl.time_limit_min=$MINUTES \
  rl.lr=1.0e-5 rl.update_epochs=2 rl.num_minibatches=4 rl.eval_every=5 rl.eval_episodes_per_task=32 \
  rl.checkpoint_every=5 "sim.tasks=[$TASKS]" "${EXTRA[@]}" "${RL_EXTRA[@]}" 2>&1 | tee "$OUT/rl.log"
status=${PIPESTATUS[0]}

# 3. Summary: real vs imagined success at every evaluation, first vs last with the difference in standard errors.
"$PY" scripts/gpu/rl_summary.py "$OUT" | tee "$OUT/summary.md"

# 4. CODEC_EVAL=1 / RAW_EVAL=1: the base and the final policy in the real simulator again, greedy, the same initial states,
#    paired: observing through the world model's VAE (does what RL gained in imagination carry over to a policy that
#    sees reality through the same VAE?) / observing the simulator's own frames (the view the reality checks did not
#    use when rl.diagnostics.reality_through_codec=true).
paired_eval() {  # NAME TITLE [eval args]: $OUT/eval-NAME-base, $OUT/eval-NAME-final, the change appended to summary.md
  local name=$1 title=$2; shift 2
  local args=(--tasks "$TASKS" --episodes-per-task "${CODEC_EVAL_EPISODES:-32}" --greedy "$@")
  timeout 240 "${WL[@]}" eval "${PRESET[@]}" --policy "$POLICY" --out "$OUT/eval-$name-base" "${args[@]}" "${EXTRA[@]}" >"$OUT/eval-$name.log" 2>&1
  timeout 240 "${WL[@]}" eval "${PRESET[@]}" --policy "$OUT/rl/policy" --out "$OUT/eval-$name-final" "${args[@]}" \
    --against "$OUT/eval-$name-base/results.json" "${EXTRA[@]}" >>"$OUT/eval-$name.log" 2>&1
  { echo; echo "$title (base -> final policy):"; sed -n '/^against /,$p' "$OUT/eval-$name.log"; } | tee -a "$OUT/summary.md"
}
# A run stopped by rl.diagnostics.stop_when_real_falls_se at its second check keeps iteration 0's weights: nothing to compare.
KEPT_BASE=$("$PY" -c "import json, sys; s = json.load(open(sys.argv[1])).get('stopped') or {}; print(int(s.get('policy_from', -1) == 0))" \
  "$OUT/rl/results.json" 2>/dev/null || echo 0)
if [ "$KEPT_BASE" = 1 ] && [ "${CODEC_EVAL:-0}${RAW_EVAL:-0}" != 00 ]; then
  { echo; echo "no paired evaluation: RL stopped and kept iteration 0's policy, the base one"; } | tee -a "$OUT/summary.md"
elif [ -f "$OUT/rl/policy/config.json" ]; then
  [ "${CODEC_EVAL:-0}" = 1 ] && paired_eval codec "real, observing through the world model's VAE" --world-model "$WM"
  [ "${RAW_EVAL:-0}" = 1 ] && paired_eval raw "real, observing the simulator's own frames"
fi
exit $status

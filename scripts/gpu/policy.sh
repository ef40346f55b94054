#!/usr/bin/env bash
# Policy numbers on one H200 (issue 3): the scripted expert and SFT policies with 1, 5 and 20
# demonstrations per task, each evaluated on MT10 with 50 episodes per task (metaworld-gpu preset).
#
#   OUT=/path/to/results bash scripts/gpu/policy.sh [DATASET]
#
# DATASET: an MT10 dataset at 128x128 from `worldloop collect --preset metaworld-gpu` with >= 25
# episodes per task (scripts/gpu/data.sh makes one with 50). Without it, 30 episodes per task are
# collected into $OUT/work/dataset first (~1 min).
# Steps, each time-bounded, continuing on failure: [collect] -> eval expert (EXPERT=0 skips it) -> for N in DEMOS (1 5 20):
# sft (N demos per task, successful clean episodes first) -> eval. Rerunning resumes an
# interrupted sft from its checkpoints.
# Sizing: `worldloop bench policy` first measures the SFT step time of the ~97M CompactVLA (batch 128,
# bf16), and the three runs get SFT_SECONDS (default 200) of training split 20/30/50 % (assumed
# ~10 steps/s: ~400/600/1000 steps), plus ~20 s start-up and data loading each. One 500-episode
# evaluation is <= 100k simulator steps at ~190 steps/s per worker x 16 workers, <= ~35 s plus ~15 s
# start-up (the expert ends its episodes in ~80 steps). Expected total ~8 min; the limits add up to 21.
# Output: $OUT/summary.md (the table), $OUT/summary.json, $OUT/policy.log, $OUT/bench_policy.txt at the top; models, eval
# folders (results.json, results.md, videos/) and TensorBoard logs under $OUT/work/.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the results folder}"
DATASET=${1:-}
WORK="$OUT/work"
mkdir -p "$WORK"
PY=${PY:-python3}
if ! "$PY" -c "import worldloop, metaworld" 2>/dev/null; then
  # shellcheck disable=SC1091
  source scripts/gpu/setup.sh
fi
source scripts/gpu/common.sh
WORKERS=$(nproc); [ "$WORKERS" -gt 16 ] && WORKERS=16
PRESET=(--preset "${PRESET:-metaworld-gpu}")
EXTRA=(${EXTRA:-})  # extra key=value overrides for every verb (e.g. a CPU dry run: EXTRA="device=cpu sft.batch_size=8")
SIM=("sim.num_workers=$WORKERS" "sim.suite=mt10" "sim.tasks=[]")
EPISODES=${EPISODES:-50}
LOG="$OUT/policy.log"
: >"$LOG"


if [ -z "$DATASET" ] || [ ! -f "$DATASET/meta/info.json" ]; then
  DATASET="$WORK/dataset"
  step collect 300 "${WL[@]}" collect "${PRESET[@]}" --out "$DATASET" --episodes-per-task 30 --no-progress "${SIM[@]}" "${EXTRA[@]}"
fi

[ "${EXPERT:-1}" = 1 ] && step eval-expert 150 "${WL[@]}" eval "${PRESET[@]}" --policy expert --out "$WORK/eval-expert" --episodes-per-task "$EPISODES" "${SIM[@]}" "${EXTRA[@]}"

# Size the three SFT runs from the measured step time: SFT_SECONDS of training in all, split 20/30/50 %
# over 1/5/20 demos (defaults 400/600/1000 steps when the benchmark failed).
step bench-policy 120 "${WL[@]}" bench policy "${PRESET[@]}" --steps 10 --out "$OUT/bench_policy.txt" "${SIM[@]}" "${EXTRA[@]}"
SFT_SECONDS=${SFT_SECONDS:-200}
declare -A STEPS=([1]=400 [5]=600 [20]=1000)
MS=$(sed -n 's/^| sft step | [0-9]* | \([0-9.]*\) |.*/\1/p' "$OUT/bench_policy.txt" 2>/dev/null)
if [ -n "$MS" ]; then
  for pair in 1:20 5:30 20:50; do
    N=${pair%%:*} SHARE=${pair##*:}
    STEPS[$N]=$("$PY" -c "print(max(100, min(3000, int($SFT_SECONDS * $SHARE / 100 * 1000 / $MS) // 50 * 50)))")
  done
fi
echo "sft steps: 1 demo ${STEPS[1]}, 5 demos ${STEPS[5]}, 20 demos ${STEPS[20]} (sft step ${MS:-?} ms)" | tee -a "$LOG"
declare -A SFT_LIMIT=([1]=150 [5]=180 [20]=240)
# SFT_WORLD_MODEL (a world-model folder at the dataset's resolution): each SFT measures how many action tokens
# the policy keeps on frames through its VAE, and shows sft.augment_codec of its training frames through it
CODEC=(); [ -n "${SFT_WORLD_MODEL:-}" ] && CODEC=(--world-model "$SFT_WORLD_MODEL")
for N in ${DEMOS:-1 5 20}; do  # DEMOS: which SFT runs (demonstrations per task)
  step "sft-$N" "${SFT_LIMIT[$N]}" "${WL[@]}" sft "${PRESET[@]}" --dataset "$DATASET" --out "$WORK/sft-$N" --episodes-per-task "$N" \
    "${CODEC[@]}" "sft.steps=${STEPS[$N]}" "${SIM[@]}" "${EXTRA[@]}"
  if [ -f "$WORK/sft-$N/model.safetensors" ]; then
    step "eval-sft-$N" 150 "${WL[@]}" eval "${PRESET[@]}" --policy "$WORK/sft-$N" --out "$WORK/eval-sft-$N" --episodes-per-task "$EPISODES" \
      "${SIM[@]}" "${EXTRA[@]}"
  fi
done

"$PY" - "$WORK" "$OUT" <<'PYEOF' | tee -a "$LOG"
import json, sys
from pathlib import Path

work, out = Path(sys.argv[1]), Path(sys.argv[2])
rows, summary = [], {}
for name in ["eval-expert", "eval-sft-1", "eval-sft-5", "eval-sft-20"]:
    path = work / name / "results.json"
    if not path.is_file():
        rows.append(f"| {name} | missing | | | | |")
        continue
    r = json.loads(path.read_text())
    sft_path = work / name.replace("eval-", "") / "sft_results.json"
    sft = json.loads(sft_path.read_text()) if sft_path.is_file() else {}
    summary[name] = {"results": r | {"seeds": None, "sim": None}, "sft": {k: v for k, v in sft.items() if "episodes" not in k or k == "episodes_per_task"}}
    mode = "expert" if r["policy"] == "expert" else ("greedy" if r["greedy"] else f"T={r['temperature']}")
    held = f"{sft['held_out_loss']:.3f} / {sft['held_out_token_accuracy']:.3f}" if sft.get("held_out_loss") is not None else ""
    if sft.get("held_out_codec_token_agreement") is not None:
        held += f" / {sft['held_out_codec_token_agreement']:.3f} ({sft.get('held_out_codec_token_distance', float('nan')):.1f} bins apart)"
    timing = f"{sft['seconds']:.0f} s, {sft['seconds_per_step'] * 1000:.0f} ms/step" if sft else ""
    rows.append(f"| {name} ({mode}) | {r['success_once']:.3f} ± {r['stderr']:.3f} | {r['episodes']} | {r['mean_episode_length']:.1f} | {held} | {timing} |")
tasks = sorted({t for s in summary.values() for t in s["results"]["per_task"]})
lines = ["# Policy on MT10 (metaworld-gpu, success_once ± stderr)", "",
         "| policy | success_once | episodes | mean length | held-out loss / token acc (/ kept through the VAE) | sft time |", "| --- | ---: | ---: | ---: | ---: | ---: |", *rows,
         "", "| task | " + " | ".join(summary) + " |", "| --- |" + " ---: |" * len(summary)]
for task in tasks:
    cells = [f"{s['results']['per_task'][task]['success_once']:.2f}" if task in s["results"]["per_task"] else "" for s in summary.values()]
    lines.append(f"| {task} | " + " | ".join(cells) + " |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print("\n".join(lines))
PYEOF

#!/usr/bin/env bash
# Every H200 number of issues 2-6 in one unattended run that fits one device lease (~25 minutes):
#
#   source scripts/gpu/setup.sh .whl .whl2
#   OUT=/root/wl setsid bash scripts/gpu/session.sh >/root/wl.log 2>&1 < /dev/null &
#   bash scripts/gpu/pack.sh /root/wl "$OUT_OF_THE_DEVICE_CALL"     # any time: results so far
#   CARRY=/root/carry bash scripts/gpu/poll.sh /root/wl "$OUT" 530 r1  # or: each call waits, packs, and brings 3 carried parts
#
# Phase 1 (~4 min): `bench sim` (1 and 14 workers) then `collect` MT10 x 50 episodes at 128x128
#   (scripts/gpu/sims.sh, then the metaworld-gpu dataset), while the GPU runs `bench wm` (small and
#   wan2.2-5b dimensions) and the TOPReward benchmark at Qwen3-VL-8B dimensions. Two cores are left
#   to the GPU benchmarks so that the simulator does not starve their kernel launches.
# Phase 2 (~12 min), three chains on the dataset:
#   policy (scripts/gpu/policy.sh): expert eval, SFT with 1/5/20 demos per task, 50-episode evals;
#   with BASE_ROLLOUTS=N, once SFT-1 is trained: N real rollouts per task of it (sampled at T=1) into
#   $OUT/rollouts-base, which the world model and the judge learn from too (WoVR's WM Base: they see
#   how the policy to improve really fails, not only the expert's noisy episodes);
#   world model (scripts/gpu/worldmodel.sh): train-vae, train-wm (small), eval-wm vs copy-last-frame;
#   rewards (scripts/gpu/rewards.sh), once the world model is trained: train-reward on the real frames
#   and the world model's replays of them, calibrate-reward, the TOPReward path check.
# Phase 3 (the time left, >= 3 min; starts once the judge is trained): RL in imagination
#   (scripts/gpu/rl.sh) from the SFT policy whose overall success is nearest 40% (1 or 5 demos), on
#   the two tasks where it is most improvable among those the judge knows, judged by the trained
#   classifier, with real evaluations before, during and after; beside it,
#   `calibrate-reward --world-model` judges imagined replays of held-out episodes against the
#   simulator's labels.
# $OUT/progress.txt says what finished when; every chain logs to $OUT/<chain>.log.
# Knobs: DEADLINE_MIN (23: RL's training budget ends 4 min before it), WM_SECONDS (300) and VAE_SECONDS
# (150) of training, VAE_STEPS ("": the VAE's steps, VAE_SECONDS then only caps them; see worldmodel.sh),
# VAE_FROM (a VAE folder from an earlier lease, used instead of training one: after a session,
# `python3 -m worldloop.utils.parts pack $OUT/wm/vae "$DEVICE_OUT" vae` brings it back in 15 MB parts,
# `... unpack vae.parts.json .carry/vae` rebuilds it for the next lease's carry),
# VAE_INIT (such a folder that the VAE trains on from, VAE_STEPS / VAE_SECONDS more: with WM_FROM, the DiT then
# continues on the grown VAE; a world model trained over several leases that way, see worldmodel.sh),
# WM_ALSO (overrides of a second DiT trained alongside the first for an A/B, e.g.
# "world_model.context_channels=false": eval-wm and the judge's calibration on its replays; only the first
# trains the judge and goes on to RL; see worldmodel.sh),
# VAE_LAYOUT_BENCH (1: `bench vae-train` during the collection, and the VAE trains in the faster memory layout),
# SFT_CODEC (1: without WM_FROM, SFT waits for this lease's VAE and trains at sft.augment_codec / measures through it),
# WM_FROM (a world-model folder from an earlier lease, vae/ included: the DiT trains on from it, for
# WM_SECONDS more, on its VAE; no VAE is trained; the SFT runs measure their policies on frames through its VAE and
# train on them at sft.augment_codec, e.g. EXTRA="... sft.augment_codec=0.5"; WM_SECONDS=0: used as it is, so the judge, then RL, need not
# wait for a DiT to train: ~4 minutes earlier by the thirteenth session's timeline, not measured yet), CARRY (a folder: once trained, the DiT and the VAE
# trained here are packed there in 15 MB parts; poll calls copy them to the device's OUT, at most three
# parts per call (a call returns ~64 MB at most: the eighth session lost its fifth part), and
# the next lease unpacks them: `unpack wm.parts.json /root/wm`, then `unpack vae.parts.json /root/wm/vae`),
# PRESET, EXTRA (overrides for every verb, e.g. a CPU dry run), EPISODES (50 per task,
# collection and evaluations), RL_EPISODES (EPISODES: RL's real evaluations per task; the gain is judged
# in standard errors, so more is better), RL_LR (rl.sh's 1e-5), RL_EVAL_EVERY (10 iterations between RL's real
# evaluations; the first and the last always run), RL_EXTRA (more rl.* overrides for RL only),
# RL_TASKS ("": phase 3's choice; comma-separated MT10 tasks instead, e.g. to avoid a scene the world model
# renders badly: see the per-task rows of wm/summary.txt), RL_ALSO (more rl.* overrides of a second RL run beside
# the first, on the same GPU, tasks and keyframes, into $OUT/rl-also, for an A/B; e.g. "rl.kir_ratio=1.0 rl.max_steps=96":
# short rollouts from keyframes only; both runs' evaluations start from first frames and run sim.max_steps; or
# "rl.diagnostics.shuffled_scores=true": the control arm, whose rollouts are credited with another group member's score); or, with
# RL_EXTRA="... rl.refine_every=10 rl.refine_episodes_per_task=16", RL_ALSO="rl.refine_every=0": RL with and without the world model
# learning from the policy's real rollouts, the fourteenth session's planned A/B; a round costs ~25 s),
# CODEC_EVAL=1 (after RL, the base and final policies in reality observing through the world model's VAE, RL_EPISODES
# per task, paired; see rl.sh), RAW_EVAL=1 (the same on the simulator's own frames: with rl.diagnostics.reality_through_codec=true
# in RL_EXTRA), SIM_WORKERS (14), BENCH=0 (skip `bench sim` and the GPU benchmarks), EXPERT=0 (skip the expert's
# evaluation), DEMOS ("1 5 20": the SFT runs of the policy chain; BASE_ROLLOUTS needs 1 among them),
# BASE_ROLLOUTS (0: none; rollouts per task of SFT-1 for the world model and the judge), BASE_TASKS ("": every task of
# the suite; comma-separated tasks instead, e.g. RL's one task, so that the world model sees more of the policy there).
# GROW_SECONDS (0: off; with WM_FROM, WM_SECONDS=0 and CARRY: while this lease uses the carried world model as it is,
# a copy of its DiT trains on for that long on this lease's data, beside RL on the same GPU, into $OUT/wm-grown, and is
# packed into CARRY for the next lease; capped so that it ends 10 minutes before DEADLINE_MIN. A DiT grows ~6 steps/s
# alone on the GPU, and tracks its tasks better with more of them: see docs/results.md, twenty-fifth session).
# A 64x64 run for the world model and RL: EXTRA="sim.image_size=64 reward.classifier.input_size=64".
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the results folder}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
source scripts/gpu/common.sh
export PRESET=${PRESET:-metaworld-gpu}
export EXTRA=${EXTRA:-}
EPISODES=${EPISODES:-50}
SIM_WORKERS=${SIM_WORKERS:-14}
DEADLINE_MIN=${DEADLINE_MIN:-23}
export WM_SECONDS=${WM_SECONDS:-300} VAE_SECONDS=${VAE_SECONDS:-150}
BENCH=${BENCH:-1}
read -r -a EXTRA_ARGS <<< "$EXTRA"
DATA="$OUT/dataset"
mark() { echo "[$(date +%T) +$((SECONDS / 60))m$((SECONDS % 60))s] $*" | tee -a "$OUT/progress.txt"; }
mark "session start on $(hostname), $(nproc) CPUs, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
# Everything the chains import, checked before anything starts: a missing wheel (PyAV travels apart from
# .whl) would otherwise stop the session minutes later, or silently, inside a chain.
if ! missing=$("$PY" -c "import av, diffusers, metaworld, mujoco, worldloop" 2>&1); then
  mark "not ready: ${missing##*$'\n'} (install the carried wheels: source scripts/gpu/setup.sh .whl .whl2)"
  exit 1
fi
# Task names and numbers given here, checked now: a typo would otherwise fail a chain minutes in (BASE_TASKS's rollouts
# would be missing and the world model would wait 5 minutes for them).
if ! bad=$("$PY" -c "import sys; from worldloop.sims.tasks import check_task; [check_task(t) for t in sys.argv[1].split(',') if t]" \
             "${BASE_TASKS:-},${RL_TASKS:-}" 2>&1); then
  mark "BASE_TASKS / RL_TASKS: ${bad##*$'\n'}"
  exit 1
fi
if ! [[ "${GROW_SECONDS:-0}" =~ ^[0-9]+$ ]]; then mark "GROW_SECONDS must be a whole number of seconds, got '$GROW_SECONDS'"; exit 1; fi

# ---------------------------------------------------------------------------- phase 1
(
  if [ "$BENCH" = 1 ]; then
    WORKERS=$SIM_WORKERS OUT="$OUT/sims" bash scripts/gpu/sims.sh >"$OUT/sims.log" 2>&1
    mark "bench sim: exit $?"
  fi
  timeout 420 "${WL[@]}" collect --preset "$PRESET" --out "$DATA" --episodes-per-task "$EPISODES" --no-progress \
    sim.num_workers=$SIM_WORKERS "${EXTRA_ARGS[@]}" >"$OUT/collect.log" 2>&1
  mark "collect: exit $?"
  # Decode the videos once, in parallel, before three chains read the dataset at the same time.
  timeout 300 "$PY" -c "import sys; from worldloop.data.dataset import TrajectoryDataset as T; T(sys.argv[1]).warm_cache(int(sys.argv[2]))" \
    "$DATA" "$SIM_WORKERS" >>"$OUT/collect.log" 2>&1
  mark "frame cache: exit $?"
) &
sim_chain=$!
# While the simulators collect, the idle GPU times the VAE's training step in both memory layouts; the VAE
# then trains in the faster (VAE_LAYOUT_BENCH=0 skips this; no VAE is trained with VAE_FROM or WM_FROM alone).
if [ "${VAE_LAYOUT_BENCH:-1}" = 1 ] && { [ -n "${VAE_INIT:-}" ] || [ -z "${VAE_FROM:-}${WM_FROM:-}" ]; }; then
  (IMG=$("$PY" -c "import sys; from worldloop.config import load_config; print(load_config(sys.argv[1], sys.argv[2:]).sim.image_size)" \
         "$PRESET" "${EXTRA_ARGS[@]}")
   DOWN=3; [ "${IMG:-128}" -lt 128 ] && DOWN=2  # worldmodel.sh's choice: 16x16 latents
   timeout 240 "${WL[@]}" bench vae-train --preset "$PRESET" --steps 60 --out "$OUT/bench/bench_vae_train.txt" \
     "${EXTRA_ARGS[@]}" vae.spatial_downsamples=$DOWN >"$OUT/bench_vae.log" 2>&1
   mark "bench vae-train: exit $? ($(tail -1 "$OUT/bench/bench_vae_train.txt" 2>/dev/null))") &
  vae_bench=$!
fi
[ "$BENCH" = 1 ] && (
  timeout 300 "${WL[@]}" bench wm --preset "$PRESET" --out "$OUT/bench/bench_wm.txt" "${EXTRA_ARGS[@]}" >"$OUT/bench_wm.log" 2>&1
  mark "bench wm: exit $?"
  timeout 240 "$PY" -m worldloop.rewards.bench --preset "$PRESET" "${EXTRA_ARGS[@]}" --out "$OUT/bench" --sizes "${BENCH_SIZES:-8b}" \
    --image-size 128 256 --batches 8 32 64 >"$OUT/bench_reward.log" 2>&1
  mark "bench reward: exit $?"
) &
bench_chain=$!
wait "$sim_chain"; wait "$bench_chain"
if [ ! -f "$DATA/meta/info.json" ]; then mark "no dataset: stopping"; exit 1; fi
[ -n "${vae_bench:-}" ] && wait "$vae_bench"
if grep -qx "faster: channels_last" "$OUT/bench/bench_vae_train.txt" 2>/dev/null; then export VAE_CHANNELS_LAST=1; fi

# ---------------------------------------------------------------------------- phase 2
# With a carried world model, SFT measures its policies on the frames through that model's VAE (and trains on them
# at sft.augment_codec). Without one, SFT_CODEC=1 makes SFT wait for this lease's VAE and use it so: the VAE's
# training time (~4 min) then delays SFT, the base policy's rollouts and the DiT that waits for them.
SFT_CODEC_FROM=${WM_FROM:-}
[ -z "$SFT_CODEC_FROM" ] && [ "${SFT_CODEC:-0}" = 1 ] && SFT_CODEC_FROM="$OUT/wm/vae"
(
  if [ "$SFT_CODEC_FROM" = "$OUT/wm/vae" ]; then
    for _ in $(seq 180); do [ -f "$OUT/wm/vae/metrics.json" ] && break; sleep 5; done
    [ -f "$OUT/wm/vae/metrics.json" ] || { mark "policy chain: no VAE after 15 min (SFT_CODEC=1): SFT on raw frames"; SFT_CODEC_FROM=""; EXTRA="$EXTRA sft.augment_codec=0"; }
  fi
  OUT="$OUT/policy" EPISODES=$EPISODES SFT_WORLD_MODEL=$SFT_CODEC_FROM bash scripts/gpu/policy.sh "$DATA" >"$OUT/policy.log" 2>&1
  mark "policy chain: exit $?"
) &
policy_chain=$!
MORE_DATA=""
if [ "${BASE_ROLLOUTS:-0}" -gt 0 ]; then
  MORE_DATA="$OUT/rollouts-base"
  (
    while kill -0 "$policy_chain" 2>/dev/null && [ ! -f "$OUT/policy/work/sft-1/sft_results.json" ]; do sleep 5; done
    timeout 300 "${WL[@]}" collect --preset "$PRESET" --out "$MORE_DATA" --policy "$OUT/policy/work/sft-1" --episodes-per-task "$BASE_ROLLOUTS" \
      --no-progress sim.num_workers=$SIM_WORKERS eval.greedy=false eval.temperature=1.0 "${EXTRA_ARGS[@]}" \
      ${BASE_TASKS:+"sim.tasks=[$BASE_TASKS]"} >"$OUT/rollouts.log" 2>&1
    mark "base-policy rollouts: exit $?"
  ) &
  base_rollouts=$!
fi
(OUT="$OUT/wm" SKIP_BENCH=1 MORE_DATA="$MORE_DATA" EXTRA="${EXTRA:-device=cuda}" bash scripts/gpu/worldmodel.sh "$DATA" >"$OUT/wm.log" 2>&1; mark "world-model chain: exit $?") &
wm_chain=$!
# GROW_SECONDS: the carried world model, used as it is here, also trains on in the background for the next lease
if [ "${GROW_SECONDS:-0}" -gt 0 ]; then
  if [ -n "${WM_FROM:-}" ] && [ "$WM_SECONDS" = 0 ] && [ -n "${CARRY:-}" ]; then
    # the data (~5 min with base rollouts), the clips' encoding and eval-wm after training must fit before the deadline
    GROW=$(( GROW_SECONDS < DEADLINE_MIN * 60 - 600 ? GROW_SECONDS : DEADLINE_MIN * 60 - 600 ))
    mark "growing $WM_FROM for $GROW s into $OUT/wm-grown (packed into $CARRY for the next lease)"
    (OUT="$OUT/wm-grown" SKIP_BENCH=1 WM_SECONDS=$GROW WM_ALSO="" MORE_DATA="$MORE_DATA" EXTRA="${EXTRA:-device=cuda}" \
       bash scripts/gpu/worldmodel.sh "$DATA" >"$OUT/wm-grown.log" 2>&1; mark "world model grown for the next lease: exit $?") &
  else
    mark "GROW_SECONDS ignored: it needs WM_FROM with WM_SECONDS=0, and CARRY"
  fi
fi
# The judge learns from the world model's replays too, so it starts once the world model is trained (its
# evaluations may still run): the VAE and the DiT then have the GPU to themselves, but for the short SFT.
while kill -0 "$wm_chain" 2>/dev/null && [ ! -f "$OUT/wm/wm/results.json" ]; do sleep 5; done
[ -f "$OUT/wm/wm/results.json" ] && JUDGE_WM="$OUT/wm/wm" || JUDGE_WM=""
# ... and on the base policy's rollouts: they end long before a DiT trains, but a world model used as it is
# (WM_SECONDS=0) is ready at once
[ -n "${base_rollouts:-}" ] && wait "$base_rollouts"
[ -f "$MORE_DATA/summary.json" ] || MORE_DATA=""
(OUT="$OUT/rewards" SKIP_BENCH=1 WORLD_MODEL="$JUDGE_WM" MORE_DATA="$MORE_DATA" bash scripts/gpu/rewards.sh "$DATA" >"$OUT/rewards.log" 2>&1; mark "rewards chain: exit $?") &
rewards_chain=$!
# RL needs only the trained judge: the chain's calibrations and path checks go on beside it.
while kill -0 "$rewards_chain" 2>/dev/null && [ ! -f "$OUT/rewards/rw/metrics.json" ]; do sleep 5; done
# RL needs a base policy too: the 1- and 5-demo evaluations come early in the policy chain.
while kill -0 "$policy_chain" 2>/dev/null && [ ! -f "$OUT/policy/work/eval-sft-5/results.json" ]; do sleep 5; done

# ---------------------------------------------------------------------------- phase 3
choice=$("$PY" - "$OUT/policy/work" "$OUT/rewards/rw/model/config.json" <<'PYEOF'
import json, sys
from pathlib import Path
from worldloop.sims.tasks import instruction
work, judge = Path(sys.argv[1]), Path(sys.argv[2])
judged = set(json.loads(judge.read_text()).get("instructions") or []) if judge.is_file() else set()
best = None
for n in (1, 5):
    path = work / f"eval-sft-{n}" / "results.json"
    if path.is_file() and (work / f"sft-{n}" / "model.safetensors").is_file():
        r = json.loads(path.read_text())
        if best is None or abs(r["success_once"] - 0.4) < abs(best[1]["success_once"] - 0.4):
            best = (n, r)
if best is None:
    sys.exit(1)
n, r = best
# Most improvable: some successes to reinforce (GRPO needs groups that differ), far from solved.
# A task-conditioned judge knows only the instructions it was trained on.
rates = {task: v["success_once"] for task, v in r["per_task"].items() if not judged or instruction(task) in judged}
ranked = sorted(rates, key=lambda t: (not 0.05 <= rates[t] <= 0.8, abs(rates[t] - 0.35)))
print(work / f"sft-{n}", ",".join(ranked[:2]))
PYEOF
)
if [ -z "$choice" ]; then mark "no base policy: stopping"; wait; exit 1; fi
if [ ! -f "$OUT/rewards/rw/model/config.json" ] || [ ! -f "$OUT/wm/wm/config.json" ]; then
  mark "no judge or no world model (see rewards.log, wm.log): skipping RL"; wait; exit 1
fi
# Beside RL: the judge on the world model's replays of held-out episodes, against the simulator's labels
# (and on the base policy's held-out rollouts: the failures RL would learn to exploit); then the same on
# WM_ALSO's model (judge-in-imagination-also*), once it is trained, for the A/B.
(for WM_NAME in wm wm-also; do
   SUFFIX=""
   if [ "$WM_NAME" = wm-also ]; then
     [ -n "${WM_ALSO:-}" ] || break
     for _ in $(seq 120); do [ -f "$OUT/wm/wm-also/results.json" ] && break; sleep 5; done
     [ -f "$OUT/wm/wm-also/results.json" ] || { mark "no wm-also model: no judge-in-imagination-also"; break; }
     SUFFIX=-also
   fi
   for SOURCE in "$DATA" $MORE_DATA; do
     NAME=judge-in-imagination$SUFFIX; [ "$SOURCE" = "$DATA" ] || NAME="$NAME-$(basename "$SOURCE")"
     timeout 300 "${WL[@]}" calibrate-reward --preset "$PRESET" --judge "$OUT/rewards/rw" --dataset "$SOURCE" --split held_out \
       --world-model "$OUT/wm/$WM_NAME" --out "$OUT/rewards/$NAME" reward.calibrate.max_episodes=64 "${EXTRA_ARGS[@]}" \
       >>"$OUT/judge_in_imagination.log" 2>&1
     mark "$NAME: exit $?"
   done
 done) &
read -r POLICY TASKS <<< "$choice"
TASKS=${RL_TASKS:-$TASKS}
minutes_left() { local m=$(( (DEADLINE_MIN * 60 - SECONDS) / 60 - 4 )); [ "$m" -lt 3 ] && m=3; echo "$m"; }
RL_SETTINGS="rl.eval_every=${RL_EVAL_EVERY:-10} rl.eval_episodes_per_task=${RL_EPISODES:-$EPISODES}${RL_LR:+ rl.lr=$RL_LR}${RL_EXTRA:+ $RL_EXTRA}"
if [ -n "${RL_ALSO:-}" ]; then
  # The A/B's second RL run shares the GPU and, once the first run has made them, its KIR keyframes.
  (for _ in $(seq 60); do [ -f "$OUT/rl/keyframes/index.json" ] && break; sleep 5; done
   mkdir -p "$OUT/rl-also"
   [ -f "$OUT/rl/keyframes/index.json" ] && ln -sfn ../rl/keyframes "$OUT/rl-also/keyframes"
   ALSO_MINUTES=$(minutes_left)
   mark "rl-also: base $POLICY on $TASKS for $ALSO_MINUTES min with $RL_ALSO"
   OUT="$OUT/rl-also" OVERRIDES="$EXTRA" RL_OVERRIDES="$RL_SETTINGS $RL_ALSO" \
     bash scripts/gpu/rl.sh "$POLICY" "$OUT/wm/wm" "$OUT/rewards/rw" "$DATA" "$TASKS" "$ALSO_MINUTES" >"$OUT/rl-also.log" 2>&1
   mark "rl-also: exit $?") &
fi
MINUTES=$(minutes_left)
mark "rl: base $POLICY on $TASKS for $MINUTES min"
OUT="$OUT/rl" OVERRIDES="$EXTRA" RL_OVERRIDES="$RL_SETTINGS" CODEC_EVAL=${CODEC_EVAL:-0} RAW_EVAL=${RAW_EVAL:-0} CODEC_EVAL_EPISODES=${RL_EPISODES:-$EPISODES} \
  bash scripts/gpu/rl.sh "$POLICY" "$OUT/wm/wm" "$OUT/rewards/rw" "$DATA" "$TASKS" "$MINUTES" >"$OUT/rl.log" 2>&1
mark "rl: exit $?"
wait
mark "session done"

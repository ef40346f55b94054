#!/usr/bin/env bash
# 2026-12-07-outcome-clips (protocol.md beside this file) on a remote GPU host, from the repository root:
#   source tools/setup.sh .gl .site   # carry both (tools/site_carry.py builds them)
#   rm -rf /root/oc; mkdir -p /root/oc; SHORT=<0|1> setsid nohup bash docs/experiments/2026-12-07-outcome-clips/run.sh > /tmp/run.out 2>&1 < /dev/null &
#   bash tools/poll.sh /root/oc "$OUT" 500 r1        # then r2, r3, ... in the calls after
# The loop to eval-wm (arm base: its world model), the judge of real frames only, arm outcome's world model on the
# same data and VAE, its eval-wm, then the gate of each arm with that one judge on the same real episodes.
R=${RESULTS:-/root/oc}
P="--preset ${PRESET:-metaworld-gpu}"  # RESULTS=/tmp/oc PRESET=micro: the same steps on a CPU, in minutes
W="python3 -m worldloop"
mkdir -p $R; STARTED=$(date +%s)  # the loop refuses a non-empty --out: bookkeeping goes in once run.json exists
cd "$(dirname "$0")/../../.."
WL=${RESULTS:+$R.code}; WL=${WL:-/root/wl}
rm -rf $WL && mkdir -p $WL && cp -r worldloop tools pyproject.toml $WL/ && cd $WL
export PYTHONPATH=/tmp/site:$WL
SHORTER=""  # the protocol: SHORT=1 when `status` shows under 1750 s of device time before the starting call
[ "${SHORT:-0}" = 1 ] && SHORTER="vae.time_limit_s=360 world_model.time_limit_s=180"
$W loop $P --out $R --until eval_wm_base seed=2 $SHORTER > /tmp/oc-loop.log 2>&1 &
LOOP=$!
while [ ! -f $R/run.json ] && kill -0 $LOOP 2>/dev/null; do sleep 1; done
echo $STARTED > $R/started.txt; echo "short=${SHORT:-0}" > $R/amendment.txt
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt 2>/dev/null
tail -n +1 -f /tmp/oc-loop.log > $R/run.log & TAIL=$!
wait $LOOP; echo "loop $? $(date +%s)" >> $R/arms.txt
# the judge of real frames only: it never saw either world model, so each arm's replays meet the same reader
$W train-reward $P --dataset $R/demos $R/rollouts_base --out $R/judge_real seed=2 > $R/judge_real.log 2>&1
echo "judge $? $(date +%s)" >> $R/arms.txt
$W train-wm $P --dataset $R/demos $R/rollouts_base --vae $R/vae --out $R/wm_outcome seed=2 world_model.outcome_weight=4 $SHORTER > $R/wm_outcome.log 2>&1 \
  && $W eval-wm $P --world-model $R/wm_outcome --dataset $R/rollouts_base --out $R/eval_wm_outcome seed=2 > $R/eval_wm_outcome.log 2>&1
echo "outcome $? $(date +%s)" >> $R/arms.txt
for arm in base outcome; do  # side by side: the same work either way, ~90 s less device time
  ( $W gate $P --policy $R/policy_base --world-model $R/wm_$arm --judge $R/judge_real --dataset $R/rollouts_base --out $R/gate_$arm seed=2 > $R/gate_$arm.log 2>&1
    echo "gate_$arm $? $(date +%s)" >> $R/arms.txt ) & GATES="${GATES:-} $!"
done
wait $GATES  # not the log's tail, which runs until killed
$W analyse $R/gate_base $R/gate_outcome > $R/analyse.log 2>&1
$W analyse $R/eval_wm_base $R/eval_wm_outcome >> $R/analyse.log 2>&1
kill $TAIL; cp /tmp/oc-loop.log $R/run.log
echo done > $R/done

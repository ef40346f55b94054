#!/usr/bin/env bash
# 2026-12-07-judge-on-unseen-replays (protocol.md beside this file) on a remote GPU host, from the repository root:
#   source tools/setup.sh .gl .site   # carry both (tools/site_carry.py builds them): the H100 image of 2026-12-07 had no EGL loader and no PyAV
#   mkdir -p /root/jr; setsid nohup bash docs/experiments/2026-12-07-judge-on-unseen-replays/run.sh > /tmp/run.out 2>&1 < /dev/null &
#   bash tools/poll.sh /root/jr "$OUT" 500 r1        # then r2, r3, ... in the calls after
# The loop to the gate (arm unseen); arm seen beside it once the world model exists (the same gate episodes); then arm real.
R=/root/jr
P="--preset metaworld-gpu"
W="python3 -m worldloop"
mkdir -p $R; STARTED=$(date +%s)  # the loop refuses a non-empty --out: bookkeeping goes in once run.json exists
cd "$(dirname "$0")/../../.."
# a copy of the code of this moment: later calls sync the working tree again
rm -rf /root/wl && mkdir -p /root/wl && cp -r worldloop tools pyproject.toml /root/wl/ && cd /root/wl
export PYTHONPATH=/tmp/site:/root/wl
SHORTER=""  # the protocol's amendments: SHORT=1 when `status` shows under 1500 s of device time before the starting call
[ "${SHORT:-0}" = 1 ] && SHORTER="vae.time_limit_s=360 world_model.time_limit_s=180"
$W loop $P --out $R --until gate seed=1 $SHORTER > /tmp/jr-loop.log 2>&1 &
LOOP=$!
while [ ! -f $R/run.json ] && kill -0 $LOOP 2>/dev/null; do sleep 1; done
echo $STARTED > $R/started.txt; echo "short=${SHORT:-0}" > $R/amendment.txt
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
tail -n +1 -f /tmp/jr-loop.log > $R/run.log & TAIL=$!
while [ ! -f $R/stages/wm_base.json ] && kill -0 $LOOP 2>/dev/null; do sleep 5; done
# arm seen's judge trains beside the loop's eval-wm and judge; its gate waits for the loop's: two gates at once
# ran out of the H100's 80 GB on 2026-12-07 (run-1/)
SEEN=1
[ -f $R/stages/wm_base.json ] && $W train-reward $P --dataset $R/demos $R/rollouts_base --world-model $R/wm_base --out $R/judge_seen seed=1 > $R/judge_seen.log 2>&1 && SEEN=0
wait $LOOP; echo "loop $? $(date +%s)" >> $R/arms.txt
[ $SEEN = 0 ] && $W gate $P --policy $R/policy_base --world-model $R/wm_base --judge $R/judge_seen --dataset $R/rollouts_base --out $R/gate_seen seed=1 > $R/gate_seen.log 2>&1
echo "seen $? $(date +%s)" >> $R/arms.txt
$W train-reward $P --dataset $R/demos $R/rollouts_base $R/rollouts_judge --out $R/judge_real seed=1 > $R/judge_real.log 2>&1 \
  && $W gate $P --policy $R/policy_base --world-model $R/wm_base --judge $R/judge_real --dataset $R/rollouts_base --out $R/gate_real seed=1 > $R/gate_real.log 2>&1
echo "real $? $(date +%s)" >> $R/arms.txt
kill $TAIL; cp /tmp/jr-loop.log $R/run.log
echo done > $R/done

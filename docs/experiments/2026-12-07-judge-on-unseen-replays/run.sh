#!/usr/bin/env bash
# 2026-12-07-judge-on-unseen-replays (protocol.md beside this file) on a remote GPU host, from the repository root:
#   source tools/setup.sh .gl .site   # carry both: the H100 image of 2026-12-07 had no EGL loader (tools/README.md)
#   mkdir -p /root/jr; setsid nohup bash docs/experiments/2026-12-07-judge-on-unseen-replays/run.sh > /tmp/run.out 2>&1 < /dev/null &
#   bash tools/poll.sh /root/jr "$OUT" 500 r1        # then r2, r3, ... in the calls after
# The loop to the gate (arm unseen); arm seen beside it once the world model exists (the same gate episodes); then arm real.
R=/root/jr
P="--preset metaworld-gpu"
W="python3 -m worldloop"
mkdir -p $R; date +%s > $R/started
cd "$(dirname "$0")/../../.."
# a copy of the code of this moment: later calls sync the working tree again
rm -rf /root/wl && mkdir -p /root/wl && cp -r worldloop tools pyproject.toml /root/wl/ && cd /root/wl
export PYTHONPATH=/tmp/site:/root/wl
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
SHORTER=""  # the protocol's amendment: SHORT=1 when the machine starts with under 1250 s of device time left
[ "${SHORT:-0}" = 1 ] && SHORTER="vae.time_limit_s=360 world_model.time_limit_s=180"
echo "short=${SHORT:-0}" > $R/amendment.txt
$W loop $P --out $R --until gate seed=1 $SHORTER > $R/run.log 2>&1 &
LOOP=$!
while [ ! -f $R/stages/wm_base.json ] && kill -0 $LOOP 2>/dev/null; do sleep 5; done
if [ -f $R/stages/wm_base.json ]; then
  $W train-reward $P --dataset $R/demos $R/rollouts_base --world-model $R/wm_base --out $R/judge_seen seed=1 > $R/judge_seen.log 2>&1 \
    && $W gate $P --policy $R/policy_base --world-model $R/wm_base --judge $R/judge_seen --dataset $R/rollouts_base --out $R/gate_seen seed=1 > $R/gate_seen.log 2>&1
  echo "seen $? $(date +%s)" >> $R/arms.txt
fi
wait $LOOP; echo "loop $? $(date +%s)" >> $R/arms.txt
$W train-reward $P --dataset $R/demos $R/rollouts_base $R/rollouts_judge --out $R/judge_real seed=1 > $R/judge_real.log 2>&1 \
  && $W gate $P --policy $R/policy_base --world-model $R/wm_base --judge $R/judge_real --dataset $R/rollouts_base --out $R/gate_real seed=1 > $R/gate_real.log 2>&1
echo "real $? $(date +%s)" >> $R/arms.txt
echo done > $R/done

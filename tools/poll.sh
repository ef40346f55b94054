#!/usr/bin/env bash
# For a host reached by time-limited calls: wait for a run started in the background (tools/README.md) until
# RESULTS_DIR/done exists or WAIT_S seconds have passed (keep WAIT_S under one call's limit), print the tail of
# RESULTS_DIR/run.log, pack the results into DEST/NAME.tgz (pack.sh) and copy the manifests and at most
# MAX_PARTS (3) not yet sent model parts of CARRY (a folder of tools/parts.py packs) into DEST.
# A call cut short still brings back what DEST holds: so the parts complete at the call's start are copied
# first, and the results are packed again every minute of the wait (a call cut 85 s before its wait ended,
# 2026-12-03, brought nothing back: RL's final evaluations were lost).
#   bash tools/poll.sh RESULTS_DIR DEST [WAIT_S] [NAME]
# e.g. in each call: CARRY=/root/carry bash tools/poll.sh /root/mw "$OUT" 530 r1
set -uo pipefail
root=${1:?usage: poll.sh RESULTS_DIR DEST [WAIT_S] [NAME]}
dest=${2:?usage: poll.sh RESULTS_DIR DEST [WAIT_S] [NAME]}
wait_s=${3:-530}
name=${4:-results}
max_parts=${MAX_PARTS:-3}  # 15 MB each: a call brings back ~64 MB at most
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -d "$root" ]; then
  # a fresh machine: the one that ran the job went back between calls (2026-12-04: a call waited its whole
  # 455 s here for nothing); say so at once and keep the call's time
  echo "poll.sh: $root does not exist: this machine did not run the job (the previous one went back between calls); its results are lost, nothing to wait for" >&2
  exit 3
fi
mkdir -p "$dest"
sent=0 left=0
send_parts() {  # the manifests, then not yet sent parts up to max_parts in this call
  [ -n "${CARRY:-}" ] && [ -d "$CARRY" ] || return 0
  # only the parts that complete packs list: tools/parts.py writes NAME.parts.json after all of NAME's parts
  mkdir -p "$CARRY/.sent"
  left=0
  for manifest in "$CARRY"/*.parts.json; do
    [ -f "$manifest" ] || continue
    cp "$manifest" "$dest/"  # small: every call brings the manifests
    for base in $(python3 -c "import json, sys; print(*(p['file'] for p in json.load(open(sys.argv[1]))['parts']))" "$manifest"); do
      part="$CARRY/$base"
      [ -f "$part" ] || continue
      [ -f "$CARRY/.sent/$base" ] && continue
      if [ "$sent" -ge "$max_parts" ]; then left=$((left + 1)); continue; fi
      cp "$part" "$dest/" && touch "$CARRY/.sent/$base" && sent=$((sent + 1))
    done
  done
}
pack() {  # into a scratch file first, then renamed: a call cut during tar keeps the previous archive whole
  bash "$here/pack.sh" "$root" "/tmp/poll-$name.tgz" >"/tmp/poll-$name.txt" 2>&1 \
    && cp "/tmp/poll-$name.tgz" "$dest/.$name.tgz.new" && mv "$dest/.$name.tgz.new" "$dest/$name.tgz"
}
send_parts
for i in $(seq $((wait_s / 5))); do
  [ -f "$root/done" ] && break
  sleep 5
  [ $((i % 12)) = 0 ] && pack
done
tail -n 6 "$root/run.log" 2>/dev/null; cat "$root/done" 2>/dev/null
pack; cat "/tmp/poll-$name.txt"
if [ -n "${CARRY:-}" ] && [ -d "$CARRY" ]; then
  send_parts
  echo "carry: $sent parts in this call, $left left"
fi

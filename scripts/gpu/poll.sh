#!/usr/bin/env bash
# One device call's worth of a running session.sh: wait until the session is done or WAIT_S seconds have passed
# (the device goes back 30 s after a call ends, so calls must follow each other: keep WAIT_S under the call's
# limit), print its progress, pack its results into DEST/NAME.tgz (pack.sh) and copy the manifests and at most
# MAX_PARTS (3) not yet sent model parts of CARRY (session.sh's CARRY folder) into DEST.
# A call cut short by the lease's end still brings back what DEST holds: so the parts complete at the call's start
# are copied first, and the results are packed again every minute of the wait (the twenty-first session's last
# call was cut 85 s before its wait ended and brought nothing back: RL's final evaluations were lost).
#   bash scripts/gpu/poll.sh RESULTS_DIR DEST [WAIT_S] [NAME]
# e.g. in each device call: CARRY=/root/carry bash scripts/gpu/poll.sh /root/wl "$OUT" 530 r1
set -uo pipefail
root=${1:?usage: poll.sh RESULTS_DIR DEST [WAIT_S] [NAME]}
dest=${2:?usage: poll.sh RESULTS_DIR DEST [WAIT_S] [NAME]}
wait_s=${3:-530}
name=${4:-results}
max_parts=${MAX_PARTS:-3}  # 15 MB each: a call brings back ~64 MB at most
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -d "$root" ]; then
  # a fresh machine: the one that ran the session went back between calls (the twenty-fifth session's last call
  # waited its whole 455 s here for nothing); say so at once and keep the lease's time
  echo "poll.sh: $root does not exist: this machine did not run the session (the previous one went back between calls); its results are lost, nothing to wait for" >&2
  exit 3
fi
mkdir -p "$dest"
sent=0 left=0
send_parts() {  # the manifests, then not yet sent parts up to max_parts in this call
  [ -n "${CARRY:-}" ] && [ -d "$CARRY" ] || return 0
  # only the parts that complete packs list: worldloop.utils.parts writes NAME.parts.json after all of NAME's parts
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
  grep -q "session done" "$root/progress.txt" 2>/dev/null && break
  sleep 5
  [ $((i % 12)) = 0 ] && pack
done
tail -n 6 "$root/progress.txt" 2>/dev/null
pack; cat "/tmp/poll-$name.txt"
if [ -n "${CARRY:-}" ] && [ -d "$CARRY" ]; then
  send_parts
  echo "carry: $sent parts in this call, $left left"
fi

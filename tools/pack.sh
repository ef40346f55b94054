#!/usr/bin/env bash
# Pack what a GPU run produced so far into one small archive, for hosts that return only a few small files
# (e.g. at most 8): logs, tables, metrics, configs, plots, TensorBoard events and a few
# videos; no model weights, datasets (LeRobot videos/observation.* of any collected folder) or caches.
#   bash tools/pack.sh RESULTS_DIR ARCHIVE.tgz [MAX_VIDEOS]
set -uo pipefail
root=${1:?usage: pack.sh RESULTS_DIR ARCHIVE.tgz [MAX_VIDEOS]}
archive=${2:?usage: pack.sh RESULTS_DIR ARCHIVE.tgz [MAX_VIDEOS]}
max_videos=${3:-24}
cd "$root" || exit 1
list=$(mktemp)
find . \( -path ./dataset -o -path '*/reward-data' -o -path '*/videos/observation.*' -o -name .cache -o -name checkpoints -o -name 'qwen3-vl-tiny' \) -prune -o -type f \
  \( -name '*.json' -o -name '*.md' -o -name '*.txt' -o -name '*.log' -o -name '*.png' -o -name '*.yaml' -o -name '*.csv' -o -name 'events.out.tfevents*' \) \
  -size -4096k -print >"$list"
# small files without an extension too: a run's markers (done, started), which the patterns above leave out
find . \( -path ./dataset -o -path '*/reward-data' -o -path '*/videos' -o -name .cache -o -name checkpoints -o -name 'qwen3-vl-tiny' \) -prune -o -type f \
  ! -name '*.*' -size -64k -print >>"$list"
# Videos: the world model's side-by-side clips first, then RL's, latest iteration first; each under 1 MB (find's -size -1M
# would mean "0 MB", as it rounds sizes up to whole units).
find . \( -path ./dataset -o -path '*/videos/observation.*' -o -name .cache \) -prune -o -type f -name '*.mp4' -size -1024k -print | sort -r | head -n "$max_videos" >>"$list"
tar czf "$archive" -T "$list"
if [ "$(stat -c %s "$archive")" -gt 15000000 ]; then  # the device tool brings back files up to 16 MB
  grep -v -e '\.mp4$' -e tfevents "$list" >"$list.small"
  tar czf "$archive" -T "$list.small"
  rm -f "$list.small"
fi
rm -f "$list"
echo "packed $(tar tzf "$archive" | wc -l) files, $(du -h "$archive" | cut -f1)"

#!/usr/bin/env bash
# Peak resident memory of `inspect` and `replay` on a >= 2 GB synthetic trace (issue #3).
# Run from the repository root: crates/trace-io/scripts/large-trace-rss.sh [DIR]  (default DIR: /tmp)
# Needs /usr/bin/time (apt-get install time). The trace is written to DIR and deleted at the end.
#
# /usr/bin/time's "Maximum resident set size" counts the mapped file pages the validation pass touched
# (RssFile: clean page-cache pages, reclaimable without I/O); the script also samples
# /proc/PID/status to split the peak into RssAnon (the process's own memory) and RssFile.
set -euo pipefail
DIR=${1:-/tmp}
T="$DIR/moe-offload-large-trace.safetensors"
trap 'rm -f "$T"' EXIT
cargo build --release -p cli
B=${CARGO_TARGET_DIR:-target}/release/moe-offload

peaks() {
  local pid=$1 ra=0 rf=0 rss=0 st a f r
  while kill -0 "$pid" 2>/dev/null; do
    if st=$(cat "/proc/$pid/status" 2>/dev/null); then
      a=$(awk '/^RssAnon/{print $2}' <<<"$st"); f=$(awk '/^RssFile/{print $2}' <<<"$st"); r=$(awk '/^VmRSS/{print $2}' <<<"$st")
      if [ -n "$a" ] && [ "$a" -gt "$ra" ]; then ra=$a; fi
      if [ -n "$f" ] && [ "$f" -gt "$rf" ]; then rf=$f; fi
      if [ -n "$r" ] && [ "$r" -gt "$rss" ]; then rss=$r; fi
    fi
    sleep 0.02
  done
  echo "sampled peaks: VmRSS ${rss} kB, RssAnon ${ra} kB, RssFile ${rf} kB"
}

measure() {
  echo "== $*"
  /usr/bin/time -v "$@" >"$DIR/rss-out.txt" 2>"$DIR/rss-time.txt" &
  local tp=$! pid=""
  while [ -z "$pid" ] && kill -0 "$tp" 2>/dev/null; do pid=$(pgrep -P "$tp" | head -1 || true); done
  if [ -n "$pid" ]; then peaks "$pid"; fi
  wait "$tp"
  grep -E "Maximum resident|Elapsed" "$DIR/rss-time.txt"
  head -n 3 "$DIR/rss-out.txt"
  rm -f "$DIR/rss-out.txt" "$DIR/rss-time.txt"
}

# 48 layers x 100,000 tokens x (64 ids + 64 scores + 10 gates + 10 norms) = 2.23 GB.
# synth builds the whole trace in memory before writing it (peak RSS ~ the file size).
measure "$B" synth --layers 48 --experts 512 --top-k 10 --candidates 64 --tokens 100000 --sequences 100 --seed 1 -o "$T"
ls -l "$T"
measure "$B" inspect "$T"
measure "$B" replay "$T" --policy lru --cap 128

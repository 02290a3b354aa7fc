#!/usr/bin/env bash
# A sharded `moe-offload sweep` with GNU parallel, on this machine or on several over ssh: the N
# shards `sweep --shard I/N` as parallel's jobs, then `sweep merge` into OUT/merged.
# docs/sweep.md ("GNU parallel") shows it in use; scripts/test-slurm.sh runs it in CI.
#
#   parallel-sweep.sh N OUT [SWEEP ARGS...]
#
# SWEEP ARGS are those of `moe-offload sweep` (none: the embedded default grid) except --shard, -o
# and --threads, which the script sets (task I writes OUT/shard-I with --threads
# $SWEEP_THREADS, default 1). Every job's exit code and run time go to OUT/joblog (parallel's
# --joblog). When a shard fails, the script names it and stops before merging; running the same
# command again runs only the shards that failed or never ran (--resume-failed), then merges.
# Prerequisites: GNU parallel (Debian/Ubuntu: apt-get install parallel; macOS: brew install
# parallel), bash, and the moe-offload binary (`cargo build --release -p cli`, then
# ${CARGO_TARGET_DIR:-target}/release/moe-offload, on PATH or as MOE_OFFLOAD).
# Environment: MOE_OFFLOAD, the binary (default: `moe-offload` on PATH); PARALLEL, GNU parallel's
# own options (for example "-j 4", or "--sshloginfile hosts --workdir ." to use several machines:
# OUT and the traces must then be at the same paths on all of them).
set -euo pipefail

die() { echo "parallel-sweep.sh: $*" >&2; exit 2; }
(($# >= 2)) || { sed -n '/^#   parallel-sweep.sh/s/^#   //p' "${BASH_SOURCE[0]}" >&2; exit 2; }
n=$1 out=$2
shift 2
[[ $n =~ ^[1-9][0-9]*$ ]] || die "N must be a positive whole number, got '$n'"
for a in "$@"; do
  case $a in --shard | --shard=* | -o | --output | --output=* | --threads | --threads=*)
    die "$a is set by the script (per shard); give the other sweep arguments only" ;;
  esac
done
command -v parallel >/dev/null || die "GNU parallel is not installed"
bin=${MOE_OFFLOAD:-moe-offload}
bin=$(command -v "$bin") || die "moe-offload binary '${MOE_OFFLOAD:-moe-offload}' not found (set MOE_OFFLOAD)"
mkdir -p "$out"

# -q: the command's words are passed as they are (no shell re-parsing of paths with spaces);
# {} is the shard index. A job's failure does not stop the others (parallel's default).
rc=0
parallel --will-cite -q --joblog "$out/joblog" --resume-failed "$bin" sweep "$@" --threads "${SWEEP_THREADS:-1}" \
  --shard "{}/$n" -o "$out/shard-{}" ::: $(seq 0 $((n - 1))) >"$out/parallel.log" || rc=$?
# joblog columns: Seq Host Starttime JobRuntime Send Receive Exitval Signal Command; the last line
# of a shard is its latest try.
failed=$(awk -F'\t' 'NR > 1 { last[$1] = ($7 != 0 || $8 != 0) } END { for (s in last) if (last[s]) print s - 1 }' \
  "$out/joblog" | sort -n | paste -sd' ' -)
if ((rc != 0)) || [[ -n $failed ]]; then
  die "shards failed: ${failed:-(see $out/parallel.log)} (exit codes in $out/joblog); run the same command again to rerun only them"
fi
shards=()
for ((i = 0; i < n; i++)); do shards+=("$out/shard-$i"); done
"$bin" sweep merge "${shards[@]}" -o "$out/merged"

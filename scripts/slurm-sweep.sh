#!/usr/bin/env bash
# A sharded `moe-offload sweep` on a Slurm cluster: one job array of `sweep --shard I/N`, every
# task's state from Slurm's accounting (sacct), the failed tasks resubmitted, then `sweep merge`.
# docs/sweep.md ("A Slurm job array") shows it in use; scripts/test-slurm.sh runs it on a one-node
# cluster in CI.
#
#   slurm-sweep.sh submit N OUT [SWEEP ARGS...]  submit shards 0..N-1 as one array (prints the job id)
#   slurm-sweep.sh wait OUT [SECONDS]            wait until no shard is pending or running (default 3600 s)
#   slurm-sweep.sh status OUT                    per shard: job, state, exit code, elapsed seconds
#   slurm-sweep.sh resubmit OUT                  submit the shards that did not complete, as one new array
#   slurm-sweep.sh merge OUT                     every shard completed: `sweep merge` into OUT/merged
#   slurm-sweep.sh task OUT                      (what each array task runs; not for direct use)
#
# SWEEP ARGS are those of `moe-offload sweep` (a grid file, --in-sample, ...; none: the embedded
# default grid) except --shard, -o and --threads, which the script sets: task I writes OUT/shard-I
# with `--threads $SLURM_CPUS_PER_TASK` (1 when unset). OUT must be on a file system every node
# sees, and relative paths in SWEEP ARGS are taken from the directory `submit` ran in.
# Prerequisites: a Slurm cluster (sbatch, squeue, sacct; sacct needs accounting, see below), bash,
# and the moe-offload binary on a path every node sees (`cargo build --release -p cli`, then
# ${CARGO_TARGET_DIR:-target}/release/moe-offload, on PATH or as MOE_OFFLOAD).
# Environment: MOE_OFFLOAD, the binary (default: `moe-offload` on PATH; the path is recorded at
# submit time); SWEEP_SBATCH_OPTS, more sbatch options for every submission (word-split, e.g.
# "--cpus-per-task=8 --partition=cpu --time=02:00:00"); sbatch's own SBATCH_* variables apply too.
#
# Files in OUT: `submission` (N, the directory, the binary and SWEEP ARGS, NUL-separated), `jobs`
# (one line per array submitted: job id and its task list), `logs/` (each task's output),
# `shard-I/` (the shard's results), `shard-I.exit` (its exit code, written by the task itself).
# States come from sacct where accounting is on. Without it (sacct refuses: accounting_storage/none),
# a shard not in squeue counts as COMPLETED when its exit file says 0, FAILED when it says anything
# else and LOST when it has none (the task was killed: time limit, memory, node failure).
set -euo pipefail

# Under sbatch this is Slurm's copy of the script, which the task mode does not need.
self=$(realpath "${BASH_SOURCE[0]}")
die() { echo "slurm-sweep.sh: $*" >&2; exit 2; }
usage() { sed -n '/^#   slurm-sweep.sh/s/^#   //p' "$self" >&2; exit 2; }

# The submission recorded in OUT: sets n, dir, bin and the array sweep_args.
load() {
  local out=$1 fields
  [[ -f $out/submission ]] || die "$out/submission not found: not an output directory of \`slurm-sweep.sh submit\`"
  mapfile -d '' fields <"$out/submission"
  ((${#fields[@]} >= 3)) || die "$out/submission is truncated"
  n=${fields[0]} dir=${fields[1]} bin=${fields[2]}
  sweep_args=("${fields[@]:3}")
}

# sbatch the array of the given task list ("0-3", "1,3") and record it in OUT/jobs.
submit_array() {
  local out=$1 list=$2 job
  local -a opts=()
  [[ -n ${SWEEP_SBATCH_OPTS:-} ]] && read -r -a opts <<<"$SWEEP_SBATCH_OPTS"
  job=$(sbatch --parsable --array="$list" --chdir="$dir" --job-name=moe-sweep \
    --output="$out/logs/shard-%a.job-%A.out" "${opts[@]}" "$self" task "$out")
  job=${job%%;*}
  echo "$job $list" >>"$out/jobs"
  echo "$job"
}

# Fills the arrays state, exitcode and elapsed (indexed by shard) from the last job that ran each
# shard: sacct where accounting is on, squeue and the exit files otherwise. Sets via=sacct|files.
query() {
  local out=$1 job list i id st ec el
  state=() exitcode=() elapsed=() jobof=()
  while read -r job list; do
    for i in $(expand "$list"); do jobof[i]=$job; done
  done <"$out/jobs"
  local jobs
  jobs=$(printf '%s\n' "${jobof[@]}" | sort -u | paste -sd, -)
  if sacct -n -X -P -j "$jobs" --format=JobID >/dev/null 2>&1; then
    via=sacct
    # JobID is JOB_I for a task that started, JOB_[LIST] for tasks that did not (pending, or
    # cancelled before they started).
    while IFS='|' read -r id st ec el; do
      if [[ $id =~ ^([0-9]+)_([0-9]+)$ ]]; then
        i=${BASH_REMATCH[2]}
        [[ ${jobof[i]:-} == "${BASH_REMATCH[1]}" ]] && state[i]=${st%% *} exitcode[i]=$ec elapsed[i]=$el
      elif [[ $id =~ ^([0-9]+)_\[([0-9,-]+)(%[0-9]+)?\]$ ]]; then
        job=${BASH_REMATCH[1]}
        for i in $(expand "${BASH_REMATCH[2]}"); do
          [[ ${jobof[i]:-} == "$job" ]] && state[i]=${st%% *}
        done
      fi
    done < <(sacct -n -X -P -j "$jobs" --format=JobID,State,ExitCode,ElapsedRaw)
  else
    via=files
  fi
  local -A queued=()
  while read -r id st; do
    [[ $id =~ ^([0-9]+)_([0-9]+)$ ]] && queued[$id]=$st
  done < <(squeue -h -r -j "$jobs" -o '%i %T' 2>/dev/null || true)
  for ((i = 0; i < n; i++)); do
    if [[ -n ${queued[${jobof[i]}_$i]:-} && $via == files ]]; then
      state[i]=${queued[${jobof[i]}_$i]}
    elif [[ $via == files ]]; then
      if [[ ! -f $out/shard-$i.exit ]]; then state[i]=LOST
      elif [[ $(<"$out/shard-$i.exit") == 0 ]]; then state[i]=COMPLETED exitcode[i]=0
      else state[i]=FAILED exitcode[i]=$(<"$out/shard-$i.exit"); fi
    fi
    # Accounting may lag the queue by a moment: a task sacct does not list yet is PENDING.
    : "${state[i]:=PENDING}"
    # A task that completed must have left its results where the merge will look.
    if [[ ${state[i]} == COMPLETED && ! -f $out/shard-$i/results.json ]]; then state[i]=NO_RESULTS; fi
  done
}

# "0-3,5" -> "0 1 2 3 5"
expand() {
  local part
  local -a parts
  IFS=, read -r -a parts <<<"$1"
  for part in "${parts[@]}"; do
    if [[ $part == *-* ]]; then seq "${part%-*}" "${part#*-}"; else echo "$part"; fi
  done
}

active() { [[ $1 =~ ^(PENDING|RUNNING|REQUEUED|REQUEUE_FED|REQUEUE_HOLD|RESIZING|SUSPENDED|COMPLETING|CONFIGURING|SIGNALING|STAGE_OUT|RESV_DEL_HOLD)$ ]]; }

# Prints one line per shard and a last line; returns 0 when every shard completed, 1 when some
# failed (and none is active), 3 while some are active.
status() {
  local out=$1 i failed=() running=()
  query "$out"
  for ((i = 0; i < n; i++)); do
    printf 'shard %d/%d  job %s_%d  %-12s exit %-5s elapsed %s s\n' "$i" "$n" "${jobof[i]}" "$i" "${state[i]}" \
      "${exitcode[i]:--}" "${elapsed[i]:--}"
    if active "${state[i]}"; then running+=("$i"); elif [[ ${state[i]} != COMPLETED ]]; then failed+=("$i"); fi
  done
  if ((${#running[@]})); then echo "pending or running: ${running[*]} (states from $via)"; return 3; fi
  if ((${#failed[@]})); then
    echo "not completed: ${failed[*]} (states from $via); \`slurm-sweep.sh resubmit $out\` submits them again"
    return 1
  fi
  echo "all $n shards completed (states from $via)"
}

cmd=${1:-}
(($#)) && shift
case $cmd in
  submit)
    (($# >= 2)) || usage
    n=$1 out=$2
    shift 2
    [[ $n =~ ^[1-9][0-9]*$ ]] || die "N must be a positive whole number, got '$n'"
    for a in "$@"; do
      case $a in --shard | --shard=* | -o | --output | --output=* | --threads | --threads=*)
        die "$a is set by the script (per task); give the other sweep arguments only" ;;
      esac
    done
    bin=${MOE_OFFLOAD:-moe-offload}
    bin=$(command -v "$bin") || die "moe-offload binary '${MOE_OFFLOAD:-moe-offload}' not found (set MOE_OFFLOAD)"
    bin=$(realpath "$bin") dir=$PWD
    mkdir -p "$out/logs"
    out=$(realpath "$out")
    [[ -e $out/submission ]] && die "$out already holds a submission: resubmit, or choose another OUT"
    printf '%s\0' "$n" "$dir" "$bin" "$@" >"$out/submission"
    : >"$out/jobs"
    submit_array "$out" "0-$((n - 1))"
    ;;
  task)
    (($# == 1)) || usage
    out=$1
    load "$out"
    i=${SLURM_ARRAY_TASK_ID:?the task mode runs inside a Slurm array task}
    rm -rf "$out/shard-$i" "$out/shard-$i.exit"
    rc=0
    "$bin" sweep "${sweep_args[@]}" --threads "${SLURM_CPUS_PER_TASK:-1}" --shard "$i/$n" -o "$out/shard-$i" || rc=$?
    echo "$rc" >"$out/shard-$i.exit"
    exit "$rc"
    ;;
  status)
    (($# == 1)) || usage
    out=$(realpath "$1")
    load "$out"
    status "$out"
    ;;
  wait)
    (($# >= 1)) || usage
    out=$(realpath "$1") limit=${2:-3600}
    load "$out"
    start=$SECONDS
    while :; do
      rc=0
      status "$out" >/dev/null || rc=$?
      ((rc != 3)) && break
      ((SECONDS - start >= limit)) && { status "$out" || true; die "still pending or running after $limit s"; }
      sleep 2
    done
    status "$out"
    ;;
  resubmit)
    (($# == 1)) || usage
    out=$(realpath "$1")
    load "$out"
    rc=0
    status "$out" >/dev/null || rc=$?
    ((rc == 3)) && die "some shards are still pending or running: \`slurm-sweep.sh wait $out\` first"
    ((rc == 0)) && { echo "all $n shards completed: nothing to resubmit"; exit 0; }
    redo=()
    for ((i = 0; i < n; i++)); do [[ ${state[i]} != COMPLETED ]] && redo+=("$i"); done
    list=$(IFS=,; echo "${redo[*]}")
    submit_array "$out" "$list"
    ;;
  merge)
    (($# == 1)) || usage
    out=$(realpath "$1")
    load "$out"
    status "$out" || die "not every shard completed: nothing merged"
    shards=()
    for ((i = 0; i < n; i++)); do shards+=("$out/shard-$i"); done
    "$bin" sweep merge "${shards[@]}" -o "$out/merged"
    ;;
  *) usage ;;
esac

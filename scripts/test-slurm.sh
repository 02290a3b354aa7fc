#!/usr/bin/env bash
# CI test of the sharded-sweep recipes of docs/sweep.md, run for real:
# - scripts/parallel-sweep.sh with GNU parallel, when it is installed;
# - scripts/slurm-sweep.sh on a one-node Slurm cluster started here: munge, MariaDB and slurmdbd
#   (Slurm's accounting, which sacct reads), slurmctld and slurmd on localhost with a partition of
#   2 CPUs, everything in a temporary directory and stopped at the end whatever happened.
# Each splits a small grid into 4 shards (synthetic traces of 8 layers x 64 experts made here, a
# keep-map file, relative paths: 48 configurations, a few seconds per shard), one of which (shard
# 2) fails on its first try through a wrapper around the binary; the recipe must name it, run it
# again, and merge into files byte-identical to those of the whole sweep (`cmp`).
# The Slurm part is SKIPPED with a note (exit 0) where Slurm is not installed or its daemons do not
# come up; once the cluster is up, any difference or failure exits 1.
# The binary: $CARGO_TARGET_DIR/release/moe-offload (default target/), the release build that the
# README's commands (and .ci/run's tests) make, built if missing or out of date.
# Prerequisites: GNU parallel (Debian: parallel) for the first part; slurm-wlm, slurmdbd, munge and
# mariadb-server for the second (each part is skipped with a note without them).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
# The daemons are in sbin, which a non-login root shell may lack.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
t0=$SECONDS
target=${CARGO_TARGET_DIR:-target}
cargo build --release --locked --quiet -p cli --bin moe-offload
bin=$(realpath "$target/release/moe-offload")
tmp=$(mktemp -d /tmp/moe-offload-slurm.XXXXXX)
chmod 755 "$tmp"
pids=() # pid files of the daemons started here, in start order
failed=0

fail() { echo "FAIL: $*"; failed=1; }
note() { echo "test-slurm: $*"; }

# Stops the daemons this script started (by their pid files, last started first), prints their
# logs' ends when the test failed, removes the temporary directory.
cleanup() {
  local rc=$? p pid i _ alive
  if [[ -n ${SLURM_CONF:-} && -s $tmp/slurm/jobs ]]; then
    scancel "$(cut -d' ' -f1 "$tmp/slurm/jobs" | paste -sd, -)" 2>/dev/null || true
  fi
  local -a running=()
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    p=${pids[i]}
    [[ -s $p ]] || continue
    pid=$(<"$p")
    kill "$pid" 2>/dev/null && running+=("$pid")
  done
  # Up to 10 s for all of them to exit, then SIGKILL.
  for _ in $(seq 50); do
    alive=0
    for pid in "${running[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.2
  done
  for pid in "${running[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  if ((rc != 0)) && [[ -d $tmp/log ]]; then
    for f in "$tmp"/log/*; do echo "== $f"; tail -n 15 "$f"; done
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# until_ok SECONDS CMD...: runs CMD every half second until it succeeds; fails after SECONDS.
until_ok() {
  local limit=$1 start=$SECONDS
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS - start >= limit)) && return 1
    sleep 0.5
  done
}

# same DIR: the merged files in DIR are byte-identical to the whole sweep's (else a failure is
# recorded and the test goes on).
same() {
  local f
  for f in results.json results.csv summary.md; do
    cmp "$tmp/whole/$f" "$1/$f" || { fail "$1/$f differs from the whole sweep's"; return 0; }
  done
  note "merged results.json, results.csv and summary.md are byte-identical to the whole sweep's"
}

# flaky NAME: a wrapper around the binary that fails shard 2 of 4 the first time it runs (as a task
# killed on a bad node would), and otherwise runs the binary.
flaky() {
  cat >"$tmp/flaky-$1" <<EOF
#!/usr/bin/env bash
if [[ " \$* " == *" --shard 2/4 "* ]] && mkdir "$tmp/failed-once-$1" 2>/dev/null; then
  echo "injected failure of shard 2 (first try)" >&2
  exit 3
fi
exec "$bin" "\$@"
EOF
  chmod +x "$tmp/flaky-$1"
}

# The grid and its inputs, in $tmp/work (the recipes run there, the grid's paths relative).
mkdir -p "$tmp/work/grid" "$tmp/log"
cd "$tmp/work"
synth() { "$bin" synth --layers 8 --experts 64 --top-k 6 --candidates 16 "$@" >/dev/null 2>>"$tmp/log/synth.log"; }
synth --tokens 32768 --seed 1 -o calib.safetensors
synth --tokens 8192 --seed 2 -o heldout.safetensors
"$bin" stats calib.safetensors -o stats.json >/dev/null
"$bin" keep stats.json --metric gate_sum --k 40 -o keep.json >/dev/null
cat >grid/grid.json <<'EOF'
{
  "name": "scripts/test-slurm.sh: synthetic 8 layers x 64 experts, top-6 of 16",
  "traces": { "in_sample": "../calib.safetensors", "out_of_sample": "../heldout.safetensors" },
  "variants": ["full", "frequency@48", "file:../keep.json"],
  "blocks": [
    { "policies": ["lru", "lfu", "belady", "near_pick", "near_pick_ema", "inv_router"], "cap": [16, 32] },
    { "policies": ["near_pick", "inv_router"], "lambda": [0.05, 0.12], "j": [2], "cap": [16] }
  ]
}
EOF
t=$SECONDS
"$bin" sweep grid/grid.json --threads 2 -o "$tmp/whole" >/dev/null
note "whole sweep (48 configurations x 2 traces, 2 threads): $((SECONDS - t)) s"

# ---- GNU parallel -------------------------------------------------------------------------------
if command -v parallel >/dev/null 2>&1; then
  flaky parallel
  t=$SECONDS rc=0
  MOE_OFFLOAD=$tmp/flaky-parallel PARALLEL="-j 2" "$repo/scripts/parallel-sweep.sh" 4 "$tmp/par" grid/grid.json 2>"$tmp/par.err" || rc=$?
  cat "$tmp/par.err"
  ((rc == 2)) && grep -q "shards failed: 2 " "$tmp/par.err" || fail "parallel-sweep.sh did not report shard 2 as failed (exit $rc)"
  MOE_OFFLOAD=$tmp/flaky-parallel PARALLEL="-j 2" "$repo/scripts/parallel-sweep.sh" 4 "$tmp/par" grid/grid.json >/dev/null ||
    fail "parallel-sweep.sh failed on its second run"
  # Four first tries and one rerun of shard 2 (seq 3): --resume-failed ran only that one again.
  tries=$(awk -F'\t' 'NR > 1 { printf "%s:%s ", $1 - 1, $7 }' "$tmp/par/joblog")
  [[ $tries == *"2:3 "* && $(grep -c . "$tmp/par/joblog") == 6 && $(awk -F'\t' 'NR > 1 && $1 == 3' "$tmp/par/joblog" | wc -l) == 2 ]] ||
    fail "joblog should hold 4 first tries and 1 rerun of shard 2, holds (shard:exit) $tries"
  [[ -f $tmp/par/merged/results.json ]] && same "$tmp/par/merged"
  note "GNU parallel: shard:exit $tries; run times (shard:s, joblog): $(awk -F'\t' 'NR > 1 { printf "%s:%.2f ", $1 - 1, $4 }' "$tmp/par/joblog")"
  note "GNU parallel recipe: $((SECONDS - t)) s, $([[ $failed == 0 ]] && echo ok || echo FAILED)"
else
  note "SKIPPED the GNU parallel recipe: parallel is not installed"
fi

# ---- Slurm --------------------------------------------------------------------------------------
skip() {
  note "SKIPPED the Slurm recipe (not run, not passed): $*"
  if [[ -d $tmp/log ]]; then for f in "$tmp"/log/*; do echo "== $f"; tail -n 8 "$f"; done; fi
  exit "$failed"
}
for c in munged slurmctld slurmd sbatch squeue scancel; do
  command -v "$c" >/dev/null 2>&1 || skip "$c is not installed (Debian: slurm-wlm, munge)"
done
t=$SECONDS
d=$tmp/cluster
mkdir -p "$d/state" "$d/spool" "$d/munge"
# Three free ports in a row for slurmctld, slurmd, slurmdbd.
port=16817
in_use() { (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
while in_use "$port" || in_use $((port + 1)) || in_use $((port + 2)); do port=$((port + 3)); done

# munge: a key made here and a daemon on its own socket (no clash with a system munged).
dd if=/dev/urandom of="$d/munge/munge.key" bs=1024 count=1 2>/dev/null
chmod 400 "$d/munge/munge.key"
pids+=("$d/munge/munged.pid")
munged -f --key-file="$d/munge/munge.key" --socket="$d/munge/socket" --pid-file="$d/munge/munged.pid" \
  --seed-file="$d/munge/seed" --log-file="$tmp/log/munged.log" || skip "munged did not start"
until_ok 10 munge -S "$d/munge/socket" -n || skip "munged does not answer"

# Accounting: MariaDB (own data directory, Unix socket only) and slurmdbd. Without them sacct
# cannot work; the recipe then reads states from its exit files, which this test says.
accounting=accounting_storage/none
if command -v mariadbd >/dev/null 2>&1 && command -v slurmdbd >/dev/null 2>&1 && command -v sacct >/dev/null 2>&1; then
  sock=$d/mariadb.sock
  if mariadb-install-db --no-defaults --datadir="$d/db" --user=root --auth-root-authentication-method=normal \
    --skip-test-db >"$tmp/log/mariadb-install-db.log" 2>&1; then
    pids+=("$d/mariadb.pid")
    mariadbd --no-defaults --datadir="$d/db" --socket="$sock" --skip-networking --user=root \
      --pid-file="$d/mariadb.pid" --log-error="$tmp/log/mariadb.log" </dev/null >/dev/null 2>&1 &
    if until_ok 30 mariadb --no-defaults -S "$sock" -u root -e "select 1" &&
      mariadb --no-defaults -S "$sock" -u root -e \
        "create user slurm@localhost identified by 'slurm'; grant all on slurm_acct_db.* to slurm@localhost;"; then
      accounting=accounting_storage/slurmdbd
    fi
  fi
  [[ $accounting == accounting_storage/none ]] && note "MariaDB did not start: running Slurm without accounting"
else
  note "mariadb-server, slurmdbd or sacct not installed: running Slurm without accounting"
fi

cat >"$d/slurm.conf" <<EOF
ClusterName=moeoffload
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge/socket
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=$accounting
AccountingStorageHost=localhost
AccountingStoragePort=$((port + 2))
AccountingStoragePass=$d/munge/socket
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=sweep Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$d/slurm.conf
if [[ $accounting == accounting_storage/slurmdbd ]]; then
  cat >"$d/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$d/munge/socket
DbdHost=localhost
DbdPort=$((port + 2))
SlurmUser=root
LogFile=$tmp/log/slurmdbd.log
PidFile=$d/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$d/slurmdbd.conf"
  pids+=("$d/slurmdbd.pid")
  # slurmdbd finds slurmdbd.conf beside $SLURM_CONF, and MariaDB's socket through MYSQL_UNIX_PORT.
  if ! MYSQL_UNIX_PORT=$sock slurmdbd || ! until_ok 30 sacctmgr -n list cluster; then
    note "slurmdbd did not start: running Slurm without accounting"
    accounting=accounting_storage/none
    sed -i "s|^AccountingStorageType=.*|AccountingStorageType=$accounting|" "$SLURM_CONF"
  fi
fi
pids+=("$d/slurmctld.pid" "$d/slurmd.pid")
slurmctld -i || skip "slurmctld did not start"
until_ok 30 bash -c 'scontrol ping | grep -q UP' || skip "slurmctld does not answer"
slurmd -N localhost || skip "slurmd did not start"
until_ok 30 bash -c '[[ $(sinfo -h -n localhost -o %t) == idle ]]' || skip "the node did not become idle"
note "Slurm cluster up in $((SECONDS - t)) s ($accounting; ports $port-$((port + 2)))"

# The recipe: submit the array, wait, see shard 2 failed, resubmit it, wait, merge.
flaky slurm
t=$SECONDS
out=$tmp/slurm
export SWEEP_SBATCH_OPTS="--cpus-per-task=1"
job=$(MOE_OFFLOAD=$tmp/flaky-slurm "$repo/scripts/slurm-sweep.sh" submit 4 "$out" grid/grid.json)
rc=0
"$repo/scripts/slurm-sweep.sh" wait "$out" 120 >"$tmp/status1" || rc=$?
cat "$tmp/status1"
via=$([[ $accounting == accounting_storage/slurmdbd ]] && echo sacct || echo files)
((rc == 1)) && grep -Eq "^shard 2/4  job ${job}_2  FAILED +exit (3:0|3) " "$tmp/status1" &&
  grep -q "^not completed: 2 (states from $via)" "$tmp/status1" ||
  fail "slurm-sweep.sh wait should report shard 2 alone as FAILED with exit 3 (exit $rc)"
if [[ $via == sacct ]]; then
  # The same states without accounting: sacct refused, the exit files read instead.
  mkdir -p "$tmp/no-sacct"
  printf '#!/bin/sh\necho "sacct: error: Slurm accounting storage is disabled" >&2\nexit 1\n' >"$tmp/no-sacct/sacct"
  chmod +x "$tmp/no-sacct/sacct"
  PATH=$tmp/no-sacct:$PATH "$repo/scripts/slurm-sweep.sh" status "$out" >"$tmp/status-files" || true
  grep -Eq "^shard 2/4  job ${job}_2  FAILED +exit 3 " "$tmp/status-files" &&
    grep -q "^not completed: 2 (states from files)" "$tmp/status-files" ||
    { cat "$tmp/status-files"; fail "without sacct, status should read shard 2's failure from its exit file"; }
fi
job2=$("$repo/scripts/slurm-sweep.sh" resubmit "$out")
[[ $(tail -n 1 "$out/jobs") == "$job2 2" ]] || fail "resubmit should submit shard 2 alone, jobs: $(paste -sd';' "$out/jobs")"
"$repo/scripts/slurm-sweep.sh" wait "$out" 120 || fail "shards not all completed after the resubmission"
"$repo/scripts/slurm-sweep.sh" merge "$out" >/dev/null || fail "slurm-sweep.sh merge failed"
[[ -f $out/merged/results.json ]] && same "$out/merged"
note "Slurm recipe: $((SECONDS - t)) s (two arrays: jobs $job and $job2)"
if [[ $via == sacct ]]; then
  note "per-task times from Slurm's accounting (sacct):"
  until_ok 10 bash -c "[[ \$(sacct -n -X -j $job2 -o State) == *COMPLETED* ]]" || true
  sacct -j "$job,$job2" -o JobID,State,ExitCode,ElapsedRaw,TotalCPU,MaxRSS,Start,End
fi
note "total $((SECONDS - t0)) s; $([[ $failed == 0 ]] && echo "all checks ok" || echo "FAILED")"
exit "$failed"

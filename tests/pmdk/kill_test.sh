#!/usr/bin/env bash
# pmirror-run under kill -9 (docs/pmdk.md, section 4): the libpmemobj
# example runs a long stream of transactions under pmirror-run and is
# killed with SIGKILL at a random moment, KILLS times over the same pool.
# After each kill, a copy of the replica's file passes `pmempool check`,
# and libpmemobj opens it and finds every transaction the program had
# logged as committed and no torn one (the checker's checksum and slots).
# Each next run opens the pool the killed one left (libpmemobj recovers
# it, libpmirror resyncs what its activity log names) and goes on.
#
# usage: kill_test.sh PMIRROR_RUN PMIRRORD PROGRAM [KILLS (default 20)] [VOLUME_SIZE]
# PROGRAM: pmemobj-counters, pmemlog-records or pmemblk-records.
set -uo pipefail
run=$1 pmirrord=$2 counters=$3 kills=${4:-20} size=${5:-16MiB}
command -v pmempool >/dev/null || { echo "SKIP: pmempool (pmdk-tools) is not installed" >&2; exit 77; }

# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
work=$(mktemp -d /tmp/pmirror-kill-test.XXXXXX)
program_pid=
cleanup() {
  [[ -n $program_pid ]] && kill -9 "$program_pid" 2>/dev/null
  pmdk_stop_daemon
  rm -rf "$work"
}
trap cleanup EXIT
pmdk_cluster "$work" "$size" "$work/pool"
export PMIRROR_RUNTIME_DIR=$work
pmdk_start_daemon "$pmirrord" "$work" || exit 1

logged() { [[ -f $work/log ]] && awk '/^committed /{k=$2} END{print k+0}' "$work/log" || echo 0; }
for round in $(seq "$kills"); do
  before=$(logged)
  "$run" --config "$work/cluster.yaml" --volume v --node app -- \
    "$counters" run "$work/pool" "$work/log" 1000000 >"$work/run.out" 2>&1 &
  program_pid=$!
  # A random moment once it writes: between 0.2 and 1.5 s of transactions.
  for _ in $(seq 300); do
    (($(logged) > before)) && break
    kill -0 "$program_pid" 2>/dev/null || break
    sleep 0.02
  done
  sleep "0.$((2 + RANDOM % 13))"
  kill -9 "$program_pid" 2>/dev/null
  wait "$program_pid" 2>/dev/null
  program_pid=
  after=$(logged)
  ((after > before)) || { cat "$work/run.out"; fail "round $round: no transaction committed"; continue; }
  cp --sparse=always "$work/replica.img" "$work/replica-copy"
  if ! out=$(pmempool check "$work/replica-copy" 2>&1); then
    fail "round $round: pmempool check of the replica: $out"
    continue
  fi
  if ! out=$("$counters" check "$work/replica-copy" "$work/log" 2>&1); then
    fail "round $round: $out"
    continue
  fi
  echo "round $round: killed after transaction $after (this run: $((after - before))); replica: $out"
done

if ((failures)); then
  echo "--- pmirrord.log"; tail -30 "$work/pmirrord.log"
  echo "$failures failure(s)" >&2
  exit 1
fi
echo OK

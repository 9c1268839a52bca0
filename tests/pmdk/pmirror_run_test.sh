#!/usr/bin/env bash
# pmirror-run over tcp on this machine (docs/pmdk.md): a libpmemobj program
# built with no reference to pmirror (examples/02-pmemobj-counters) runs
# under pmirror-run against a pmirrord; after it exits, a copy of the
# replica's file passes `pmempool check` and libpmemobj opens it and finds
# every transaction the program logged as committed. Then: a second run
# goes on from there, the plain program is untouched by pmirror, and
# pmirror-run refuses what it cannot mirror (a pool of the wrong size, no
# replica reachable) before the program writes anything unmirrored.
#
# The copies are equal once the program has closed its pool (pmirror-run
# mirrors what the pool library wrote without persisting it: docs/pmdk.md),
# as `pmirrorctl verify` says, and a replica changed behind its pmirrord's
# back is still reported as differing.
#
# usage: pmirror_run_test.sh PMIRROR_RUN PMIRRORD PROGRAM [VOLUME_SIZE]
# PROGRAM: examples/02-pmemobj-counters, or 03-pmemlog-pmemblk's
# pmemlog-records or pmemblk-records (the same `run` and `check`).
# Environment (the lab, scripts/lab/tests/guest-data-path.sh):
# PMIRROR_TEST_TRANSPORT (tcp), PMIRROR_TEST_ADDRESS (127.0.0.1), and
# PMIRROR_TEST_FSDAX_DIR: where the program's pool goes (a DAX file
# system: libpmem then flushes CPU caches instead of calling msync).
set -uo pipefail
run=$1 pmirrord=$2 counters=$3 size=${4:-16MiB}
pmirrorctl=$(dirname "$pmirrord")/pmirrorctl
transport=${PMIRROR_TEST_TRANSPORT:-tcp}
address=${PMIRROR_TEST_ADDRESS:-127.0.0.1}
command -v pmempool >/dev/null || { echo "SKIP: pmempool (pmdk-tools) is not installed" >&2; exit 77; }

# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
work=$(mktemp -d /tmp/pmirror-run-test.XXXXXX)
pool_dir=$work
[[ -n ${PMIRROR_TEST_FSDAX_DIR:-} ]] && pool_dir=$(mktemp -d "$PMIRROR_TEST_FSDAX_DIR/pmirror-run-test.XXXXXX")
cleanup() {
  pmdk_stop_daemon
  release_volume
  rm -rf "$work"
  if [[ $pool_dir != "$work" ]]; then rm -rf "$pool_dir"; fi
}
trap cleanup EXIT
pmdk_cluster "$work" "$size" "$pool_dir/pool" "$transport" "$address"
export PMIRROR_RUNTIME_DIR=$work

# The replica as a fresh file (libpmemobj's recovery writes to what it
# opens), checked by pmempool and by the program's own checker.
# $1: the transactions expected; with $2 = at-least, the checker's own rule
# alone (every logged one there, none torn): a program stopped inside a
# commit may leave one more on the replica than it logged.
check_replica() {
  local out
  out=$(pmdk_check_image "$counters" "$work/replica.img" "$work/log") || fail "the replica's pool: $out"
  if [[ ${2:-} != at-least ]]; then
    [[ $out =~ ^(transactions|records)\ $1\  ]] || fail "the replica holds '$out', expected $1"
  fi
  echo "replica: $out"
}

pmdk_start_daemon "$pmirrord" "$work" || exit 1
echo "== 300 transactions under pmirror-run (the pool is created on the volume's zero-filled copy)"
"$run" --config "$work/cluster.yaml" --volume v --node app -- \
  "$counters" run "$pool_dir/pool" "$work/log" 300 >"$work/run1.out" 2>&1 ||
  { cat "$work/run1.out"; fail "the first run under pmirror-run"; }
check_replica 300

echo "== 200 more: the program opens its pool again, mirrored from where it was"
"$run" --config "$work/cluster.yaml" --volume v --node app -- \
  "$counters" run "$pool_dir/pool" "$work/log" 200 >"$work/run2.out" 2>&1 ||
  { cat "$work/run2.out"; fail "the second run under pmirror-run"; }
check_replica 500
grep -Eq '^(transactions|records) 500$' "$work/run2.out" || fail "the program counted $(cat "$work/run2.out")"

# The volume held open by a process of pmirror-run's (a shell: no pool
# mapped, nothing written) for pmirrorctl to ask, as it asks a running
# program.
holder=
hold_volume() {
  rm -f "$work/held" "$work/release"
  # shellcheck disable=SC2016 # expanded by that shell
  "$run" --config "$work/cluster.yaml" --volume v --node app -- \
    sh -c 'touch "$1"; while [ ! -e "$2" ]; do sleep 0.05; done' sh "$work/held" "$work/release" \
    >>"$work/holder.out" 2>&1 &
  holder=$!
  while [[ ! -e $work/held ]] && kill -0 "$holder" 2>/dev/null; do sleep 0.05; done
  [[ -e $work/held ]] || { cat "$work/holder.out"; fail "pmirror-run did not open the volume"; }
}
release_volume() {
  [[ -n $holder ]] || return 0
  touch "$work/release"
  wait "$holder" || fail "the process holding the volume open: exit $?"
  holder=
}
verify() { "$pmirrorctl" --runtime-dir "$work" verify v "$@" 2>&1; }

# An endless stream of transactions under pmirror-run, in the background
# (its pid in `program`), once 20 more are logged. $1, $2: stdout, stderr.
program=
stream_under_pmirror_run() {
  "$run" --config "$work/cluster.yaml" --volume v --node app -- \
    "$counters" run "$pool_dir/pool" "$work/log" 1000000 >"$1" 2>"$2" &
  program=$!
  local before
  before=$(grep -c . "$work/log")
  for _ in $(seq 300); do
    (($(grep -c . "$work/log") > before + 20)) && break
    sleep 0.02
  done
}

echo "== while the program has its pool open: what verify lists, it says why"
stream_under_pmirror_run "$work/open.out" "$work/open.err"
out=$(verify)
rc=$?
kill -9 "$program"
wait "$program" 2>/dev/null
echo "$out"
# What the library rewrites at this open with the bytes the last close
# mirrored is equal; this process's pointers differ, in the chunk at 0x0,
# which the transactions keep writing (busy, not listed): the listing may
# be empty. Whatever it lists comes with the reason.
[[ $rc -eq 0 || ($rc -eq 6 && $out == *"note: v is written by a program under pmirror-run (pid "*) ]] ||
  fail "verify while the program has its pool open: exit $rc: $out"
# Killed, it did not settle its close: a run to its end does.
"$run" --config "$work/cluster.yaml" --volume v --node app -- \
  "$counters" run "$pool_dir/pool" "$work/log" 1 >"$work/run-after-kill.out" 2>&1 ||
  { cat "$work/run-after-kill.out"; fail "the run after the kill"; }

echo "== the program has closed its pool: verify finds the copies equal"
# libpmemobj writes about 200 bytes of its pool without persisting them
# (its pool descriptor's run-time part, free chunks' footers): pmirror-run
# mirrors where the copies differ when the program closes its pool.
hold_volume
out=$(verify)
rc=$?
[[ $rc -eq 0 && $out == "v store: equal ("* ]] ||
  fail "verify after the program closed its pool: exit $rc: $out"
echo "$out"
release_volume

echo "== a replica changed behind its pmirrord's back: verify finds it"
pmdk_stop_daemon
printf 'diverged' | dd of="$work/replica.img" bs=1 seek=$((0x500010)) conv=notrunc status=none
pmdk_start_daemon "$pmirrord" "$work" || exit 1
hold_volume
out=$(verify)
rc=$?
[[ $rc -eq 6 && $out == *"store: 1 mismatching range"*"offset 0x500000 length 64.0 KiB"* &&
  $out == *"note: v is written by a program under pmirror-run (pid $holder)"* ]] ||
  fail "verify of a replica changed behind its daemon's back: exit $rc: $out"
echo "$out"
out=$(verify --mark-dirty)
[[ $out == *"1 chunk marked dirty"* ]] || fail "verify --mark-dirty: $out"
# The resync puts the primary's bytes back (the tests below use the replica).
# od reads both files the same way whatever holds them (the pool may be on
# fsdax); compare 64 bytes around the ones dd changed.
bytes_at_0x500000() { od -A n -v -t x1 -j $((0x500000)) -N 64 "$1" | tr -d ' \n'; }
repaired=
for _ in $(seq 600); do
  [[ $(bytes_at_0x500000 "$pool_dir/pool") == "$(bytes_at_0x500000 "$work/replica.img")" ]] &&
    { repaired=yes; break; }
  sleep 0.1
done
[[ -n $repaired ]] || {
  echo "primary: $(bytes_at_0x500000 "$pool_dir/pool")"
  echo "replica: $(bytes_at_0x500000 "$work/replica.img")"
  echo "--- the holder's log"; cat "$work/holder.out"; echo "--- pmirrord.log"; tail -30 "$work/pmirrord.log"
  "$pmirrorctl" --runtime-dir "$work" status 2>&1
  fail "the resync did not repair the replica"
}
release_volume

echo "== the same program, plain: pmirror is not involved"
"$counters" run "$work/plain.pool" "$work/plain.log" 50 >/dev/null ||
  fail "the plain run"
"$counters" check "$work/plain.pool" "$work/plain.log" >/dev/null || fail "the plain pool"

echo "== refused before the program runs"
truncate -s 8M "$work/small.pool"
sed "s|$pool_dir/pool|$work/small.pool|" "$work/cluster.yaml" >"$work/small.yaml"
out=$("$run" --config "$work/small.yaml" --volume v --node app -- "$counters" run \
  "$work/small.pool" "$work/small.log" 1 2>&1)
rc=$?
[[ $rc -eq 78 && $out == *"is 8388608 bytes, the volume "* ]] ||
  fail "a pool of the wrong size: exit $rc: $out"
[[ ! -e $work/small.log ]] || fail "the program ran on a pool of the wrong size"
pmdk_stop_daemon
out=$("$run" --config "$work/cluster.yaml" --volume v --node app -- "$counters" run \
  "$pool_dir/pool" "$work/log2" 1 2>&1)
rc=$?
[[ $rc -eq 70 && $out == *"cannot mirror volume 'v'"* ]] ||
  fail "no replica reachable: exit $rc: $out"
[[ ! -e $work/log2 ]] || fail "the program ran with no replica to mirror to"

echo "== the replica dies mid-stream (on_insufficient: fail): the program stops, nothing it saw durable is lost"
pmdk_start_daemon "$pmirrord" "$work" || exit 1
stream_under_pmirror_run "$work/run3.out" "$work/run3.err"
kill -9 "$daemon_pid"
pmdk_wait_bounded "$daemon_pid" 60 "pmirrord, after kill -9"
daemon_pid=
pmdk_wait_bounded "$program" 180 "the program, after its replica died"
rc=$?
# abort(3): killed by SIGABRT (128 + 6), with the reason on stderr.
[[ $rc -eq 134 ]] || fail "the program went on without its replica: exit $rc"
grep -q "volume 'v': a persist could not be mirrored" "$work/run3.err" ||
  fail "the program did not say why it stopped: $(tail -3 "$work/run3.err")"
last=$(awk '/^committed /{k=$2} END{print k+0}' "$work/log")
check_replica "$last" at-least

if ((failures)); then
  echo "--- pmirrord.log"; tail -30 "$work/pmirrord.log"
  echo "$failures failure(s)" >&2
  exit 1
fi
echo OK

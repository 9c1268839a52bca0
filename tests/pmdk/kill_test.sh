#!/usr/bin/env bash
# pmirror-run under kill -9 (docs/pmdk.md, "Crash tests"): a PMDK program
# runs an endless stream of transactions (appends, block writes) under
# pmirror-run, mirrored to REPLICAS replicas (each a pmirrord of its own),
# and is killed with SIGKILL at a random moment, KILLS times over the same
# pool. After each kill, once every replica's pmirrord has ended the
# session, a copy of each replica's file
#   - passes `pmempool check`,
#   - and the program's checker: every transaction the program had logged
#     (its log line is written after the commit: the commit made visible
#     outside the process) is there, none torn; for pmemobj-two-counters,
#     the two counters are equal;
#   - and holds no transaction past the one after the last logged -- or,
#     when the run logged nothing new, past the one after what the
#     primary's copy held when the run started (the run resumed from there,
#     and the transaction it made durable before its kill may be that one's
#     successor).
# A replica that the kill left inconsistent (a resync into it was under way:
# pmirrord says so, and such a copy is never promoted) is not checked that
# round; the rounds after it bring it back. Each next run opens the pool the
# killed one left (libpmemobj recovers it, libpmirror resyncs what its
# activity log names). Last, a run to its end: every replica is consistent
# and holds exactly what it logged.
#
# Kill moments: a quarter of the rounds at 0-1 s after pmirror-run starts
# (most fall in its start-up: the handshake, the resync of what the last
# kill left, the pool's recovery), the others at 0-1 s after the run's
# first commit (among the transactions); round 1 always the latter (the
# pool must exist). In half the rounds one replica's pmirrord is
# stopped (SIGSTOP) for the last 50-500 ms before the kill and continued
# after it: what the program sent meanwhile is still in its socket when it
# dies, so a transaction it made visible before that replica acknowledged
# it is missing there (over loopback tcp, whatever was sent arrives
# otherwise). Each round's line says when it was killed and how many
# transactions that run had logged.
#
# usage: kill_test.sh PMIRROR_RUN PMIRRORD PROGRAM [KILLS (default 50)] [VOLUME_SIZE (16MiB)]
# PROGRAM: pmemobj-counters, pmemobj-two-counters, pmemlog-records or
# pmemblk-records (the same `run` and `check` commands).
# Environment:
#   PMIRROR_TEST_DURABILITY  observed or drain: pmirror-run --durability
#                            (unset: pmirror-run's default); a list
#                            ("observed drain"): the rounds take them in turn
#   PMIRROR_TEST_SEED        the kill moments' seed, printed at the start:
#                            the same seed replays the same moments
#   PMIRROR_TEST_REPLICAS    how many replicas (default 2)
#   PMIRROR_TEST_TRANSPORT (tcp), PMIRROR_TEST_ADDRESS (127.0.0.1): as for
#                            pmirror_run_test.sh
set -uo pipefail
run=$1 pmirrord=$2 program=$3 kills=${4:-50} size=${5:-16MiB}
pmirrorctl=$(dirname "$pmirrord")/pmirrorctl
replicas=${PMIRROR_TEST_REPLICAS:-2}
command -v pmempool >/dev/null || { echo "SKIP: pmempool (pmdk-tools) is not installed" >&2; exit 77; }
command -v jq >/dev/null || { echo "SKIP: jq is not installed" >&2; exit 77; }

# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck disable=SC2206 # a list of words
modes=(${PMIRROR_TEST_DURABILITY:-})
((${#modes[@]})) || modes=("")
for mode in "${modes[@]}"; do pmdk_durability "$mode" || exit 2; done
work=$(mktemp -d /tmp/pmirror-kill-test.XXXXXX)
program_pid=
cleanup() {
  [[ -n $program_pid ]] && kill -9 "$program_pid" 2>/dev/null
  pmdk_stop_daemons
  rm -rf "$work"
}
trap cleanup EXIT
pmdk_cluster "$work" "$size" "$work/pool" "${PMIRROR_TEST_TRANSPORT:-tcp}" \
  "${PMIRROR_TEST_ADDRESS:-127.0.0.1}" "$replicas"
export PMIRROR_RUNTIME_DIR=$work
for node in "${pmdk_replicas[@]}"; do pmdk_start_daemon "$pmirrord" "$work" "$node" || exit 1; done

seed=${PMIRROR_TEST_SEED:-$(($(od -An -N4 -tu4 /dev/urandom) % 1000000))}
RANDOM=$seed
echo "$(basename "$program"): $kills kills, durability ${PMIRROR_TEST_DURABILITY:-default}," \
  "${#pmdk_replicas[@]} replica(s), seed $seed (PMIRROR_TEST_SEED=$seed replays these moments)"

logged() { [[ -f $work/log ]] && awk '/^committed /{k=$2} END{print k+0}' "$work/log" || echo 0; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
sleep_ms() { sleep "$(($1 / 1000)).$(printf %03d $(($1 % 1000)))"; }
start_program() {
  "$run" --config "$work/cluster.yaml" --volume v --node app "${pmdk_run_options[@]}" -- \
    "$program" run "$work/pool" "$work/log" "$1" >"$work/run.out" 2>&1 &
  program_pid=$!
}

# The replica's view of the volume, from its pmirrord.
replica_status() { "$pmirrorctl" --socket "$(pmdk_replica_socket "$work" "$1")" status v --json 2>/dev/null; }
# Waits until NODE's pmirrord has ended the program's session: what it
# received is applied, the file no longer changes.
settled() {
  for _ in $(seq 400); do
    replica_status "$1" | jq -e '[.processes[].volumes[].peers[] | select(.ended | not)] | length == 0' \
      >/dev/null && return 0
    sleep 0.025
  done
  return 1
}
consistent() { replica_status "$1" | jq -e '.processes[].volumes[].copy.consistent' >/dev/null; }

# Checks every replica against the log, a line each; $1: the round's name,
# $2: "exact" when the program ended by itself (the replicas hold what it
# logged, no more).
skipped=0
check_replicas() {
  local round=$1 expect=${2:-} node out last logged_k bound
  logged_k=$(logged)
  bound=$(((logged_k > resumed ? logged_k : resumed) + 1))
  for node in "${pmdk_replicas[@]}"; do
    if ! settled "$node"; then
      fail "$round: $node's pmirrord did not end the session in 10 s: $(replica_status "$node")"
      continue
    fi
    if ! consistent "$node"; then
      if [[ $expect == exact ]]; then
        fail "$round: $node's copy is inconsistent after the program's end"
      else
        echo "  $node: inconsistent (a resync into it was under way), not checked"
        skipped=$((skipped + 1))
      fi
      continue
    fi
    if ! out=$(pmdk_check_image "$program" "$(pmdk_replica_image "$work" "$node")" "$work/log"); then
      if ! out=$(like_the_primary "$(pmdk_replica_image "$work" "$node")" "$out"); then
        fail "$round: $node: $out"
        continue
      fi
      as_the_primary=$((as_the_primary + 1))
    fi
    last=$(awk '{print $2}' <<<"$out")
    if [[ $expect == exact ]] && ((last != logged_k)); then
      fail "$round: $node holds $last, the program logged $logged_k and ended"
    elif ((last > bound)); then
      fail "$round: $node holds $last, past $bound (the one after the last logged, $logged_k," \
        "or after the $resumed the primary's copy held when the run started)"
    fi
    echo "  $node: $out"
  done
}

# What `pmempool check -v` finds wrong with a copy of IMAGE, numbers
# left out (one complaint a line; empty: consistent).
pmempool_complaints() {
  local copy=$1.complaints
  cp --sparse=always "$1" "$copy"
  pmempool check -v "$copy" 2>&1 | grep -E 'invalid|unmapped|not consistent' |
    sed -e "s|$copy||" -e 's/[0-9]\+/N/g' | sort -u
  rm -f "$copy"
}

# A replica's copy that `pmempool check` finds not consistent passes when
# the primary's own copy, as the kill left it, draws the same complaints
# and the program's checker finds every logged transaction there. Found
# with libpmemblk: killed in its first few writes to a lane (a pool a few
# ms old), a program not under pmirror leaves a flog entry that pmempool
# calls invalid and a block it calls unmapped, which libpmemblk's own open
# accepts (11 of 40 plain runs of examples/03's pmemblk-records killed 0-5
# ms after their first write; docs/pmdk.md, "Crash tests"). A replica can
# hold no better than the primary did. $1: the image, $2: what
# pmdk_check_image said; prints the checker's line with the reason, or $2.
like_the_primary() {
  local image=$1 said=$2 mine copy=$1.like out
  if [[ -z $primary_complaints || $said != "pmempool check:"* ]]; then
    echo "$said"
    return 1
  fi
  mine=$(pmempool_complaints "$image")
  if [[ $mine != "$primary_complaints" ]]; then
    echo "$said (the primary's own copy: $(tr '\n' ' ' <<<"$primary_complaints"))"
    return 1
  fi
  cp --sparse=always "$image" "$copy"
  if ! out=$("$program" check "$copy" "$work/log" 2>&1); then
    rm -f "$copy"
    echo "$said; and the checker: $out" | tr '\n' ' '
    return 1
  fi
  rm -f "$copy"
  echo "$out; pmempool check: not consistent, as the primary's own copy at the kill"
}

# Waits until this run logs its first transaction (or ends); $1: the
# last one logged before it.
wait_first_commit() {
  for _ in $(seq 1500); do
    (($(logged) > $1)) && return 0
    kill -0 "$program_pid" 2>/dev/null || return 1
    sleep 0.02
  done
}

# What the primary's copy holds (the count its checker prints), 0 before
# the pool exists or where it cannot say: the point a run resumes from.
primary_holds() {
  local out
  [[ -f $work/pool ]] || { echo 0; return; }
  out=$(pmdk_check_image "$program" "$work/pool" "$work/log") || { echo 0; return; }
  awk '{print $2 + 0}' <<<"$out"
}

started=$SECONDS
resumed=0
primary_complaints=""
as_the_primary=0
for round in $(seq "$kills"); do
  mode=${modes[(round - 1) % ${#modes[@]}]}
  pmdk_durability "$mode"
  before=$(logged)
  resumed=$(primary_holds)
  t0=$(now_ms)
  start_program 1000000
  delay=$((RANDOM % 1000))
  if ((round > 1 && RANDOM % 4 == 0)); then
    moment="$delay ms after the start"
  else
    wait_first_commit "$before"
    moment="$delay ms after the first commit"
  fi
  # Half the rounds: one replica's pmirrord stopped (SIGSTOP) for the last
  # 50-500 ms before the kill, continued after it: what the program sends
  # meanwhile waits in its socket, and a program that made a transaction
  # visible before the replica had it loses it with the kill.
  stall=0 stalled=
  if ((RANDOM % 2 == 0)); then
    stall=$((50 + RANDOM % 450))
    ((stall > delay)) && stall=$delay
    stalled=${pmdk_replicas[RANDOM % ${#pmdk_replicas[@]}]}
  fi
  sleep_ms $((delay - stall))
  if [[ -n $stalled ]]; then
    kill -STOP "${pmdk_daemon_pids[$stalled]}"
    sleep_ms "$stall"
    moment+=", $stalled stopped for the last $stall ms"
  fi
  if ! kill -0 "$program_pid" 2>/dev/null; then
    wait "$program_pid"
    status=$?
    program_pid=
    [[ -n $stalled ]] && kill -CONT "${pmdk_daemon_pids[$stalled]}"
    cat "$work/run.out"
    fail "round $round: the program ended by itself (exit $status) before its kill"
    break
  fi
  kill -9 "$program_pid"
  [[ -n $stalled ]] && kill -CONT "${pmdk_daemon_pids[$stalled]}"
  wait "$program_pid" 2>/dev/null
  program_pid=
  after=$(logged)
  echo "round $round${mode:+ ($mode)}: killed $moment ($(($(now_ms) - t0)) ms after the start)," \
    "last logged $after ($((after - before)) this run)"
  primary_complaints=$(pmempool_complaints "$work/pool")
  check_replicas "round $round"
done

echo "== a run to its end: the replicas hold exactly what it logged"
mode=${modes[kills % ${#modes[@]}]}
pmdk_durability "$mode"
before=$(logged)
start_program 20
wait "$program_pid" || { cat "$work/run.out"; fail "the last run (20 transactions) failed"; }
program_pid=
echo "last run${mode:+ ($mode)}: logged $before to $(logged)"
primary_complaints=""  # a program that ended by itself leaves a consistent pool
check_replicas "the last run" exact
echo "$kills kills in $((SECONDS - started)) s; $skipped replica check(s) skipped (inconsistent: a resync under way);" \
  "$as_the_primary passed with the same pmempool complaints as the primary's own copy"

if ((failures)); then
  for node in "${pmdk_replicas[@]}"; do
    echo "--- $(pmdk_replica_log "$work" "$node")"
    tail -30 "$(pmdk_replica_log "$work" "$node")"
  done
  echo "$failures failure(s); replay with PMIRROR_TEST_SEED=$seed" >&2
  exit 1
fi
echo OK

#!/usr/bin/env bash
# How long an automatic failover takes (docs/failover.md, sections 2 and 7):
# runs FailoverTest.KilledPrimaryIsReplacedAndItsAcknowledgedRecordsSurvive
# N times (default 10) -- a 3-member etcd, three nodes with pmirrord and
# pmirror-promoter on loopback, kill -9 of the primary's application and
# promoter -- and prints, from the kill to the first record the new
# primary's application acknowledged, every run's time, the median and the
# maximum, beside the lease's ttl and the load average. With --freeze,
# FailoverTest.FrozenPrimaryIsFencedAndComesBackAsAReplica instead: the
# primary's whole node (application, promoter, pmirrord) SIGSTOPped, timed
# from the freeze. With --app, FailoverTest.AnApplicationThatEndsGivesItsVolumeUp:
# only the primary's application is killed; its promoter gives the volume
# up at once (docs/failover.md, "The application").
#   scripts/failover-takeover.sh [--freeze | --app] [RUNS] [BUILD_DIR]
# With PMIRROR_FAILOVER_TRACE=1 the test also prints the kill's (or freeze's) time and
# every node's pmirrord, promoter and application log: where the time went.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
test=FailoverTest.KilledPrimaryIsReplacedAndItsAcknowledgedRecordsSurvive
event="kill"
if [[ ${1:-} == --freeze ]]; then
  test=FailoverTest.FrozenPrimaryIsFencedAndComesBackAsAReplica
  event=freeze
  shift
elif [[ ${1:-} == --app ]]; then
  test=FailoverTest.AnApplicationThatEndsGivesItsVolumeUp
  event="application's kill"
  shift
fi
runs=${1:-10}
build=${2:-$repo/build}
test_binary=$build/tests/integration/failover_test
[[ -x $test_binary ]] || {
  echo "no $test_binary: run scripts/build.sh first" >&2
  exit 1
}
times=()
ttl=""
for ((i = 1; i <= runs; i++)); do
  out=$("$test_binary" --gtest_filter="$test" 2>&1) || {
    echo "$out" | tail -40 >&2
    echo "run $i failed" >&2
    exit 1
  }
  line=$(grep -o "\[failover\] node [a-z]* serves [0-9]* ms after the $event (ttl [0-9]* ms)" <<<"$out")
  ms=$(awk '{print $5}' <<<"$line")
  ttl=$(grep -o 'ttl [0-9]*' <<<"$line" | awk '{print $2}')
  times+=("$ms")
  echo "run $i: $line"
  [[ -z ${PMIRROR_FAILOVER_TRACE:-} ]] || sed -n '/\[failover\] \(killed\|frozen\) at/,/^\[----------\]/p' <<<"$out"
done
sorted=$(printf '%s\n' "${times[@]}" | sort -n)
median=$(awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : int((a[NR/2]+a[NR/2+1])/2)}' <<<"$sorted")
max=$(tail -1 <<<"$sorted")
echo "takeover after the $event over $runs runs: p50 ${median} ms, max ${max} ms (ttl ${ttl} ms; goal ttl + 2000 ms)"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"

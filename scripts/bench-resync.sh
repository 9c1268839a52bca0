#!/usr/bin/env bash
# Resync benchmark over tcp on this machine: R rounds of
#   pmirror-bench --scenario resync --spawn-targets 1 (pmirrord on loopback)
# with the volume files in /dev/shm: per resync rate (unlimited, 200 MiB/s)
# a full resync's throughput alone and under load, and the p50/p99/p99.9 of
# depth-1 4 KiB persists with and without a resync running. Prints the
# median over rounds (bench/resync_summary.py). docs/benchmarks.md
# ("Resync") explains the method and shows results.
#
#   scripts/bench-resync.sh                        3 rounds, 1 GiB volume
#   scripts/bench-resync.sh --resync-step 128KiB   extra arguments go to every round
#
# Environment:
#   PMIRROR_BUILD_DIR          build folder (default build/); nothing is built
#                              unless PMIRROR_BUILD=1 (then scripts/build.sh)
#   PMIRROR_BENCH_OUT          results folder (default bench/results/<date>-<host>-resync)
#   PMIRROR_BENCH_DIR          volume folder (default /dev/shm; needs 2x the size free)
#   PMIRROR_BENCH_ROUNDS       rounds (default 3)
#   PMIRROR_BENCH_SIZE         volume size (default 1GiB)
#   PMIRROR_BENCH_RATES        resync rates (default unlimited,200MiB/s)
#   PMIRROR_BENCH_ITERS        baseline persists per rate (default 20000, ~2 s: about
#                              as long as the unlimited resync runs under load)
#   PMIRROR_BENCH_TRANSPORT    tcp (default) or rdma; rdma needs PMIRROR_BENCH_ADDRESS
#   PMIRROR_BENCH_ADDRESS      address the target listens on (default 127.0.0.1)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${PMIRROR_BUILD_DIR:-$repo/build}
[[ ${PMIRROR_BUILD:-0} == 1 ]] && "$repo/scripts/build.sh"
bench="$bin/bench/pmirror-bench"
daemon="$bin/daemon/pmirrord"
[[ -x $bench && -x $daemon ]] || { echo "bench-resync.sh: $bench or $daemon missing" >&2; exit 1; }
"$bench" --help | grep -q -- --scenario ||
  { echo "bench-resync.sh: $bench has no --scenario (rebuild)" >&2; exit 1; }

stamp=$(date +%Y%m%d-%H%M%S)-$(hostname -s)
out=${PMIRROR_BENCH_OUT:-$repo/bench/results/$stamp-resync}
dir=${PMIRROR_BENCH_DIR:-/dev/shm}
rounds=${PMIRROR_BENCH_ROUNDS:-3}
size=${PMIRROR_BENCH_SIZE:-1GiB}
rates=${PMIRROR_BENCH_RATES:-unlimited,200MiB/s}
iters=${PMIRROR_BENCH_ITERS:-20000}
# Defaults the extra arguments may override (CLI11 refuses a single-value
# option given twice, and appends to a list option).
given() {
  local name=$1 arg
  shift
  for arg in "$@"; do [[ $arg == "$name" || $arg == "$name="* ]] && return 0; done
  return 1
}
defaults=()
given --size "$@" || defaults+=(--size "$size")
given --resync-rates "$@" || defaults+=(--resync-rates "$rates")
given --iterations "$@" || defaults+=(--iterations "$iters")
transport=${PMIRROR_BENCH_TRANSPORT:-tcp}
address=${PMIRROR_BENCH_ADDRESS:-127.0.0.1}
mkdir -p "$out"

{
  echo "nproc:   $(nproc)"
  echo "kernel:  $(uname -srm)"
  echo "cpu:     $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "memory:  $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min, before)"
  echo "commit:  $(git -C "$repo" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "build:   $bin ($(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$bin/CMakeCache.txt" 2>/dev/null))"
} | tee "$out/machine.txt"

jsons=()
for round in $(seq 1 "$rounds"); do
  args=(--scenario resync --spawn-targets 1 --pmirrord "$daemon" --transport "$transport"
        --address "$address" --dir "$dir" "${defaults[@]}" --json "$out/round$round.json" "$@")
  echo
  echo "== round $round/$rounds: pmirror-bench ${args[*]}"
  "$bench" "${args[@]}" | tee "$out/round$round.txt"
  jsons+=("$out/round$round.json")
done
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (after)" | tee -a "$out/machine.txt"
echo
python3 "$repo/bench/resync_summary.py" "$out" "${jsons[@]}"
echo "results in $out"

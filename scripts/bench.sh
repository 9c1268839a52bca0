#!/usr/bin/env bash
# Builds pmirror and runs pmirror-bench's full matrix in spawn mode: two
# pmirrord on loopback (tcp), volumes as files in /dev/shm, record sizes
# 64 B..64 KiB, 1 and 2 replicas, 1/4/16/32 persists in flight, each size
# next to a plain TCP ping-pong. Then a smaller set (depth 1) with the
# volumes on disk (/tmp) to show what msync costs there.
# docs/benchmarks.md explains the method and shows results.
#
#   scripts/bench.sh                  both sets; results in bench/results/
#   scripts/bench.sh --sizes 4KiB     extra arguments go to the main set
#
# Environment:
#   PMIRROR_BUILD_DIR       build folder (default build/)
#   PMIRROR_BENCH_OUT       results folder (default bench/results/), "-" for stdout only
#   PMIRROR_BENCH_DIR       volume folder of the main set (default /dev/shm)
#   PMIRROR_BENCH_DISK_DIR  volume folder of the disk set (default /tmp), "" skips it
#   PMIRROR_BENCH_TRANSPORT tcp (default) or rdma; rdma needs PMIRROR_BENCH_ADDRESS
#   PMIRROR_BENCH_ADDRESS   address the targets listen on (default 127.0.0.1)
#   PMIRROR_SKIP_BUILD=1    use the existing build
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${PMIRROR_BUILD_DIR:-$repo/build}
[[ ${PMIRROR_SKIP_BUILD:-0} == 1 ]] || "$repo/scripts/build.sh"
bench="$bin/bench/pmirror-bench"
daemon="$bin/daemon/pmirrord"
[[ -x $bench && -x $daemon ]] || { echo "bench.sh: $bench or $daemon missing" >&2; exit 1; }

out=${PMIRROR_BENCH_OUT:-$repo/bench/results}
shm_dir=${PMIRROR_BENCH_DIR:-/dev/shm}
disk_dir=${PMIRROR_BENCH_DISK_DIR-/tmp}
transport=${PMIRROR_BENCH_TRANSPORT:-tcp}
address=${PMIRROR_BENCH_ADDRESS:-127.0.0.1}
stamp=$(date +%Y%m%d-%H%M%S)-$(hostname -s)

echo "== machine"
echo "nproc:   $(nproc)"
echo "kernel:  $(uname -srm)"
echo "cpu:     $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "memory:  $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min; other work skews the tails)"
echo "commit:  $(git -C "$repo" describe --always --dirty 2>/dev/null || echo unknown)"

# run NAME ARGS...: one pmirror-bench run, its table to stdout and, unless
# PMIRROR_BENCH_OUT is "-", to NAME.txt and NAME.json in the results folder.
run() {
  local name=$1
  shift
  local args=(--spawn-targets 2 --pmirrord "$daemon" --transport "$transport"
              --address "$address" "$@")
  echo
  echo "== $name: pmirror-bench ${args[*]}"
  if [[ $out == - ]]; then
    "$bench" "${args[@]}"
  else
    mkdir -p "$out"
    "$bench" "${args[@]}" --json "$out/$stamp-$name.json" | tee "$out/$stamp-$name.txt"
  fi
}

run shm --dir "$shm_dir" "$@"
if [[ -n $disk_dir ]]; then
  run disk --dir "$disk_dir" --depths 1 --iterations 1000
fi
[[ $out == - ]] || echo "results in $out/$stamp-*"

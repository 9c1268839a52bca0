#!/usr/bin/env bash
# Runs INSIDE one lab guest (scripts/lab/run.sh --nvdimms 3 --rw OUT_DIR),
# started by `scripts/lab/bench.sh --pmdk`: scripts/bench-pmdk.sh over rdma
# (rxe0), the replica's copies on devdax (the pool's on $PMIRROR_LAB_DAX_DEV,
# the rewritten program's on $PMIRROR_LAB_DAX_DEV2: APM), the primary's pools
# and the logs in the guest's /dev/shm (rxe cannot register fsdax pages, and
# libpmirror registers the local copy as its Writes' source; a file on tmpfs
# registers). Plain, pmirror-run --durability drain, pmirror-run --durability
# observed, the rewritten program and its --shaped control in the same
# rounds; one row per (round, way) into OUT_DIR/rounds.tsv, the script's own
# summary to stdout.
#   guest-pmdk-bench.sh BUILD_DIR OUT_DIR
# Environment (bench.sh passes them on):
#   PMIRROR_LAB_PMDK_ROUNDS  rounds (default 5)
#   PMIRROR_LAB_PMDK_COUNT   transactions per way and round (default 2000)
set -euo pipefail
build=${1:?usage: guest-pmdk-bench.sh BUILD_DIR OUT_DIR}
out=${2:?usage: guest-pmdk-bench.sh BUILD_DIR OUT_DIR}
: "${PMIRROR_LAB_SELF:?not in a lab guest}"
: "${PMIRROR_LAB_DAX_DEV:?run with --nvdimms 3}"
: "${PMIRROR_LAB_DAX_DEV2:?run with --nvdimms 3 (the second devdax: one per volume)}"
rounds=${PMIRROR_LAB_PMDK_ROUNDS:-5}
count=${PMIRROR_LAB_PMDK_COUNT:-2000}
dev=${PMIRROR_LAB_RDMA_DEV:-rxe0}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
ulimit -l unlimited
# pmirrord keeps the metadata of a copy on /dev/dax* in /var/lib/pmirror
# (the guest's tmpfs overlay: fresh every boot); without it the target exits.
mkdir -p /var/lib/pmirror
rm -f /var/lib/pmirror/*.pmirror

{
  echo "guest_kernel=$(uname -r)"
  echo "guest_cmdline=$(cat /proc/cmdline)"
  echo "clocksource=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
  echo "rdma_core=$(dpkg-query -W -f '${Version}' libibverbs1)"
  echo "libpmemobj=$(dpkg-query -W -f '${Version}' libpmemobj1 2>/dev/null || echo '?')"
  echo "rxe_port=$(ibv_devinfo -d "$dev" 2>/dev/null | awk '/state:|active_mtu:/ {printf "%s %s ", $1, $2}')"
  echo "guest_cpus=$(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "guest_mem=$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  echo "dax_devs=$PMIRROR_LAB_DAX_DEV,$PMIRROR_LAB_DAX_DEV2"
  echo "rounds=$rounds count=$count"
} | tee "$out/guest-versions.txt"

printf 'round\tway\ttransactions_per_s\tp50_us\tp99_us\tguest_load1\ttransport\n' > "$out/rounds.tsv"
start=$(date +%s)
PMIRROR_BENCH_PMDK_TRANSPORT=rdma PMIRROR_BENCH_PMDK_ADDRESS=$PMIRROR_LAB_SELF \
  PMIRROR_BENCH_PMDK_DIR=/dev/shm \
  PMIRROR_BENCH_PMDK_REPLICAS="$PMIRROR_LAB_DAX_DEV,$PMIRROR_LAB_DAX_DEV2" \
  PMIRROR_BENCH_PMDK_TSV="$out/rounds.tsv" \
  "$repo/scripts/bench-pmdk.sh" "$rounds" "$count" "$build" | tee "$out/summary.txt"
echo "elapsed_s=$(($(date +%s) - start))" >> "$out/guest-versions.txt"

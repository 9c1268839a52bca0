#!/usr/bin/env bash
# Runs INSIDE one lab guest (scripts/lab/run.sh --nvdimm --rw OUT_DIR), started
# by `scripts/lab/bench.sh --resync`: R rounds, each of
#   ib_write_bw -d rxe0 -x 1 -s 1MiB   (server + client on $PMIRROR_LAB_SELF: the
#                                       raw Write bandwidth a resync step could get)
#   pmirror-bench --scenario resync over rdma, one pmirrord spawned with its
#       volume on devdax (APM): per resync rate a full resync alone and under
#       depth-1 persists, and those persists' latency with and without it
# JSON per round to OUT_DIR/raw/; bench.sh summarizes on the host
# (bench/resync_summary.py).
#   guest-resync-bench.sh BUILD_DIR OUT_DIR
# Environment (bench.sh passes them on):
#   PMIRROR_LAB_RESYNC_ROUNDS  rounds (default 3)
#   PMIRROR_LAB_RESYNC_SIZE    volume size (default 64MiB; the devdax device holds ~500 MiB)
#   PMIRROR_LAB_RESYNC_RATES   resync rates (default unlimited,10MiB/s: rxe under TCG
#                              copies at ~20-40 MiB/s, far below the tcp run's 200MiB/s limit)
#   PMIRROR_LAB_RESYNC_ITERS   baseline persists per rate (default 2000)
#   PMIRROR_LAB_RESYNC_LATENCY_SIZE  persist size (default 4KiB)
set -euo pipefail
build=${1:?usage: guest-resync-bench.sh BUILD_DIR OUT_DIR}
out=${2:?usage: guest-resync-bench.sh BUILD_DIR OUT_DIR}
: "${PMIRROR_LAB_SELF:?not in a lab guest}"
: "${PMIRROR_LAB_DAX_DEV:?run with --nvdimm}"
rounds=${PMIRROR_LAB_RESYNC_ROUNDS:-3}
size=${PMIRROR_LAB_RESYNC_SIZE:-64MiB}
rates=${PMIRROR_LAB_RESYNC_RATES:-unlimited,10MiB/s}
iters=${PMIRROR_LAB_RESYNC_ITERS:-2000}
latency_size=${PMIRROR_LAB_RESYNC_LATENCY_SIZE:-4KiB}
dev=${PMIRROR_LAB_RDMA_DEV:-rxe0}
addr=$PMIRROR_LAB_SELF
bench="$build/bench/pmirror-bench"
daemon="$build/daemon/pmirrord"
ulimit -l unlimited
mkdir -p "$out/raw"
# pmirrord keeps the metadata of a copy on /dev/dax* in /var/lib/pmirror
# (the guest's tmpfs overlay: fresh every boot).
mkdir -p /var/lib/pmirror

{
  echo "guest_kernel=$(uname -r)"
  echo "rdma_core=$(dpkg-query -W -f '${Version}' libibverbs1)"
  echo "perftest=$(dpkg-query -W -f '${Version}' perftest)"
  echo "rxe_port=$(ibv_devinfo -d "$dev" 2>/dev/null | awk '/state:|active_mtu:/ {printf "%s %s ", $1, $2}')"
  echo "guest_cpus=$(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "guest_mem=$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  echo "dax_dev=$PMIRROR_LAB_DAX_DEV ($(cat /sys/bus/dax/devices/"$(basename "$PMIRROR_LAB_DAX_DEV")"/size 2>/dev/null || echo '?') bytes)"
  echo "rounds=$rounds size=$size rates=$rates iters=$iters latency_size=$latency_size"
} | tee "$out/guest-versions.txt"

port=21000
# write_bw ROUND: ib_write_bw of 1 MiB messages, server and client in this
# guest; "round<TAB>MB/sec average" into OUT/bw.tsv.
write_bw() {
  local log="$out/raw/r$1-ib_write_bw" ok=0
  port=$((port + 1))
  timeout 180 ib_write_bw -d "$dev" -x 1 -F -s 1048576 -n 200 -p "$port" > "$log.server" 2>&1 &
  local server=$!
  for _ in $(seq 40); do
    sleep 0.25
    if timeout 180 ib_write_bw -d "$dev" -x 1 -F -s 1048576 -n 200 -p "$port" "$addr" \
        > "$log.client" 2>&1; then
      ok=1
      break
    fi
    grep -q "Couldn't connect\|Unable to open file descriptor for socket connection" "$log.client" ||
      break
  done
  wait "$server" || true
  if [[ $ok != 1 ]]; then
    echo "guest-resync-bench: ib_write_bw failed (not fatal):" >&2
    cat "$log.client" >&2
    return 0
  fi
  # columns: #bytes #iterations BW_peak BW_average MsgRate
  awk -v r="$1" -v OFS='\t' '$1 == 1048576 && NF >= 5 {print r, $4}' "$log.client" >> "$out/bw.tsv"
}

# counters NAME: rxe0's hardware counters (retransmissions, sequence errors,
# RNR, ...) as "name value" lines into OUT/raw/NAME.counters.
counters() {
  local dir
  for dir in /sys/class/infiniband/"$dev"/ports/1/hw_counters /sys/class/infiniband/"$dev"/hw_counters; do
    [[ -d $dir ]] || continue
    for f in "$dir"/*; do echo "$(basename "$f") $(cat "$f" 2>/dev/null)"; done
    break
  done > "$out/raw/$1.counters"
}

# bench ROUND: one pmirror-bench run; 0 if it wrote its JSON.
bench() {
  counters "round$1-before"
  timeout 1200 "$bench" --scenario resync --spawn-targets 1 --pmirrord "$daemon" \
    --transport rdma --address "$addr" --dir /dev/shm --target-volume "$PMIRROR_LAB_DAX_DEV" \
    --size "$size" --resync-rates "$rates" --iterations "$iters" --warmup 200 \
    --latency-size "$latency_size" --connect-timeout 30s --json "$out/raw/round$1.json" 2>&1 |
    tee "$out/raw/round$1.txt"
  counters "round$1-after"
  # what changed during the run
  awk 'NR == FNR {before[$1] = $2; next} $2 != before[$1] {printf "  rxe %s: %s -> %s\n", $1, before[$1], $2}' \
    "$out/raw/round$1-before.counters" "$out/raw/round$1-after.counters" | tee "$out/raw/round$1-counters.txt"
  [[ -s $out/raw/round$1.json ]]
}

start=$(date +%s)
ok=0
for round in $(seq 1 "$rounds"); do
  echo "guest-resync-bench: round $round/$rounds, $(($(date +%s) - start)) s in, guest load $(cut -d' ' -f1-3 /proc/loadavg)"
  write_bw "$round"
  # Each round is a new primary (a fresh local copy) and must meet a new
  # replica: the devdax copy's metadata of the last round would otherwise
  # hold a generation this primary never knew (refused as split brain).
  rm -f /var/lib/pmirror/*.pmirror
  if bench "$round"; then
    ok=$((ok + 1))
  else
    # Under TCG on a loaded host a handshake now and then misses its timeout.
    echo "guest-resync-bench: round $round failed; once more" >&2
    rm -f /var/lib/pmirror/*.pmirror
    mv "$out/raw/round$round.txt" "$out/raw/round$round-failed.txt"
    if bench "$round"; then ok=$((ok + 1)); else echo "guest-resync-bench: round $round failed again" >&2; fi
  fi
done
echo "guest-resync-bench: $ok of $rounds rounds in $(($(date +%s) - start)) s"
echo "elapsed_s=$(($(date +%s) - start))" >> "$out/guest-versions.txt"
((ok > 0))

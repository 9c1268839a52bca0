#!/usr/bin/env bash
# Runs INSIDE one lab guest (scripts/lab/run.sh --nvdimm --rw OUT_DIR), started
# by scripts/lab/bench.sh: R interleaved rounds, each of
#   ib_write_lat  -d rxe0 -x 1 -s SIZE -n N   (server + client on $PMIRROR_LAB_SELF)
#   ib_read_lat   -d rxe0 -x 1 -s SIZE -n N
#   two ib_read_lat pairs at once (the floor for two replicas in parallel)
#   ib_write_bw   -d rxe0 -x 1 -s SIZE -n 4N (the message rate: the bound for
#                 many persists in flight)
#   pmirror-bench over rdma, targets on devdax (APM): depth 1 and one replica
#     (the latency row), two replicas, 16 in flight, 4 writer threads
#   pmirror-bench over rdma, depth 1, one replica, target on a tmpfs file (GPSPM)
#   rpma-write-flush (bench/rpma_write_flush.c): librpma write of SIZE bytes +
#     rpma_flush(RPMA_FLUSH_TYPE_PERSISTENT), server on devdax, tool name
#     librpma-flush (skipped, with a message, where the binary was not built)
# for every SIZE, the order of the steps rotated from round to round. Raw
# outputs go to OUT_DIR/raw/, one line per (round, tool, size) to
# OUT_DIR/rounds.tsv; bench.sh summarizes on the host.
#   guest-bench.sh BUILD_DIR OUT_DIR
# Environment (bench.sh passes them on):
#   PMIRROR_LAB_BENCH_ROUNDS  rounds (default 5)
#   PMIRROR_LAB_BENCH_SIZES   record sizes in bytes, comma-separated (default 64,4096)
#   PMIRROR_LAB_BENCH_ITERS   measured ops per tool, size and round (default 500)
#   PMIRROR_LAB_BENCH_WARMUP  pmirror-bench unmeasured persists per cell, and
#                             rpma-write-flush unmeasured write + flush pairs (default 100)
#   PMIRROR_LAB_BENCH_POLL    pmirror-bench --poll: busy | adaptive | event (default adaptive)
#   PMIRROR_LAB_BENCH_GPSPM   1: also the file target; 0 (default): devdax only
set -euo pipefail
build=${1:?usage: guest-bench.sh BUILD_DIR OUT_DIR}
out=${2:?usage: guest-bench.sh BUILD_DIR OUT_DIR}
: "${PMIRROR_LAB_SELF:?not in a lab guest}"
: "${PMIRROR_LAB_DAX_DEV:?run with --nvdimms 3}"
: "${PMIRROR_LAB_DAX_DEV2:?run with --nvdimms 3 (the second devdax: two APM replicas)}"
rounds=${PMIRROR_LAB_BENCH_ROUNDS:-5}
sizes=${PMIRROR_LAB_BENCH_SIZES:-64,4096}
iters=${PMIRROR_LAB_BENCH_ITERS:-500}
warmup=${PMIRROR_LAB_BENCH_WARMUP:-100}
poll=${PMIRROR_LAB_BENCH_POLL:-adaptive}
gpspm=${PMIRROR_LAB_BENCH_GPSPM:-0}
dev=${PMIRROR_LAB_RDMA_DEV:-rxe0}
addr=$PMIRROR_LAB_SELF
bench="$build/bench/pmirror-bench"
daemon="$build/daemon/pmirrord"
rpma_bin="$build/bench/rpma-write-flush"
ulimit -l unlimited
mkdir -p "$out/raw"
# pmirrord keeps the metadata of a copy on /dev/dax* in /var/lib/pmirror
# (the guest's tmpfs overlay: fresh every boot); without it the target exits.
mkdir -p /var/lib/pmirror
tsv="$out/rounds.tsv"
printf 'round\ttool\tsize\tp50_us\tp99_us\tp999_us\tmin_us\tmax_us\tmethod\tops_per_s\n' > "$tsv"

# ----------------------------------------------------------------- versions
{
  echo "guest_kernel=$(uname -r)"
  echo "guest_uname=$(uname -srvm)"
  echo "rdma_core=$(dpkg-query -W -f '${Version}' libibverbs1) (libibverbs1; ibverbs-providers $(dpkg-query -W -f '${Version}' ibverbs-providers), librdmacm1 $(dpkg-query -W -f '${Version}' librdmacm1))"
  echo "perftest=$(dpkg-query -W -f '${Version}' perftest) ($(ib_write_lat --version 2>&1 | head -n1))"
  if [[ -x $rpma_bin ]]; then
    echo "librpma=$(dpkg-query -W -f '${Version}' librpma0 2>/dev/null || echo '?') ($rpma_bin)"
  else
    echo "librpma=none ($rpma_bin not built)"
  fi
  echo "rxe_port=$(ibv_devinfo -d "$dev" 2>/dev/null | awk '/state:|active_mtu:/ {printf "%s %s ", $1, $2}')"
  echo "guest_cpus=$(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "guest_mem=$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  echo "dax_dev=$PMIRROR_LAB_DAX_DEV ($(cat /sys/bus/dax/devices/"$(basename "$PMIRROR_LAB_DAX_DEV")"/size 2>/dev/null || echo '?') bytes)"
  echo "rounds=$rounds sizes=$sizes iters=$iters warmup=$warmup gpspm=$gpspm poll=$poll"
} | tee "$out/guest-versions.txt"

port=20000
# perftest TOOL SIZE ROUND: server and client in this guest, the client's
# report line (#bytes #iters t_min t_max t_typical t_avg t_stdev p99 p99.9)
# into the TSV. t_typical is perftest's median.
perftest() {
  local tool=$1 size=$2 round=$3 log="$out/raw/r$3-$1-$2"
  # Under TCG on a loaded host perftest's CPU-frequency calibration now and
  # then fails and it reports "inf": run that one once more.
  perftest_once "$@" || return 1
  grep -q '^ *[0-9]\+ \+[0-9]\+ \+inf' "$log.client" || return 0
  echo "guest-bench: $tool -s $size reported inf (perftest calibration), once more" >&2
  sed -i '$d' "$tsv"  # its row, just appended
  perftest_once "$@"
}
perftest_once() {
  local tool=$1 size=$2 round=$3 log="$out/raw/r$3-$1-$2"
  local n=$iters
  [[ $tool == ib_write_bw ]] && n=$((iters * 4))
  port=$((port + 1))
  timeout 120 "$tool" -d "$dev" -x 1 -F -s "$size" -n "$n" -p "$port" > "$log.server" 2>&1 &
  local server=$! ok=0
  for _ in $(seq 40); do
    sleep 0.25
    if timeout 120 "$tool" -d "$dev" -x 1 -F -s "$size" -n "$n" -p "$port" "$addr" \
        > "$log.client" 2>&1; then
      ok=1
      break
    fi
    grep -q "Couldn't connect\|Unable to open file descriptor for socket connection" "$log.client" ||
      break
  done
  wait "$server" || true
  if [[ $ok != 1 ]]; then
    echo "guest-bench: $tool -s $size failed:" >&2
    cat "$log.client" "$log.server" >&2
    return 1
  fi
  if [[ $tool == ib_write_bw ]]; then
    # columns: bytes iters BW_peak BW_average MsgRate(Mpps); the row's p50
    # is the time per message at that rate, its ops_per_s the rate.
    awk -v r="$round" -v s="$size" -v OFS='\t' \
      '$1 == s && NF >= 5 && $2 ~ /^[0-9]+$/ && $5 > 0 {
         print r, "ib_write_bw", s, 1 / $5, "nan", "nan", "nan", "nan", "-", $5 * 1e6; found = 1}
       END {exit !found}' "$log.client" >> "$tsv" ||
      { echo "guest-bench: no report line in $log.client" >&2; cat "$log.client" >&2; return 1; }
    return 0
  fi
  # columns: bytes iters t_min t_max t_typical t_avg t_stdev p99 p99.9
  awk -v r="$round" -v t="$tool" -v s="$size" -v OFS='\t' \
    '$1 == s && NF >= 9 && $2 ~ /^[0-9]+$/ {print r, t, s, $5, $8, $9, $3, $4, "-", "-"; found = 1}
     END {exit !found}' "$log.client" >> "$tsv" ||
    { echo "guest-bench: no report line in $log.client" >&2; cat "$log.client" >&2; return 1; }
}

# read_pair SIZE ROUND: two ib_read_lat pairs at once, the floor of two
# replicas written in parallel on this machine (under TCG the wire is CPU
# work: two round trips at once compete for the same two vCPUs). Row
# ib_read_lat-x2: the slower pair's p50 and p99.
read_pair() {
  local size=$1 round=$2 log="$out/raw/r$2-ib_read_lat-x2-$1" ports=() pids=() i rc=0
  for i in 0 1; do
    port=$((port + 1))
    ports+=("$port")
    timeout 120 ib_read_lat -d "$dev" -x 1 -F -s "$size" -n "$iters" -p "$port" > "$log.server$i" 2>&1 &
  done
  sleep 1
  for i in 0 1; do
    timeout 120 ib_read_lat -d "$dev" -x 1 -F -s "$size" -n "$iters" -p "${ports[$i]}" "$addr" \
      > "$log.client$i" 2>&1 &
    pids+=($!)
  done
  for i in 0 1; do wait "${pids[$i]}" || rc=1; done
  wait || true
  if [[ $rc != 0 ]]; then
    echo "guest-bench: two ib_read_lat at once -s $size failed (not fatal):" >&2
    cat "$log".client* >&2
    return 0
  fi
  cat "$log.client0" "$log.client1" | awk -v r="$round" -v s="$size" -v OFS='\t' \
    '$1 == s && NF >= 9 && $2 ~ /^[0-9]+$/ {n++; if ($5 > p50) p50 = $5; if ($8 > p99) p99 = $8
                                           if ($9 > p999) p999 = $9}
     END {if (n == 2) print r, "ib_read_lat-x2", s, p50, p99, p999, "nan", "nan", "-", "-"; exit n != 2}' \
    >> "$tsv" || echo "guest-bench: two ib_read_lat at once -s $size: no two report lines (not fatal)" >&2
}

# pmirror ROUND KIND: one pmirror-bench run over rdma (all sizes). KIND apm:
# two targets, the first on $PMIRROR_LAB_DAX_DEV and the second on
# $PMIRROR_LAB_DAX_DEV2 (both APM), cells 1 and 2 replicas x depth 1 and 16
# x 1 and 4 writer threads; rows pmirror-apm (depth 1, one replica, one
# writer: the latency row), pmirror-apm-2r (two replicas), pmirror-apm-d16
# (16 persist_async in flight) and pmirror-apm-w4 (4 threads at depth 1),
# each with its persists/s. KIND gpspm: one target on a file in the guest's
# /dev/shm (tmpfs), depth 1, one replica: row pmirror-gpspm.
pmirror() {
  local round=$1 kind=$2 json="$out/raw/r$1-pmirror-$2.json"
  local extra=(--spawn-targets 1 --replicas-list 1 --depths 1 --writers 1)
  if [[ $kind == apm ]]; then
    extra=(--spawn-targets 2 --target-volume "$PMIRROR_LAB_DAX_DEV" --target-volume "$PMIRROR_LAB_DAX_DEV2"
           --replicas-list 1,2 --depths 1,16 --writers 1,4)
  fi
  # A new primary each run: the devdax copy's metadata of the last run would
  # hold a generation it never knew (refused as split brain).
  rm -f /var/lib/pmirror/*.pmirror
  timeout 600 "$bench" "${extra[@]}" --pmirrord "$daemon" --transport rdma --address "$addr" \
    --dir /dev/shm --size 16MiB --sizes "$sizes" \
    --iterations "$iters" --warmup "$warmup" --poll "$poll" --json "$json" \
    > "$out/raw/r$1-pmirror-$2.txt" 2>&1 ||
    { echo "guest-bench: pmirror-bench ($kind) failed:" >&2; cat "$out/raw/r$1-pmirror-$2.txt" >&2; return 1; }
  python3 - "$json" "$round" "pmirror-$kind" >> "$tsv" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
methods = {m["replicas"]: m["method"] for m in doc["setup"]["methods"]}
# (depth, replicas, writers) -> the row's tool name suffix
cells = {(1, 1, 1): "", (1, 2, 1): "-2r", (16, 1, 1): "-d16", (1, 1, 4): "-w4"}
for c in doc["persist"]:
    suffix = cells.get((c["depth"], c["replicas"], c.get("writers", 1)))
    if suffix is None:
        continue
    method = "+".join(methods.get(k, "?") for k in range(1, c["replicas"] + 1))
    print("\t".join(str(x) for x in (sys.argv[2], sys.argv[3] + suffix, c["size"], c["p50_us"], c["p99_us"],
                                      c["p999_us"], c["min_us"], c["max_us"], method,
                                      round(c["persists_per_s"]))))
PY
}

# rpma ROUND SIZE: librpma's write + flush(persistent) to devdax
# (bench/rpma_write_flush.c): server on $PMIRROR_LAB_DAX_DEV and client in
# this guest, like perftest_once; the client's "result ..." line into the
# TSV as tool librpma-flush. pmirror's step uses the same devdax device:
# the steps run one after the other, never at the same time.
rpma() {
  local size=$1 round=$2 log="$out/raw/r$2-librpma-flush-$1"
  port=$((port + 1))
  timeout 120 "$rpma_bin" server "$addr" "$port" "$size" "$iters" "$warmup" "$PMIRROR_LAB_DAX_DEV" \
    > "$log.server" 2>&1 &
  local server=$! ok=0 rc=0 src=0
  for _ in $(seq 40); do
    sleep 0.25
    rc=0
    timeout 120 "$rpma_bin" client "$addr" "$port" "$size" "$iters" "$warmup" > "$log.client" 2>&1 ||
      rc=$?
    if [[ $rc == 0 ]]; then
      ok=1
      break
    fi
    # 2: could not connect (the server is not listening yet): retry while it runs.
    if [[ $rc != 2 ]] || ! kill -0 "$server" 2> /dev/null; then break; fi
  done
  if [[ $ok != 1 ]]; then kill "$server" 2> /dev/null || true; fi
  wait "$server" || src=$?
  if [[ $ok != 1 || $src != 0 ]]; then
    echo "guest-bench: rpma-write-flush -s $size failed (client status $rc, server status $src):" >&2
    cat "$log.client" "$log.server" >&2
    return 1
  fi
  awk -v r="$round" -v s="$size" -v OFS='\t' \
    '$1 == "result" {
       for (i = 2; i <= NF; i++) { k = $i; sub(/=.*/, "", k); v[k] = substr($i, length(k) + 2) }
       if (v["size"] == s) { print r, "librpma-flush", s, v["p50_us"], v["p99_us"], v["p999_us"], v["min_us"], v["max_us"], "apm", "-"; found = 1 }
     }
     END {exit !found}' "$log.client" >> "$tsv" ||
    { echo "guest-bench: no result line in $log.client" >&2; cat "$log.client" >&2; return 1; }
}

# rpma right after apm: in every rotation the two persist paths to devdax
# run close together in time.
steps=(write read read2 bw apm)
if [[ -x $rpma_bin ]]; then
  steps+=(rpma)
else
  echo "guest-bench: $rpma_bin not found: SKIPPING the librpma-flush comparator" \
    "(build it on a host with librpma-dev: cmake --build BUILD --target rpma-write-flush)" >&2
fi
[[ $gpspm == 1 ]] && steps+=(gpspm)
start=$(date +%s)
for round in $(seq 1 "$rounds"); do
  n=${#steps[@]}
  order=()
  for i in $(seq 0 $((n - 1))); do order+=("${steps[$(((i + round - 1) % n))]}"); done
  echo "guest-bench: round $round/$rounds (${order[*]}), $(($(date +%s) - start)) s in, guest load $(cut -d' ' -f1-3 /proc/loadavg)"
  for step in "${order[@]}"; do
    case $step in
      write | read)
        for size in ${sizes//,/ }; do perftest "ib_${step}_lat" "$size" "$round"; done
        ;;
      read2)
        for size in ${sizes//,/ }; do read_pair "$size" "$round"; done
        ;;
      bw)
        for size in ${sizes//,/ }; do perftest ib_write_bw "$size" "$round"; done
        ;;
      apm | gpspm) pmirror "$round" "$step" ;;
      rpma)
        for size in ${sizes//,/ }; do rpma "$size" "$round"; done
        ;;
    esac
  done
done
echo "guest-bench: $rounds rounds in $(($(date +%s) - start)) s"
echo "elapsed_s=$(($(date +%s) - start))" >> "$out/guest-versions.txt"

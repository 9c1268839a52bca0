#!/usr/bin/env bash
# A small libpmemobj transaction (examples/02-pmemobj-counters: the root's
# counters, about 540 bytes, in one transaction) followed by its 1-line log
# write (one write(2) of "committed K" to a log file: the commit made visible
# outside the process), five ways in the same rounds (docs/benchmarks.md,
# "Unmodified PMDK programs" and "issue 25"):
#   plain      the program alone, its pool unmirrored;
#   drain      the same binary under `pmirror-run --durability drain`: every
#              pmem_drain waits for the replica;
#   observed   the same binary under `pmirror-run --durability observed`: a
#              drain is only ordered; the program waits for the replica
#              before its state is seen outside it (here: the log write);
#   rewritten  the same transaction written for libpmirror
#              (bench/pmirror_counters.cpp: one persist, then the same log
#              write), the floor of what a mirrored transaction costs here;
#   shaped     the rewritten program writing what libpmemobj writes for the
#              transaction (`--shaped`: 5 ordered groups, 6 ranges, one
#              persist_ordered_async and one wait), a control: observed /
#              shaped is what pmirror-run costs beyond the shape's Writes.
# One replica: pmirrord on this machine, tcp on loopback by default. Each
# program times every transaction itself, the same way (clock_gettime
# (CLOCK_MONOTONIC) before the transaction and after its log write; p50 and
# p99 by nearest rank) and prints "transactions_per_s=R p50_us=A p99_us=B".
# The order of the five ways changes from round to round (a Williams design:
# over 5 rounds each way runs once in each place, over 10 twice in each place
# and twice right after each other way). Files on /dev/shm
# with PMEM_IS_PMEM_FORCE=1, so that libpmem flushes CPU caches as on pmem
# instead of calling msync (a disk's msync would hide everything else).
# Prints each round (with the load average), then the medians over rounds,
# the medians of same-round ratios observed/rewritten, drain/rewritten and
# observed/shaped (p50 and p99), and the load average.
#   scripts/bench-pmdk.sh [ROUNDS (default 5)] [TRANSACTIONS (default 2000)] [BUILD_DIR]
# Environment (the lab's rdma run, scripts/lab/bench.sh --pmdk, sets them):
#   PMIRROR_BENCH_PMDK_TRANSPORT  tcp (default) | rdma
#   PMIRROR_BENCH_PMDK_ADDRESS    both nodes' address (default 127.0.0.1)
#   PMIRROR_BENCH_PMDK_DIR        where the work folder goes: the primary's pools,
#                                 the logs (default /dev/shm)
#   PMIRROR_BENCH_PMDK_REPLICAS   "POOL_COPY,RAW_COPY": the replica's copies of the
#                                 two volumes (default: files in the work folder;
#                                 the lab: /dev/dax1.0,/dev/dax2.0)
#   PMIRROR_BENCH_PMDK_TSV        also append one row per (round, way) to this file
#   PMIRROR_BENCH_PMDK_KEEP=1     keep the work folder (each way's stderr, pmirrord's log)
#   PMIRROR_BENCH_PMDK_LOG_LEVEL  pmirror-run --log-level (default: its own, warn)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=${1:-5}
count=${2:-2000}
build=${3:-$repo/build}
transport=${PMIRROR_BENCH_PMDK_TRANSPORT:-tcp}
address=${PMIRROR_BENCH_PMDK_ADDRESS:-127.0.0.1}
for b in examples/pmemobj-counters bench/pmirror-counters-bench daemon/pmirror-run daemon/pmirrord \
  lib/preload/libpmirror-preload.so lib/initiator/libpmirror.so.0; do
  [[ -e $build/$b ]] || { echo "no $build/$b: scripts/build.sh first" >&2; exit 1; }
done
"$build/daemon/pmirror-run" --help | grep -q -- --durability ||
  { echo "$build/daemon/pmirror-run has no --durability: rebuild" >&2; exit 1; }
"$build/bench/pmirror-counters-bench" --help | grep -q -- --shaped ||
  { echo "$build/bench/pmirror-counters-bench has no --shaped: rebuild" >&2; exit 1; }

work=$(mktemp -d "${PMIRROR_BENCH_PMDK_DIR:-/dev/shm}/pmirror-bench-pmdk.XXXXXX")
daemon_pid=
cleanup() {
  [[ -n $daemon_pid ]] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  [[ -n ${PMIRROR_BENCH_PMDK_KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
# The binaries run from a copy: a build in the shared build folder during
# the rounds (the lab's guest sees it through 9p) must not change them
# between ways or rounds. libpmirror.so.0 (the rewritten program's and the
# preload library's) from the copy through LD_LIBRARY_PATH, which goes
# before their RUNPATH; pmirror-run takes the copied preload library.
mkdir "$work/bin"
cp -L "$build/examples/pmemobj-counters" "$build/bench/pmirror-counters-bench" \
  "$build/daemon/pmirror-run" "$build/daemon/pmirrord" "$build/lib/preload/libpmirror-preload.so" \
  "$build/lib/initiator/libpmirror.so.0" "$work/bin/"
export LD_LIBRARY_PATH=$work/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PMIRROR_PRELOAD_LIBRARY=$work/bin/libpmirror-preload.so
counters=$work/bin/pmemobj-counters
rewritten=$work/bin/pmirror-counters-bench
run=$work/bin/pmirror-run
pmirrord=$work/bin/pmirrord
if [[ -n ${PMIRROR_BENCH_PMDK_REPLICAS:-} ]]; then
  IFS=, read -r pool_copy raw_copy <<<"$PMIRROR_BENCH_PMDK_REPLICAS"
else
  pool_copy=$work/pool.replica raw_copy=$work/raw.replica
fi
port=$((20000 + RANDOM % 20000))
head -c 32 /dev/urandom | base64 >"$work/secret"
chmod 600 "$work/secret"
cat >"$work/cluster.yaml" <<YAML
daemon:
  control_socket: $work/pmirrord.sock
  state_pool: $work/pmirrord.state
nodes:
  - {name: app, address: $address, port: $((port + 1)), state_pool: $work/app.state, control_socket: $work/app.sock, transport: $transport}
  - {name: store, address: $address, port: $port, transport: $transport}
volumes:
  - name: pool
    size: 16MiB
    primary: app
    replicas: [store]
    paths: {app: $work/pool, store: $pool_copy}
    create: true
    allowed_peers: [app1]
    secret_file: $work/secret
  - name: raw
    size: 16MiB
    primary: app
    replicas: [store]
    paths: {app: $work/raw, store: $raw_copy}
    create: true
    allowed_peers: [app1]
    secret_file: $work/secret
YAML
export PMIRROR_RUNTIME_DIR=$work PMEM_IS_PMEM_FORCE=1
"$pmirrord" --config "$work/cluster.yaml" --node store --foreground >"$work/pmirrord.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do [[ -S $work/pmirrord.sock ]] && break; sleep 0.1; done

# way NAME N: one run of N transactions the way NAME, its result line on
# stdout; its stderr (libpmirror's info lines) in WORK/NAME.err, shown if it
# fails.
way() {
  local log=$work/$1.log status=0
  : >"$log"
  case $1 in
    plain) "$counters" bench "$work/plain.pool" "$2" "$log" ;;
    drain | observed)
      "$run" --config "$work/cluster.yaml" --volume pool --node app --durability "$1" \
        ${PMIRROR_BENCH_PMDK_LOG_LEVEL:+--log-level "$PMIRROR_BENCH_PMDK_LOG_LEVEL"} -- \
        "$counters" bench "$work/pool" "$2" "$log"
      ;;
    rewritten)
      "$rewritten" --config "$work/cluster.yaml" --volume raw --node app --identity app1 \
        --count "$2" --log "$log"
      ;;
    shaped)
      "$rewritten" --config "$work/cluster.yaml" --volume raw --node app --identity app1 \
        --count "$2" --log "$log" --shaped
      ;;
  esac 2>"$work/$1.err" || status=$?
  if [[ $status != 0 ]]; then
    echo "bench-pmdk.sh: $1 failed (status $status):" >&2
    cat "$work/$1.err" "$work/pmirrord.log" >&2
    return "$status"
  fi
}
ways=(plain drain observed rewritten shaped)
latin=("0 1 4 2 3" "1 2 0 3 4" "2 3 1 4 0" "3 4 2 0 1" "4 0 3 1 2"
  "3 2 4 1 0" "4 3 0 2 1" "0 4 1 3 2" "1 0 2 4 3" "2 1 3 0 4")

# Warm-up, not counted: the volumes' first open copies them whole to the
# replica (a new copy), which would weigh on the first round.
for w in "${ways[@]}"; do way "$w" 100 >/dev/null; done

echo "$transport, address $address; replica copies $pool_copy, $raw_copy; $count transactions per way and round, $rounds rounds"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<<"$2"; }
declare -A results
loads=""
for round in $(seq "$rounds"); do
  # The order of round r is row (r-1) mod 10 of the Williams design (a
  # plain rotation would always run observed after drain).
  order=()
  for i in ${latin[$(((round - 1) % 10))]}; do order+=("${ways[$i]}"); done
  declare -A line=()
  building_before=0
  pgrep -x ninja >/dev/null && building_before=1
  for w in "${order[@]}"; do line[$w]=$(way "$w" "$count"); done
  load=$(cut -d' ' -f1 /proc/loadavg)
  loads+="$load "
  build_note=""
  if [[ $building_before == 1 ]] || pgrep -x ninja >/dev/null; then
    build_note=" (a build (ninja) ran during this round)"
  fi
  printf 'round %d (%s), load %s%s:\n' "$round" "${order[*]}" "$load" "$build_note"
  for w in "${ways[@]}"; do
    for f in transactions_per_s p50_us p99_us; do
      results[$w.$f]+="$(field "$f" "${line[$w]}") "
    done
    printf '  %-10s %s\n' "$w" "${line[$w]}"
    if [[ -n ${PMIRROR_BENCH_PMDK_TSV:-} ]]; then
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$w" "$(field transactions_per_s "${line[$w]}")" \
        "$(field p50_us "${line[$w]}")" "$(field p99_us "${line[$w]}")" "$load" "$transport" \
        >>"$PMIRROR_BENCH_PMDK_TSV"
    fi
  done
done

median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
range() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | sed -n '1p;$p' | paste -sd- -; }
echo
echo "medians over $rounds rounds [range of the rounds]:"
printf '%-10s %10s %22s %22s\n' "" "tx/s" "p50 us" "p99 us"
for w in "${ways[@]}"; do
  printf '%-10s %10s %22s %22s\n' "$w" "$(median "${results[$w.transactions_per_s]}")" \
    "$(median "${results[$w.p50_us]}") [$(range "${results[$w.p50_us]}")]" \
    "$(median "${results[$w.p99_us]}") [$(range "${results[$w.p99_us]}")]"
done
# ratio WAY1 WAY2 FIELD: the median of the same-round ratios, and their range.
ratio() {
  local a b out="" i
  read -ra a <<<"${results[$1.$3]}"
  read -ra b <<<"${results[$2.$3]}"
  for i in "${!a[@]}"; do out+="$(awk -v x="${a[$i]}" -v y="${b[$i]}" 'BEGIN{printf "%.2f", x/y}') "; done
  printf '%.2f [rounds: %s]\n' "$(median "$out")" "${out% }"
}
echo
echo "same-round ratios, median over rounds [each round's]:"
for pair in "observed rewritten" "drain rewritten" "observed shaped" "shaped rewritten" \
  "observed drain" "rewritten plain"; do
  read -r a b <<<"$pair"
  for f in p50_us p99_us; do
    printf '  %-9s / %-9s %s: %s\n' "$a" "$b" "${f%_us}" "$(ratio "$a" "$b" "$f")"
  done
done
echo
echo "load average: per round [${loads% }], after: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cpus"

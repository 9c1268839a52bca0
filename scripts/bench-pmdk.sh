#!/usr/bin/env bash
# A small libpmemobj transaction (examples/02-pmemobj-counters: the root's
# counters, about 540 bytes, in one transaction) three ways, in the same
# rounds (docs/benchmarks.md, "Unmodified PMDK programs"):
#   plain      the program alone, its pool unmirrored;
#   pmirror-run  the same binary under pmirror-run: every drain mirrored to
#              one replica (pmirrord on this machine, tcp on loopback);
#   rewritten  the same transaction written for libpmirror
#              (bench/pmirror_counters.cpp: one persist per transaction), the
#              floor of what a mirrored transaction costs here.
# Files on /dev/shm with PMEM_IS_PMEM_FORCE=1, so that libpmem flushes
# CPU caches as on pmem instead of calling msync (a disk's msync would
# hide everything else). Prints each round, then the medians, the ratios
# of same-round medians, and the load average.
#   scripts/bench-pmdk.sh [ROUNDS (default 5)] [TRANSACTIONS (default 2000)] [BUILD_DIR]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=${1:-5}
count=${2:-2000}
build=${3:-$repo/build}
counters=$build/examples/pmemobj-counters
rewritten=$build/bench/pmirror-counters-bench
run=$build/daemon/pmirror-run
pmirrord=$build/daemon/pmirrord
for b in "$counters" "$rewritten" "$run" "$pmirrord"; do
  [[ -x $b ]] || { echo "no $b: scripts/build.sh first" >&2; exit 1; }
done

work=$(mktemp -d /dev/shm/pmirror-bench-pmdk.XXXXXX)
daemon_pid=
cleanup() {
  [[ -n $daemon_pid ]] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
port=$((20000 + RANDOM % 20000))
head -c 32 /dev/urandom | base64 >"$work/secret"
chmod 600 "$work/secret"
cat >"$work/cluster.yaml" <<YAML
daemon:
  control_socket: $work/pmirrord.sock
  state_pool: $work/pmirrord.state
nodes:
  - {name: app, address: 127.0.0.1, port: $((port + 1)), state_pool: $work/app.state, control_socket: $work/app.sock}
  - {name: store, address: 127.0.0.1, port: $port, transport: tcp}
volumes:
  - name: pool
    size: 16MiB
    primary: app
    replicas: [store]
    paths: {app: $work/pool, store: $work/pool.replica}
    create: true
    allowed_peers: [app1]
    secret_file: $work/secret
  - name: raw
    size: 16MiB
    primary: app
    replicas: [store]
    paths: {app: $work/raw, store: $work/raw.replica}
    create: true
    allowed_peers: [app1]
    secret_file: $work/secret
YAML
export PMIRROR_RUNTIME_DIR=$work PMEM_IS_PMEM_FORCE=1
"$pmirrord" --config "$work/cluster.yaml" --node store --foreground >"$work/pmirrord.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do [[ -S $work/pmirrord.sock ]] && break; sleep 0.1; done

# Warm-up, not counted: the volumes' first open copies them whole to the
# replica (a new copy), which would weigh on the first round.
"$run" --config "$work/cluster.yaml" --volume pool --node app -- \
  "$counters" bench "$work/pool" 100 >/dev/null
"$rewritten" --config "$work/cluster.yaml" --volume raw --node app --identity app1 --count 100 >/dev/null
"$counters" bench "$work/plain.pool" 100 >/dev/null

field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<<"$2"; }
declare -A results
for round in $(seq "$rounds"); do
  plain=$("$counters" bench "$work/plain.pool" "$count")
  mirrored=$("$run" --config "$work/cluster.yaml" --volume pool --node app -- \
    "$counters" bench "$work/pool" "$count")
  raw=$("$rewritten" --config "$work/cluster.yaml" --volume raw --node app --identity app1 \
    --count "$count")
  for way in plain mirrored raw; do
    line=${!way}
    for f in transactions_per_s p50_us p99_us; do
      results[$way.$f]+="$(field "$f" "$line") "
    done
  done
  printf 'round %d: plain [%s]  pmirror-run [%s]  rewritten [%s]\n' "$round" "$plain" "$mirrored" "$raw"
done

median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
echo
printf '%-12s %12s %10s %10s\n' "" "tx/s" "p50 us" "p99 us"
for way in plain mirrored raw; do
  name=$way; [[ $way == mirrored ]] && name=pmirror-run; [[ $way == raw ]] && name=rewritten
  printf '%-12s %12s %10s %10s\n' "$name" "$(median "${results[$way.transactions_per_s]}")" \
    "$(median "${results[$way.p50_us]}")" "$(median "${results[$way.p99_us]}")"
done
# Ratios of same-round p50s, then their median.
ratio() { # $1 $2: ways
  local a=(${results[$1.p50_us]}) b=(${results[$2.p50_us]}) out=""
  for i in "${!a[@]}"; do out+="$(awk -v x="${a[$i]}" -v y="${b[$i]}" 'BEGIN{printf "%.2f", x/y}') "; done
  median "$out"
}
echo "p50 pmirror-run / rewritten (same-round median): $(ratio mirrored raw)"
echo "p50 pmirror-run / plain     (same-round median): $(ratio mirrored plain)"
echo "transactions: $count per way and round, $rounds rounds; load average: $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# What pmirror-promoter costs etcd in steady state (docs/failover.md,
# section 6): a 3-member etcd on loopback (Debian's etcd-server, default
# heartbeat and election timeout), three nodes on this machine (pmirrord and
# pmirror-promoter each, tcp on 127.0.0.1), N volumes of 1 MiB (primary n1,
# replicas n2 and n3, no hooks), failover.etcd at its defaults (ttl 10s,
# renew 2s, timeout 2s, margin 1s). Once every volume has a leader key and
# things settled, it measures over a window: etcd's requests per second
# (its /metrics, summed over the members), the CPU the etcd members, the
# promoters and pmirrord used (% of one core), the keys and their size,
# and the load average. It fails (with the logs' tails) when the volumes do
# not all get a leader key within 60 + N s: at 300 volumes on a 2-core
# machine they do not (docs/failover.md, section 6).
#   scripts/failover-etcd-cost.sh [N] [WINDOW_S] [SETTLE_S]
# Environment: PMIRROR_BUILD (default build/), PMIRROR_ETCD (/usr/bin/etcd),
# ETCDCTL (/usr/bin/etcdctl), KEEP=1 keeps the work directory.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
n=${1:-100}
window=${2:-30}
settle=${3:-10}
build=${PMIRROR_BUILD:-$repo/build}
etcd=${PMIRROR_ETCD:-/usr/bin/etcd}
etcdctl=${ETCDCTL:-/usr/bin/etcdctl}
pmirrord=$build/daemon/pmirrord
pmirrorctl=$build/daemon/pmirrorctl
promoter=$build/daemon/pmirror-promoter
prefix=/pmirror-cost
base=/tmp/pmirror-etcd-cost

[[ $n =~ ^[0-9]+$ && $n -ge 1 ]] || { echo "N must be a positive number, not '$n'" >&2; exit 1; }
for b in "$etcd" "$etcdctl" "$pmirrord" "$pmirrorctl" "$promoter"; do
  [[ -x $b ]] || { echo "no executable $b (scripts/build.sh; apt-get install etcd-server etcd-client)" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "python3 is needed (free ports)" >&2; exit 1; }

# ---- leftovers of runs that died without cleaning up ----------------------
# Each run's directory is $base-<pid of its script>; its processes are in
# its pids file. A directory whose script is gone is cleaned here: only the
# processes listed there, and only if their command line names that dir.
kill_listed() {  # pids-file dir
  local pid
  [[ -f $1 ]] || return 0
  while read -r pid; do
    [[ -n $pid && -r /proc/$pid/cmdline ]] || continue
    if tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$2"; then kill -TERM "$pid" 2>/dev/null || true; fi
  done <"$1"
  sleep 1
  while read -r pid; do
    [[ -n $pid && -r /proc/$pid/cmdline ]] || continue
    if tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$2"; then kill -KILL "$pid" 2>/dev/null || true; fi
  done <"$1"
}
for old in "$base"-*; do
  [[ -d $old ]] || continue
  owner=${old##*-}
  if [[ $owner =~ ^[0-9]+$ ]] && kill -0 "$owner" 2>/dev/null &&
    tr '\0' ' ' <"/proc/$owner/cmdline" 2>/dev/null | grep -q failover-etcd-cost; then
    echo "another run is under way ($old, pid $owner)" >&2
    exit 1
  fi
  echo "cleaning up a leftover run: $old" >&2
  kill_listed "$old/pids" "$old"
  rm -rf "$old"
done

work=$base-$$
mkdir -p "$work"/{run,data,etcd}
pids=$work/pids
: >"$pids"
export PMIRROR_RUNTIME_DIR=$work/run

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  # Promoters first (they revoke their lease), then pmirrord, then etcd.
  local group pid
  for group in promoter pmirrord etcd; do
    for pid in $(grep " $group" "$pids" 2>/dev/null | cut -d' ' -f1); do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 50); do
      local alive=0
      for pid in $(grep " $group" "$pids" 2>/dev/null | cut -d' ' -f1); do kill -0 "$pid" 2>/dev/null && alive=1; done
      ((alive)) || break
      sleep 0.1
    done
    for pid in $(grep " $group" "$pids" 2>/dev/null | cut -d' ' -f1); do kill -KILL "$pid" 2>/dev/null || true; done
  done
  wait 2>/dev/null || true
  if [[ ${KEEP:-0} == 1 ]]; then echo "kept $work" >&2; else rm -rf "$work"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

spawn() {  # group log command...
  local group=$1 log=$2
  shift 2
  "$@" >"$log" 2>&1 &
  echo "$! $group" >>"$pids"
}
pid_of() { grep " $1\$" "$pids" | cut -d' ' -f1; }  # "etcd m0", "promoter n1", ...
request() {  # socket json -> the reply (control sockets: one JSON line each way)
  python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\n"); data = b""
while not data.endswith(b"\n"):
    chunk = s.recv(65536)
    if not chunk: break
    data += chunk
sys.stdout.write(data.decode())' "$1" "$2"
}
grants() { cat "$work"/promoter-n*.log 2>/dev/null | grep -c 'etcd lease .* granted' || true; }
cpu_ticks() {  # pid -> utime + stime, in clock ticks
  awk '{sub(/.*\) /, ""); print $12 + $13}' "/proc/$1/stat"
}

fail() {
  echo "$*" >&2
  for f in "$work"/*.log "$work"/etcd/*.log; do
    [[ -f $f ]] && { echo "--- $f (last lines)" >&2; tail -8 "$f" >&2; }
  done
  exit 1
}

wait_for() {  # seconds what command...
  local limit=$1 what=$2
  shift 2
  local until=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < until)) || fail "$what: not within $limit s"
    sleep 0.2
  done
}

# ---- ports: 3 x (etcd client, etcd peer) + 3 pmirrord ---------------------
read -r -a ports <<<"$(python3 -c '
import socket
s = [socket.socket() for _ in range(9)]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))
for x in s: x.close()')"
members=(m0 m1 m2)
endpoints=()
initial=""
for i in 0 1 2; do
  endpoints+=("http://127.0.0.1:${ports[2 * i]}")
  initial+="${initial:+,}${members[i]}=http://127.0.0.1:${ports[2 * i + 1]}"
done
endpoint_list=$(IFS=,; echo "${endpoints[*]}")

# ---- the cluster file ---------------------------------------------------------
config=$work/cluster.yaml
{
  echo "cluster: {name: cost}"
  echo "daemon:"
  echo "  log_level: warn"
  echo "failover:"
  echo "  engine: etcd"
  echo "  etcd:"
  echo "    endpoints: [$(IFS=,; echo "${endpoints[*]}" | sed 's/,/, /g')]"
  echo "    prefix: $prefix"
  echo "    ttl: 10s"
  echo "    renew: 2s"
  echo "    timeout: 2s"
  echo "    margin: 1s"
  echo "nodes:"
  for i in 1 2 3; do
    mkdir -p "$work/n$i-lease"
    echo "  - name: n$i"
    echo "    address: 127.0.0.1"
    echo "    port: ${ports[5 + i]}"
    echo "    transport: tcp"
    echo "    control_socket: $work/n$i.sock"
    echo "    state_pool: $work/n$i.state"
    echo "    lease_dir: $work/n$i-lease"
  done
  echo "volumes:"
  for ((v = 1; v <= n; v++)); do
    name=$(printf 'v%04d' "$v")
    echo "  - name: $name"
    echo "    size: 1MiB"
    echo "    primary: n1"
    echo "    replicas: [n2, n3]"
    echo "    paths: {n1: $work/data/n1-$name.img, n2: $work/data/n2-$name.img, n3: $work/data/n3-$name.img}"
    echo "    create: true"
    echo "    allowed_peers: [app1]"
    echo "    secret: \"cost-measurement-secret-$name\""
  done
} >"$config"
"$pmirrorctl" config check "$config" --node n1 >"$work/config-check.txt" 2>&1 ||
  { cat "$work/config-check.txt" >&2; fail "the cluster file does not pass config check"; }

# ---- etcd ------------------------------------------------------------------------
for i in 0 1 2; do
  spawn "etcd ${members[i]}" "$work/etcd/${members[i]}.log" "$etcd" \
    --name "${members[i]}" --data-dir "$work/etcd/${members[i]}.etcd" \
    --listen-client-urls "${endpoints[i]}" --advertise-client-urls "${endpoints[i]}" \
    --listen-peer-urls "http://127.0.0.1:${ports[2 * i + 1]}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${ports[2 * i + 1]}" \
    --initial-cluster "$initial" --initial-cluster-state new \
    --initial-cluster-token "pmirror-cost-$$" --logger zap --log-outputs stderr
done
for e in "${endpoints[@]}"; do
  wait_for 30 "etcd $e" curl -sf -m 1 -X POST "$e/v3/kv/range" -d '{"key":"cmVhZHk="}'
done
ctl() { "$etcdctl" --endpoints "$endpoint_list" "$@"; }

# ---- pmirrord, then the promoters --------------------------------------------------
t0=$SECONDS
for i in 1 2 3; do
  spawn "pmirrord n$i" "$work/pmirrord-n$i.log" "$pmirrord" --config "$config" --node "n$i" --foreground
done
for i in 1 2 3; do
  wait_for $((60 + n)) "pmirrord n$i" "$pmirrorctl" --socket "$work/n$i.sock" status
done
echo "pmirrord up on 3 nodes with $n volumes after $((SECONDS - t0)) s" >&2
# etcd's own cost, before any promoter runs (heartbeats, its timers).
baseline=${BASELINE_S:-10}
declare -A base0 base1
for i in 0 1 2; do base0[$i]=$(cpu_ticks "$(pid_of "etcd ${members[i]}")"); done
b_start=$(date +%s%N)
sleep "$baseline"
b_end=$(date +%s%N)
for i in 0 1 2; do base1[$i]=$(cpu_ticks "$(pid_of "etcd ${members[i]}")"); done
etcd_idle=$(awk -v t="$((base1[0] + base1[1] + base1[2] - base0[0] - base0[1] - base0[2]))" -v hz="$(getconf CLK_TCK)" \
  -v a="$b_start" -v b="$b_end" 'BEGIN {printf "%.1f", 100 * t / hz / ((b - a) / 1e9)}')
for i in 1 2 3; do
  spawn "promoter n$i" "$work/promoter-n$i.log" "$promoter" --config "$config" --node "n$i" --foreground
done
leaders() { ctl get --prefix "$prefix" --keys-only | grep -c '/leader$' || true; }
t0=$SECONDS
until (($(leaders) >= n)); do
  ((SECONDS - t0 < 60 + n)) || fail "only $(leaders) of $n volumes have a leader key after $((SECONDS - t0)) s"
  for p in $(grep -E ' (pmirrord|promoter|etcd)' "$pids" | cut -d' ' -f1); do
    kill -0 "$p" 2>/dev/null || fail "process $p ($(grep "^$p " "$pids" | cut -d' ' -f2-)) exited"
  done
  sleep 1
done
# Every promoter past its first round (the standbys demote each volume once
# there, a pmirrord call each): all of them see n1 holding every volume.
t1=$SECONDS
until (($(for i in 1 2 3; do request "$work/n$i.promoter.sock" '{"command":"status"}' |
  jq '[(.result.volumes // [])[] | select(.holder == "n1")] | length' 2>/dev/null || echo 0; done | awk '{s += $1} END {print s + 0}') >= 3 * n)); do
  ((SECONDS - t1 < 60 + n)) || fail "the promoters do not all see n1 holding every volume after $((SECONDS - t1)) s"
  sleep 1
done
echo "all $n leader keys after $((SECONDS - t0)) s, every promoter past its first round after $((SECONDS - t1)) s more; settling $settle s" >&2
sleep "$settle"

# ---- the window ------------------------------------------------------------------
# Counters of every member, one "member name{labels} value" per line.
scrape() {
  local i
  for i in 0 1 2; do
    curl -sf -m 5 "${endpoints[i]}/metrics" | awk -v m="${members[i]}" '
      /^#/ {next}
      /^(etcd_mvcc_(range|put|txn|delete)_total|etcd_debugging_lease_(renewed|granted|revoked)_total|etcd_server_proposals_committed_total|etcd_mvcc_db_total_size_in_bytes) / {print m, $1, $2}
      /^grpc_server_(handled|msg_received)_total\{/ {
        if ($1 !~ /grpc_method="(Range|Txn|Put|DeleteRange|LeaseGrant|LeaseKeepAlive|LeaseRevoke)"/) next
        method = $1; sub(/.*grpc_method="/, "", method); sub(/".*/, "", method)
        kind = ($1 ~ /^grpc_server_handled/) ? "handled" : "msg_received"
        print m, "grpc_" kind "_" method, $2 }'
  done
}
procs=("etcd m0" "etcd m1" "etcd m2" "promoter n1" "promoter n2" "promoter n3" "pmirrord n1" "pmirrord n2" "pmirrord n3")
declare -A cpu0
for p in "${procs[@]}"; do cpu0[$p]=$(cpu_ticks "$(pid_of "$p")"); done
grants0=$(grants)
scrape >"$work/metrics0"
start_ns=$(date +%s%N)
sleep "$window"
scrape >"$work/metrics1"
end_ns=$(date +%s%N)
declare -A cpu1
for p in "${procs[@]}"; do cpu1[$p]=$(cpu_ticks "$(pid_of "$p")"); done
loadavg=$(cut -d' ' -f1-3 /proc/loadavg)
regrants=$(($(grants) - grants0))
# What one of the promoters' pmirrord status calls costs (one per volume
# per round, each answering for all N volumes): 20 of them on n2.
read -r status_ms status_bytes < <(python3 -c '
import socket, sys, time
times = []
for _ in range(20):
    t = time.monotonic()
    s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1])
    s.sendall(b"{\"command\":\"status\"}\n"); data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(1 << 20)
        if not chunk: break
        data += chunk
    s.close(); times.append(time.monotonic() - t)
times.sort()
print("%.1f %d" % (1000 * times[len(times) // 2], len(data)))' "$work/n2.sock")
seconds=$(awk -v a="$start_ns" -v b="$end_ns" 'BEGIN {printf "%.3f", (b - a) / 1e9}')
hz=$(getconf CLK_TCK)

# Keys: etcdctl prints key and value on a line each (the values are one-line JSON).
read -r keys key_bytes < <(ctl get --prefix "$prefix" | awk '{b += length($0)} END {printf "%d %d\n", NR / 2, b}')
leader_count=$(leaders)
serving=$(for i in 0 1 2; do
  c=$(awk -v m="${members[i]}" '$1 == m && $2 == "grpc_handled_Range" {s += $3} END {print s + 0}' "$work/metrics1")
  echo "${members[i]}:$c"
done | tr '\n' ' ')
etcd_leader=$(ctl endpoint status -w simple 2>/dev/null | awk -F', ' '$5 == "true" {print $1}' | head -1)
for i in 0 1 2; do [[ ${endpoints[i]} == "$etcd_leader" ]] && etcd_leader=${members[i]}; done

# ---- the table ------------------------------------------------------------------
rate() {  # counter-name -> per second, summed over the members
  awk -v k="$1" -v s="$seconds" '
    FNR == NR {if ($2 == k) a[$1] += $3; next}
    $2 == k {b[$1] += $3}
    END {t = 0; for (m in b) t += b[m] - a[m]; printf "%.1f", t / s}' "$work/metrics0" "$work/metrics1"
}
cpu() {  # process names... -> % of one core
  local t=0 p
  for p in "$@"; do t=$((t + ${cpu1[$p]} - ${cpu0[$p]})); done
  awk -v t="$t" -v hz="$hz" -v s="$seconds" 'BEGIN {printf "%.1f", 100 * t / hz / s}'
}
range=$(rate grpc_handled_Range)
per_volume=$(awk -v r="$range" -v n="$n" 'BEGIN {printf "%.2f", r / n}')
period=$(awk -v r="$range" -v n="$n" 'BEGIN {if (r > 0) printf "%.0f", 1000 * 3 * n / r; else print "-"}')
printf '\npmirror-promoter cost to etcd: %d volumes x 3 nodes, 3-member etcd %s, window %s s, %s\n' \
  "$n" "$("$etcd" --version | awk '/etcd Version/ {print $3}')" "$seconds" "$(date -u +%FT%TZ)"
printf 'machine: %d cores; load average after the window: %s\n' "$(nproc)" "$loadavg"
printf 'leader keys: %d; keys under %s: %d, %d bytes (keys + values)\n' "$leader_count" "$prefix" "$keys" "$key_bytes"
printf '\n%-48s %10s\n' "etcd, per second (sum over the members)" "rate"
printf '%-48s %10s\n' "Range requests (gRPC handled)" "$range"
printf '%-48s %10s\n' "  per volume" "$per_volume"
printf '%-48s %10s\n' "  implied poll period per promoter (ms)" "$period"
printf '%-48s %10s\n' "Txn requests" "$(rate grpc_handled_Txn)"
printf '%-48s %10s\n' "Put requests" "$(rate grpc_handled_Put)"
printf '%-48s %10s\n' "LeaseKeepAlive messages" "$(rate grpc_msg_received_LeaseKeepAlive)"
printf '%-48s %10s\n' "LeaseKeepAlive streams (one per HTTP call)" "$(rate grpc_handled_LeaseKeepAlive)"
printf '%-48s %10s\n' "leases renewed (etcd_debugging_lease_renewed)" "$(rate etcd_debugging_lease_renewed_total)"
printf '%-48s %10s\n' "raft proposals committed (x3 members)" "$(rate etcd_server_proposals_committed_total)"
printf '%-48s %10s\n' "mvcc puts applied (x3 members)" "$(rate etcd_mvcc_put_total)"
printf '%-48s %10s\n' "mvcc txns applied (x3 members)" "$(rate etcd_mvcc_txn_total)"
printf 'Range requests by member (since start): %s(raft leader: %s)\n' "$serving" "${etcd_leader:-?}"
printf 'etcd leases granted again in the window (a lapse): %d\n' "$regrants"
printf 'pmirrord status on n2 (what local_copy asks per volume): p50 %s ms, %s bytes\n' "$status_ms" "$status_bytes"
printf '\n%-48s %10s\n' "CPU, % of one core" "window"
printf '%-48s %10s\n' "etcd, 3 members" "$(cpu "etcd m0" "etcd m1" "etcd m2")"
printf '%-48s %10s\n' "  idle, before the promoters started" "$etcd_idle"
for p in "etcd m0" "etcd m1" "etcd m2"; do printf '%-48s %10s\n' "  $p" "$(cpu "$p")"; done
printf '%-48s %10s\n' "pmirror-promoter, 3 nodes" "$(cpu "promoter n1" "promoter n2" "promoter n3")"
printf '%-48s %10s\n' "pmirrord, 3 nodes (the promoters' status calls)" "$(cpu "pmirrord n1" "pmirrord n2" "pmirrord n3")"
printf '\nRESULT n=%d range_per_s=%s per_volume=%s poll_ms=%s keepalive_per_s=%s txn_per_s=%s put_per_s=%s etcd_cpu=%s promoter_cpu=%s pmirrord_cpu=%s etcd_idle_cpu=%s keys=%d key_bytes=%d regrants=%d status_ms=%s load="%s"\n' \
  "$n" "$range" "$per_volume" "$period" "$(rate grpc_msg_received_LeaseKeepAlive)" "$(rate grpc_handled_Txn)" \
  "$(rate grpc_handled_Put)" "$(cpu "etcd m0" "etcd m1" "etcd m2")" \
  "$(cpu "promoter n1" "promoter n2" "promoter n3")" "$(cpu "pmirrord n1" "pmirrord n2" "pmirrord n3")" "$etcd_idle" \
  "$keys" "$key_bytes" "$regrants" "$status_ms" "$loadavg"

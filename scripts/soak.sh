#!/usr/bin/env bash
# pmirror's soak (docs/testing.md, "The soak"): nodes in network namespaces
# of their own, joined by veth pairs through a bridge, each running a
# pmirrord; many volumes, one or two replicas each, mixed ack policies; a
# writer per volume on its primary (pmirror-record-writer: numbered,
# self-checking records through the C API, each acknowledged one logged);
# faults at random and overlapping from a seeded schedule printed at the
# start; then the faults heal, every volume must come back in sync within
# a bound, and every acknowledged record must be intact on every copy. A
# report at the end (scripts/soak_report.py): persists acknowledged, faults
# by kind, records lost, resync time after the heal, persist latency
# outside and during faults, pmirrord's RSS, fd and thread slopes.
#
#   scripts/soak.sh [--short | --long] [--seed N] [--duration S] [--volumes N]
#                   [--nodes N] [--rate R] [--build DIR] [--dir DIR] [--keep]
#
# --short (default): 3 nodes, 6 volumes, 90 s, a fault every ~2 s (CI).
# --long: 4 nodes, 50 volumes, 3600 s, a fault every ~5 s (720 faults;
# scripts/test-extended.sh). --rate: records per second per writer
# (short 20, long 5). --seed replays a schedule. --keep leaves the work
# directory (logs, copies) behind; it is also left when the run fails.
# Exit 0: nothing lost and everything back in sync; 1: a check failed;
# 2: bad usage or set-up. As root (namespaces, links).
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=short seed="" duration="" volumes="" nodes="" rate="" build=$repo/build dir="" keep=0

die() {
  echo "soak: $*" >&2
  exit 2
}
usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case $1 in
    --short | --long) mode=${1#--} ;;
    --seed | --duration | --volumes | --nodes | --rate | --build | --dir)
      [[ $# -ge 2 ]] || die "$1 needs a value"
      declare "${1#--}=$2"
      shift
      ;;
    --keep) keep=1 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (--help)" ;;
  esac
  shift
done
if [[ $mode == long ]]; then
  : "${nodes:=4}" "${volumes:=50}" "${duration:=3600}" "${rate:=5}"
  fault_every=5
else
  : "${nodes:=3}" "${volumes:=6}" "${duration:=90}" "${rate:=20}"
  fault_every=2
fi
for n in nodes volumes duration rate; do
  [[ ${!n} =~ ^[0-9]+$ && ${!n} -gt 0 ]] || die "--$n: a positive integer, not '${!n}'"
done
((nodes >= 3 && nodes <= 9)) || die "--nodes: 3..9"
((duration >= 30)) || die "--duration: at least 30 s (faults start at 5 s and end 10 s before)"
[[ -z $seed || $seed =~ ^[0-9]+$ ]] || die "--seed: a number"
[[ $EUID -eq 0 ]] || die "run as root: network namespaces and links"
for tool in pmirrord pmirrorctl; do
  [[ -x $build/daemon/$tool ]] || die "no $build/daemon/$tool: build first (scripts/build.sh)"
done
writer=$build/tests/integration/pmirror-record-writer
[[ -x $writer ]] || die "no $writer: build first (scripts/build.sh)"
command -v python3 >/dev/null || die "python3 is needed for the report (scripts/install-deps.sh)"
pmirrord=$build/daemon/pmirrord pmirrorctl=$build/daemon/pmirrorctl

seed=${seed:-$((($(date +%s%N) / 1000) % 1000000))}
RANDOM=$seed
if [[ -n $dir ]]; then
  mkdir -p "$dir" || die "cannot make $dir"
  dir=$(cd "$dir" && pwd)
else
  dir=$(mktemp -d /var/tmp/pmirror-soak.XXXXXX)
fi
id=$$
bridge=pmsb$id
record_size=512
# Enough slots for every record at the rate (with room), at least 8 MiB.
size_mib=$(((rate * duration * 3 / 2 * record_size + (1 << 20) - 1) >> 20))
((size_mib < 8)) && size_mib=8
size_mib=$(((size_mib + 3) / 4 * 4))
size=$((size_mib << 20))
started_at=$(date +%s)

ns() { echo "pmsoak$id-n$1"; }
node_ip() { echo "10.77.0.$((10 + $1))"; }
now_ms() { date +%s%3N; }
log() { echo "soak $(date +%T): $*"; }

# ---- what the machine can do ------------------------------------------------
# tc netem (delay, duplication, reordering) needs sch_netem, which some
# kernels lack (this project's CI machines: docs/testing.md); nft (loss,
# one-way cuts, splits) needs nftables. What is missing is reported, not
# faked.
have_nft=0 have_netem=0
if command -v nft >/dev/null; then
  ip netns add "pmsoak$id-probe" 2>/dev/null &&
    ip netns exec "pmsoak$id-probe" nft add table inet probe 2>/dev/null && have_nft=1
  ip -n "pmsoak$id-probe" link set lo up 2>/dev/null
  ip netns exec "pmsoak$id-probe" tc qdisc add dev lo root netem delay 1ms 2>/dev/null && have_netem=1
  ip netns del "pmsoak$id-probe" 2>/dev/null
fi

# ---- topology -----------------------------------------------------------------
cleanup_network() {
  local i
  for ((i = 1; i <= nodes; i++)); do ip netns del "$(ns "$i")" 2>/dev/null; done
  ip link del "$bridge" 2>/dev/null
}
stop_everything() {
  touch "$dir/stop"
  local f pid
  for f in "$dir"/*/writer-*.pid "$dir"/n*/pmirrord.pid; do
    [[ -e $f ]] || continue
    pid=$(cat "$f")
    kill -CONT "$pid" 2>/dev/null
    kill -TERM "$pid" 2>/dev/null
  done
  wait 2>/dev/null
}
on_exit() {
  stop_everything
  cleanup_network
  if ((keep == 0 && ${soak_ok:-0} == 1)); then rm -rf "$dir"; else echo "soak: work directory kept: $dir"; fi
}
trap on_exit EXIT
trap 'exit 1' INT TERM

ip link add "$bridge" type bridge || die "cannot make bridge $bridge (root, a kernel with bridging?)"
ip link set "$bridge" up
for ((i = 1; i <= nodes; i++)); do
  ip netns add "$(ns "$i")" || die "cannot make network namespace $(ns "$i")"
  ip link add "pmsv$id-$i" type veth peer name eth0 netns "$(ns "$i")" || die "cannot make a veth pair"
  ip link set "pmsv$id-$i" master "$bridge" up
  ip -n "$(ns "$i")" addr add "$(node_ip "$i")/24" dev eth0
  ip -n "$(ns "$i")" link set eth0 up
  ip -n "$(ns "$i")" link set lo up
  mkdir -p "$dir/n$i/run"
done

# ---- the cluster file -----------------------------------------------------------
# Volume k: primary n((k-1) mod N + 1); odd k one replica, even k two; with
# two, ack alternates 1 and 2; on_insufficient alternates fail and block.
declare -A primary_of replicas_of ack_of policy_of
head -c 32 /dev/urandom | base64 >"$dir/secret"
chmod 600 "$dir/secret"
{
  cat <<YAML
daemon:
  log_level: info
  heartbeat_interval: 500ms
  heartbeat_timeout: 3s
  reconnect_initial: 200ms
  reconnect_max: 2s
nodes:
YAML
  for ((i = 1; i <= nodes; i++)); do
    cat <<YAML
  - name: n$i
    address: $(node_ip "$i")
    port: 7450
    state_pool: $dir/n$i/pmirrord.state
    control_socket: $dir/n$i/pmirrord.sock
YAML
  done
  echo "volumes:"
  for ((k = 1; k <= volumes; k++)); do
    p=$(((k - 1) % nodes + 1))
    r1=$((p % nodes + 1)) r2=$(((p + 1) % nodes + 1))
    if ((k % 2)); then reps="n$r1" ack=1; else reps="n$r1, n$r2" ack=$(((k / 2) % 2 + 1)); fi
    policy=fail
    (((k + 1) / 2 % 2 == 0)) && policy=block
    primary_of[$k]=$p replicas_of[$k]=$reps ack_of[$k]=$ack policy_of[$k]=$policy
    paths="n$p: $dir/n$p/v$k.img"
    for r in ${reps//,/}; do paths+=", $r: $dir/${r}/v$k.img"; done
    cat <<YAML
  - name: v$k
    size: ${size_mib}MiB
    primary: n$p
    replicas: [$reps]
    ack: $ack
    on_insufficient: $policy
    paths: {$paths}
    create: true
    allowed_peers: [writer]
    secret_file: $dir/secret
    resync_rate: unlimited
YAML
  done
} >"$dir/cluster.yaml"

# ---- processes --------------------------------------------------------------------
start_pmirrord() {
  local i=$1
  ip netns exec "$(ns "$i")" "$pmirrord" --config "$dir/cluster.yaml" --node "n$i" --foreground \
    >>"$dir/n$i/pmirrord.log" 2>&1 &
  echo $! >"$dir/n$i/pmirrord.pid"
}
# The writer of volume k, restarted after the record it acknowledged last
# whenever it ends (killed, or its open timed out), until the run stops.
run_writer() {
  local k=$1 p=${primary_of[$1]} first
  while [[ ! -e $dir/stop ]]; do
    first=$(awk '$1 == "acked" && $2 > m {m = $2} END {print m + 1}' "$dir/n$p/writer-v$k.log" 2>/dev/null)
    PMIRROR_RUNTIME_DIR=$dir/n$p/run ip netns exec "$(ns "$p")" "$writer" write \
      --config "$dir/cluster.yaml" --volume "v$k" --node "n$p" --identity writer \
      --record-size $record_size --first-seq "${first:-1}" --rate "$rate" --keep-going \
      --timing --c-api --open-timeout 30 >>"$dir/n$p/writer-v$k.log" 2>>"$dir/n$p/writer-v$k.err" &
    echo $! >"$dir/n$p/writer-v$k.pid"
    wait $! 2>/dev/null
    [[ -e $dir/stop ]] || sleep 0.2
  done
}
pid_of() { cat "$1" 2>/dev/null; }

# ---- the schedule ---------------------------------------------------------------
# Precomputed from the seed: "SECOND KIND TARGET HOLD_MS". n1's pmirrord is
# never killed: its RSS, fds and threads are the series whose slopes the
# report gives (stopped and cut off it is, like the others).
kinds=(kill-pmirrord stop-pmirrord kill-writer stop-writer cut-node flood verify)
((have_nft)) && kinds+=(cut-one-way loss split)
((have_netem)) && kinds+=(delay)
schedule=$dir/schedule
{
  t=5000
  end=$(((duration - 10) * 1000))
  while true; do
    t=$((t + fault_every * 500 + RANDOM % (fault_every * 1000)))
    ((t < end)) || break
    kind=${kinds[RANDOM % ${#kinds[@]}]}
    case $kind in
      kill-pmirrord) target=n$((2 + RANDOM % (nodes - 1))) hold=$((500 + RANDOM % 4500)) ;;
      *-pmirrord | cut-* | loss | delay | flood) target=n$((1 + RANDOM % nodes)) hold=$((1000 + RANDOM % 9000)) ;;
      *-writer | verify) target=v$((1 + RANDOM % volumes)) hold=$((300 + RANDOM % 4700)) ;;
      split) target=n1-$((1 + nodes / 2)) hold=$((2000 + RANDOM % 8000)) ;;
    esac
    echo "$((t / 1000)).$(printf %03d $((t % 1000))) $kind $target $hold"
  done
} >"$schedule"
faults_planned=$(wc -l <"$schedule")
for ((k = 1; k <= volumes; k++)); do
  echo "v$k primary n${primary_of[$k]} replicas [${replicas_of[$k]}] ack ${ack_of[$k]} on_insufficient ${policy_of[$k]}"
done >"$dir/volumes"
log "seed $seed ($mode: $nodes nodes, $volumes volumes of $size_mib MiB, $duration s, $rate records/s a writer)"
log "replay: scripts/soak.sh --$mode --seed $seed --nodes $nodes --volumes $volumes --duration $duration --rate $rate"
log "fault kinds: ${kinds[*]}$( ((have_netem)) || echo "; not on this kernel: tc netem (delay, duplication, reordering)")$( ((have_nft)) || echo "; no nft: loss, one-way cuts, splits")"
log "volumes ($dir/volumes): $(head -2 "$dir/volumes" | tr '\n' ';') ..."
log "schedule ($faults_planned faults, $schedule):"
sed 's/^/  /' "$schedule" | head -"${PMIRROR_SOAK_SHOW:-12}"
((faults_planned > ${PMIRROR_SOAK_SHOW:-12})) && echo "  ... ($((faults_planned - ${PMIRROR_SOAK_SHOW:-12})) more)"

# ---- faults --------------------------------------------------------------------------
nft_in() { ip netns exec "$(ns "$1")" nft "${@:2}"; }
fault() {
  local kind=$1 target=$2 hold=$3 i k pid seconds table
  seconds=$(printf '%d.%03d' $((hold / 1000)) $((hold % 1000)))
  echo "$(now_ms) start $kind $target $hold" >>"$dir/faults.log"
  case $kind in
    kill-pmirrord)
      i=${target#n}
      pid=$(pid_of "$dir/n$i/pmirrord.pid")
      kill -9 "$pid" 2>/dev/null
      sleep "$seconds"
      start_pmirrord "$i"
      ;;
    stop-pmirrord)
      pid=$(pid_of "$dir/${target}/pmirrord.pid")
      kill -STOP "$pid" 2>/dev/null
      sleep "$seconds"
      kill -CONT "$pid" 2>/dev/null
      ;;
    kill-writer)
      k=${target#v}
      kill -9 "$(pid_of "$dir/n${primary_of[$k]}/writer-v$k.pid")" 2>/dev/null
      ;;
    stop-writer)
      k=${target#v}
      pid=$(pid_of "$dir/n${primary_of[$k]}/writer-v$k.pid")
      kill -STOP "$pid" 2>/dev/null
      sleep "$seconds"
      kill -CONT "$pid" 2>/dev/null
      ;;
    cut-node)
      ip -n "$(ns "${target#n}")" link set eth0 down
      sleep "$seconds"
      ip -n "$(ns "${target#n}")" link set eth0 up
      ;;
    cut-one-way | loss | delay)
      i=${target#n}
      if [[ $kind == delay ]]; then
        ip netns exec "$(ns "$i")" tc qdisc add dev eth0 root netem delay 20ms 10ms reorder 5% duplicate 1%
      else
        # A table per kind: a split may overlap (another lock).
        table=soak_${kind//-/_}
        nft_in "$i" add table inet "$table"
        nft_in "$i" add chain inet "$table" out '{ type filter hook output priority 0; }'
        if [[ $kind == loss ]]; then
          nft_in "$i" add chain inet "$table" in '{ type filter hook input priority 0; }'
          nft_in "$i" add rule inet "$table" out numgen random mod 100 '<' 5 drop
          nft_in "$i" add rule inet "$table" in numgen random mod 100 '<' 5 drop
        else
          nft_in "$i" add rule inet "$table" out oifname eth0 drop
        fi
      fi
      sleep "$seconds"
      if [[ $kind == delay ]]; then
        ip netns exec "$(ns "$i")" tc qdisc del dev eth0 root
      else
        nft_in "$i" delete table inet "$table"
      fi
      ;;
    split)
      # Nodes 1..h against the rest, both ways.
      local h=${target#n1-} left="" right="" a
      for ((a = 1; a <= nodes; a++)); do
        if ((a <= h)); then left+="${left:+, }$(node_ip "$a")"; else right+="${right:+, }$(node_ip "$a")"; fi
      done
      for ((a = 1; a <= nodes; a++)); do
        nft_in "$a" add table inet soak_split
        nft_in "$a" add chain inet soak_split out '{ type filter hook output priority 0; }'
        if ((a <= h)); then
          nft_in "$a" add rule inet soak_split out ip daddr "{ $right }" drop
        else
          nft_in "$a" add rule inet soak_split out ip daddr "{ $left }" drop
        fi
      done
      sleep "$seconds"
      for ((a = 1; a <= nodes; a++)); do nft_in "$a" delete table inet soak_split; done
      ;;
    flood)
      # 200 strangers' connections from the next node: garbage, an
      # oversized length, silence (held until the handshake timeout).
      i=${target#n}
      a=$((i % nodes + 1))
      ip netns exec "$(ns "$a")" bash -c '
        for ((c = 0; c < 200; c++)); do
          exec 3<>"/dev/tcp/$1/7450" || continue
          case $((c % 3)) in
            0) head -c 300 /dev/urandom >&3 ;;
            1) printf "\xff\xff\xff\x7fPMIR" >&3 ;;
            2) sleep 0.01 ;;
          esac
          exec 3>&-
        done' flood "$(node_ip "$i")" 2>/dev/null
      ;;
    verify)
      k=${target#v}
      timeout 60 "$pmirrorctl" --runtime-dir "$dir/n${primary_of[$k]}/run" verify "v$k" \
        >>"$dir/verify.log" 2>&1
      echo "verify v$k: exit $?" >>"$dir/verify.log"
      ;;
  esac
  echo "$(now_ms) end $kind $target $hold" >>"$dir/faults.log"
}

# ---- resources of n1's pmirrord ---------------------------------------------------
sample_resources() {
  local pid memory fds
  while [[ ! -e $dir/stop ]]; do
    pid=$(pid_of "$dir/n1/pmirrord.pid")
    if [[ -n $pid && -d /proc/$pid ]]; then
      # VmRSS, RssAnon (the daemon's own; RssFile is mostly the mapped
      # copies, which fill as they are written), Threads.
      memory=$(awk '/^(VmRSS|RssAnon|Threads):/ {v[$1] = $2}
        END {if (v["VmRSS:"] != "") print v["VmRSS:"], v["RssAnon:"], v["Threads:"]}' \
        "/proc/$pid/status" 2>/dev/null)
      fds=$(find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
      [[ -n $memory ]] && echo "$(now_ms) $memory $fds" >>"$dir/resources.log"
    fi
    sleep 5
  done
}

# ---- the run ---------------------------------------------------------------------------
for ((i = 1; i <= nodes; i++)); do start_pmirrord "$i"; done
for ((i = 1; i <= nodes; i++)); do
  for _ in $(seq 100); do
    [[ -S $dir/n$i/pmirrord.sock ]] && break
    sleep 0.1
  done
  [[ -S $dir/n$i/pmirrord.sock ]] || { tail -20 "$dir/n$i/pmirrord.log" >&2; die "pmirrord on n$i did not start"; }
done
for ((k = 1; k <= volumes; k++)); do run_writer "$k" & done
sample_resources &
mkdir -p "$dir/locks"
t0=$(now_ms)
echo "$t0 run-start" >"$dir/faults.log"
log "running: $nodes pmirrord, $volumes writers; faults from 5 s"
skipped=0
while read -r at kind target hold; do
  due=$((t0 + 10#${at%.*} * 1000 + 10#${at#*.}))
  while (($(now_ms) < due)); do sleep 0.1; done
  # One fault at a time on one target (the kinds differ between targets).
  lock=$target
  [[ $kind == split ]] && lock="split"
  if ! mkdir "$dir/locks/$lock" 2>/dev/null; then
    echo "$(now_ms) skip $kind $target $hold" >>"$dir/faults.log"
    skipped=$((skipped + 1))
    continue
  fi
  (
    fault "$kind" "$target" "$hold"
    rmdir "$dir/locks/$lock"
  ) </dev/null &
done <"$schedule"
while (($(now_ms) < t0 + duration * 1000)); do sleep 0.5; done

# ---- heal, then the checks ----------------------------------------------------------
log "faults over; waiting for the last to heal"
for _ in $(seq 600); do
  [[ -z $(ls -A "$dir/locks") ]] && break
  sleep 0.1
done
# Whatever a fault left (none should): every pmirrord running, links up.
for ((i = 1; i <= nodes; i++)); do
  pid=$(pid_of "$dir/n$i/pmirrord.pid")
  kill -CONT "$pid" 2>/dev/null
  kill -0 "$pid" 2>/dev/null || { log "n$i: pmirrord not running after the heal: started"; start_pmirrord "$i"; }
  ip -n "$(ns "$i")" link set eth0 up
  if ((have_nft)); then
    for table in soak_cut_one_way soak_loss soak_split; do nft_in "$i" delete table inet "$table" 2>/dev/null; done
  fi
done
healed=$(now_ms)
echo "$healed healed" >>"$dir/faults.log"
log "healed; waiting for every volume to be in sync (bound ${PMIRROR_SOAK_SYNC_BOUND:-120} s)"
in_sync() { # volume k: every replica connected on its primary's writer
  local k=$1 p=${primary_of[$1]}
  "$pmirrorctl" --runtime-dir "$dir/n$p/run" status "v$k" --json 2>/dev/null |
    python3 -c '
import json, sys
want = set(sys.argv[1].replace(" ", "").split(","))
try:
    d = json.load(sys.stdin)
except ValueError:
    sys.exit(1)
for proc in d.get("processes", [d]):
    for v in proc.get("volumes", []):
        if v.get("name") != sys.argv[2]:
            continue
        states = {p.get("name"): p.get("state") for p in v.get("peers", [])}
        if all(states.get(r) == "connected" for r in want):
            sys.exit(0)
sys.exit(1)' "${replicas_of[$k]}" "v$k"
}
declare -A synced_at=()
bound_ms=$((${PMIRROR_SOAK_SYNC_BOUND:-120} * 1000))
while ((${#synced_at[@]} < volumes && $(now_ms) < healed + bound_ms)); do
  for ((k = 1; k <= volumes; k++)); do
    [[ -n ${synced_at[$k]:-} ]] && continue
    in_sync "$k" && synced_at[$k]=$(now_ms)
  done
  sleep 0.5
done
failures=0
for ((k = 1; k <= volumes; k++)); do
  if [[ -n ${synced_at[$k]:-} ]]; then
    echo "$k ${synced_at[$k]}" >>"$dir/synced.log"
  else
    log "FAIL: v$k not in sync ${PMIRROR_SOAK_SYNC_BOUND:-120} s after the heal: $("$pmirrorctl" --runtime-dir "$dir/n${primary_of[$k]}/run" status "v$k" 2>&1 | tr '\n' ' ')"
    failures=$((failures + 1))
  fi
done

log "stopping the writers (their last persists drain)"
touch "$dir/stop"
for ((k = 1; k <= volumes; k++)); do
  pid=$(pid_of "$dir/n${primary_of[$k]}/writer-v$k.pid")
  kill -CONT "$pid" 2>/dev/null
  kill -TERM "$pid" 2>/dev/null
done
for ((k = 1; k <= volumes; k++)); do
  pid=$(pid_of "$dir/n${primary_of[$k]}/writer-v$k.pid")
  for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
done
# The writers' supervising loops end with them.
sleep 0.5

log "checking every acknowledged record on every copy"
: >"$dir/checks.log"
for ((k = 1; k <= volumes; k++)); do
  p=${primary_of[$k]}
  wlog=$dir/n$p/writer-v$k.log
  acked=$(awk '$1 == "acked" && $2 > m {m = $2} END {print m + 0}' "$wlog")
  tried=$(awk '($1 == "acked" || $1 == "failed") && $2 > m {m = $2} END {print m + 0}' "$wlog")
  window=$((tried > acked ? tried - acked : 1))
  for node in "n$p" ${replicas_of[$k]//,/}; do
    out=$("$writer" check --path "$dir/$node/v$k.img" --size "$size" --record-size $record_size \
      --acked "$acked" --window "$window" 2>&1)
    rc=$?
    lost=$(sed -n 's/^acknowledged .*, not intact \([0-9]*\)$/\1/p' <<<"$out")
    echo "v$k $node acked $acked lost ${lost:-unknown} exit $rc" >>"$dir/checks.log"
    if ((rc != 0)); then
      log "FAIL: v$k on $node: $(tr '\n' ' ' <<<"$out")"
      failures=$((failures + 1))
    fi
  done
done

# pmirrord after the run: still answering, and no core dump anywhere.
for ((i = 1; i <= nodes; i++)); do
  "$pmirrorctl" --socket "$dir/n$i/pmirrord.sock" status >/dev/null 2>&1 ||
    { log "FAIL: n$i's pmirrord does not answer status after the run"; failures=$((failures + 1)); }
done
if grep -l "ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:" "$dir"/n*/*.log "$dir"/n*/*.err >/dev/null 2>&1; then
  log "FAIL: a sanitizer report: $(grep -l "Sanitizer\|runtime error:" "$dir"/n*/*.log "$dir"/n*/*.err | tr '\n' ' ')"
  failures=$((failures + 1))
fi
if grep -q "core dumped\|Segmentation fault\|Aborted" "$dir"/n*/*.err "$dir"/n*/pmirrord.log 2>/dev/null; then
  log "FAIL: a crash: $(grep -l "core dumped\|Segmentation fault\|Aborted" "$dir"/n*/*.err "$dir"/n*/pmirrord.log | tr '\n' ' ')"
  failures=$((failures + 1))
fi

python3 "$repo/scripts/soak_report.py" --dir "$dir" --seed "$seed" --mode "$mode" \
  --nodes "$nodes" --volumes "$volumes" --duration "$duration" --rate "$rate" \
  --skipped "$skipped" --started "$started_at" | tee "$dir/report.md"
report_rc=${PIPESTATUS[0]}
((report_rc == 0)) || failures=$((failures + 1))
if ((failures)); then
  log "FAILED: $failures check(s); replay with the seed above; logs in $dir"
  exit 1
fi
soak_ok=1
log "passed"
exit 0

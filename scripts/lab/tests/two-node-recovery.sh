#!/usr/bin/env bash
# Runs INSIDE the two lab guests (scripts/lab/run2.sh --nvdimm --rw SHARED):
# replica recovery over rdma between two real nodes.
#
#   node b: the primary (pmirror-record-writer, a stream of self-checking
#           records) and a second replica b2 (pmirrord on b itself), ack 1;
#   node a: replica a1 (pmirrord, devdax).
#
# b drives; a obeys requests dropped in SHARED (the only channel between the
# guests besides the link under test):
#   1. kill -9 a1's pmirrord mid-stream; persists go on (b2 acknowledges);
#      restart it; a1 must get a dirty-only resync, counted against the
#      chunks the records written meanwhile touch;
#   2. 100% packet loss (netem on both eth0) for longer than
#      heartbeat_timeout, persists going on; restore; the same count;
#   3. stop the writer; every acknowledged record is on a1 and the three
#      copies have the same SHA-256.
#   two-node-recovery.sh BUILD_DIR SHARED_DIR
set -Eeuo pipefail
build=${1:?usage: two-node-recovery.sh BUILD_DIR SHARED_DIR}
shared=${2:?usage: two-node-recovery.sh BUILD_DIR SHARED_DIR}
size=${PMIRROR_LAB_VOLUME_SIZE:-128MiB}
rate=${PMIRROR_LAB_RECORD_RATE:-40}  # records per second
loss_seconds=${PMIRROR_LAB_LOSS_SECONDS:-5}
chunk=64KiB
record=4096
writer=$build/tests/integration/pmirror-record-writer
voltool=$build/tests/integration/pmirror-volume-tool
secret="lab recovery secret, long enough"
ip_a=192.168.78.1 ip_b=192.168.78.2
cfg=/tmp/recovery.yaml
runtime=/tmp/pmrun
ulimit -l unlimited
mkdir -p "$runtime"
export PMIRROR_RUNTIME_DIR=$runtime

trap 'echo "FAILED: line $LINENO: $BASH_COMMAND (exit $?)" >&2' ERR
log() { echo "[$(date +%T)] $*"; }
die() {
  echo "FAILED: $*" >&2
  local f
  for f in /tmp/a1.log /tmp/b2.log; do  # this node's pmirrord, if it runs one
    [[ -s $f ]] && { echo "--- last lines of $f" >&2; tail -n 30 "$f" >&2; }
  done
  exit 1
}

# Both nodes write the same cluster file.
a1_path=${PMIRROR_LAB_DAX_DEV:-/tmp/a1.img}
cat > "$cfg" <<YAML
cluster: {name: lab-recovery}
daemon:
  log_level: info
  heartbeat_interval: 500ms
  heartbeat_timeout: 3s
  reconnect_initial: 200ms
  reconnect_max: 1s
nodes:
  - {name: a1, address: $ip_a, port: 7450, transport: rdma, state_pool: /tmp/a1.state, control_socket: /tmp/a1.sock}
  - {name: b, address: $ip_b, port: 7460, transport: rdma, state_pool: /tmp/b.state, control_socket: /tmp/b.sock}
  - {name: b2, address: $ip_b, port: 7451, transport: rdma, state_pool: /tmp/b2.state, control_socket: /tmp/b2.sock}
volumes:
  - name: lab
    size: $size
    primary: b
    replicas: [a1, b2]
    ack: 1
    chunk: $chunk
    resync_rate: unlimited
    paths: {a1: $a1_path, b: /tmp/b.img, b2: /tmp/b2.img}
    metadata: {a1: /tmp/a1.meta, b: /tmp/b.meta, b2: /tmp/b2.meta}
    create: true
    allowed_peers: [labapp]
    secret: "$secret"
YAML

# start_daemon NODE: pmirrord in the background, waits until it listens.
start_daemon() {
  local node=$1 logf=/tmp/$1.log
  local before
  before=0
  [[ -f $logf ]] && before=$(wc -c < "$logf")
  "$build/daemon/pmirrord" --config "$cfg" --node "$node" >> "$logf" 2>&1 &
  echo $! > "/tmp/$node.pid"
  for _ in $(seq 600); do
    [[ $(tail -c +"$((before + 1))" "$logf") == *"listening on"* ]] && return 0
    kill -0 "$(cat "/tmp/$node.pid")" 2>/dev/null || { tail -20 "$logf" >&2; die "pmirrord $node exited"; }
    sleep 0.1
  done
  die "pmirrord $node never listened"
}

# wait_file PATH SECONDS
wait_file() {
  for _ in $(seq $(($2 * 10))); do [[ -e $1 ]] && return 0; sleep 0.1; done
  return 1
}

netem() {  # netem cut|restore on this guest's link
  modprobe sch_netem 2>/dev/null || true
  if [[ $1 == cut ]]; then
    tc qdisc replace dev "$PMIRROR_LAB_NETDEV" root netem loss 100%
  else
    tc qdisc del dev "$PMIRROR_LAB_NETDEV" root 2>/dev/null || true
  fi
}

case "$PMIRROR_LAB_NODE" in
a)
  [[ -n ${PMIRROR_LAB_DAX_DEV:-} ]] && "$voltool" zero "$PMIRROR_LAB_DAX_DEV" "$size"
  rm -f /tmp/a1.meta /tmp/a1.state
  start_daemon a1
  touch "$shared/a1.up"
  log "a1 serving $a1_path; waiting for requests"
  deadline=$((SECONDS + 1200))
  while ((SECONDS < deadline)); do
    if [[ -e $shared/kill9.req ]]; then
      rm -f "$shared/kill9.req"
      kill -9 "$(cat /tmp/a1.pid)"; wait "$(cat /tmp/a1.pid)" 2>/dev/null || true
      log "a1 killed with SIGKILL"; touch "$shared/kill9.done"
    elif [[ -e $shared/start.req ]]; then
      rm -f "$shared/start.req"
      start_daemon a1; log "a1 restarted"; touch "$shared/start.done"
    elif [[ -e $shared/cut.req ]]; then
      rm -f "$shared/cut.req"; netem cut; log "netem loss 100% on a"; touch "$shared/cut.done"
    elif [[ -e $shared/restore.req ]]; then
      rm -f "$shared/restore.req"; netem restore; log "netem removed on a"; touch "$shared/restore.done"
    elif [[ -e $shared/finish.req ]]; then
      rm -f "$shared/finish.req"
      kill -TERM "$(cat /tmp/a1.pid)"; wait "$(cat /tmp/a1.pid)" 2>/dev/null || true
      "$voltool" digest "$a1_path" "$size" > "$shared/a1.digest"
      acked=$(cat "$shared/acked")
      "$writer" check --path "$a1_path" --size "$size" --record-size $record \
        --acked "$acked" --window 1 --tag 1 | tee "$shared/a1.check"
      touch "$shared/finish.done"
      log "a1 done"
      exit 0
    elif [[ -e $shared/abort ]]; then
      die "node b aborted"
    fi
    sleep 0.1
  done
  die "node b never finished"
  ;;
b)
  rm -f /tmp/b.img /tmp/b.meta /tmp/b2.img /tmp/b2.meta /tmp/b2.state
  trap '[[ $? != 0 ]] && touch "$shared/abort"; kill $(cat /tmp/b2.pid 2>/dev/null) $(cat /tmp/writer.pid 2>/dev/null) 2>/dev/null || true' EXIT
  start_daemon b2
  wait_file "$shared/a1.up" 600 || die "node a never came up"
  ctl() { "$build/daemon/pmirrorctl" --socket /tmp/b2.sock --runtime-dir "$runtime" "$@"; }
  field() {  # field PEER FIELD: from the primary's status
    ctl status --json 2>/dev/null | "$writer" status-field --volume lab --peer "$1" --field "$2"
  }
  acked() { { grep '^acked ' /tmp/writer.out || true; } | tail -1 | cut -d' ' -f2; }
  request() {  # request NAME: ask node a, wait for it
    touch "$shared/$1.req"
    wait_file "$shared/$1.done" 120 || die "node a did not do '$1'"
    rm -f "$shared/$1.done"
  }
  wait_acked() {  # wait_acked N SECONDS
    for _ in $(seq $(($2 * 10))); do
      local n; n=$(acked); [[ -n $n && $n -ge $1 ]] && return 0
      kill -0 "$(cat /tmp/writer.pid)" 2>/dev/null || { cat /tmp/writer.err >&2; die "the writer died"; }
      sleep 0.1
    done
    die "the writer did not reach record $1 (at $(acked)); $(tail -3 /tmp/writer.err)"
  }
  wait_state() {  # wait_state PEER SECONDS STATE...
    local peer=$1 secs=$2; shift 2
    for _ in $(seq $((secs * 10))); do
      local s; s=$(field "$peer" state || true)
      for want in "$@"; do [[ $s == "$want" ]] && return 0; done
      sleep 0.1
    done
    die "$peer never reached state $* (is $(field "$peer" state || echo '?'))"
  }
  wait_in_sync() {  # wait_in_sync PEER SECONDS
    for _ in $(seq $(($2 * 10))); do
      if [[ $(field "$1" state || true) == connected && $(field "$1" dirty_chunks || echo 1) == 0 ]] &&
         ! field "$1" resync >/dev/null 2>&1; then
        return 0
      fi
      sleep 0.1
    done
    ctl status --json >&2 || true
    die "$1 was not back in sync within $2 s"
  }
  volume_chunks=$("$writer" chunks --size "$size" --record-size $record --chunk $chunk --from 1 --to 1000000000)
  chunks() { "$writer" chunks --size "$size" --record-size $record --chunk $chunk --from "$1" --to "$2"; }
  # check_resync WHAT PEER BASE LOWER_FROM LOWER_TO UPPER_FROM UPPER_TO
  check_resync() {
    local what=$1 peer=$2 base=$3 got lower upper total
    got=$(( $(field "$peer" resynced_chunks) - base ))
    lower=$(chunks "$4" "$5"); upper=$(chunks "$6" "$7")
    total=$("$writer" chunks --size "$size" --record-size $record --chunk $chunk --from 1 --to "$7")
    log "RESULT $what: resynced $got chunks; records $4..$5 (written while $peer was away) touch $lower; records $6..$7 touch $upper; all records so far touch $total; the volume has $volume_chunks"
    ((got >= lower)) || die "$what: $peer got $got chunks, fewer than the $lower written while it was away"
    ((got <= upper)) || die "$what: $peer got $got chunks, more than the $upper the records around its absence touch"
    ((got < volume_chunks)) || die "$what: $peer got $got chunks: the whole volume, not the dirty chunks"
  }

  "$writer" write --config "$cfg" --volume lab --node b --identity labapp --record-size $record \
    --rate "$rate" --tag 1 --open-timeout 120 > /tmp/writer.out 2> /tmp/writer.err &
  echo $! > /tmp/writer.pid
  wait_acked 200 300
  wait_in_sync a1 120
  wait_in_sync b2 60
  log "streaming; a1 and b2 in sync at record $(acked)"

  # --- 1. kill -9 a1's pmirrord mid-stream
  base=$(field a1 resynced_chunks)
  k_before=$(acked)
  request kill9
  k_killed=$(acked)
  wait_state a1 60 disconnected connecting
  wait_acked $((k_killed + 2 * rate)) 120   # ~2 s of records without a1
  k_restart=$(acked)
  request start
  wait_in_sync a1 120
  k_synced=$(acked)
  check_resync "kill -9" a1 "$base" $((k_killed + 2)) "$k_restart" \
    $((k_before > 64 ? k_before - 64 : 1)) "$k_synced"

  # --- 2. 100% packet loss on the link for longer than heartbeat_timeout
  base=$(field a1 resynced_chunks)
  k_before=$(acked)
  netem cut
  request cut
  wait_state a1 60 disconnected connecting
  k_noticed=$(acked)
  sleep "$loss_seconds"
  [[ $(field a1 state) != connected ]] || die "a1 connected through 100% loss"
  k_restore=$(acked)
  ((k_restore > k_noticed)) || die "persists stopped during the loss (at $k_restore)"
  netem restore
  request restore
  wait_in_sync a1 180
  k_synced=$(acked)
  check_resync "100% loss" a1 "$base" $((k_noticed + 2)) "$k_restore" \
    $((k_before > 64 ? k_before - 64 : 1)) "$k_synced"

  # --- 3. stop, compare
  kill -TERM "$(cat /tmp/writer.pid)"
  wait "$(cat /tmp/writer.pid)" || die "the writer failed: $(tail -5 /tmp/writer.err)"
  grep -q '^closed' /tmp/writer.out || die "the writer did not close the volume"
  final=$(acked)
  log "writer: $(grep '^slowest' /tmp/writer.out || echo 'no latency line')"
  echo "$final" > "$shared/acked"
  kill -TERM "$(cat /tmp/b2.pid)"; wait "$(cat /tmp/b2.pid)" || true
  b_digest=$("$voltool" digest /tmp/b.img "$size")
  b2_digest=$("$voltool" digest /tmp/b2.img "$size")
  request finish
  a1_digest=$(cat "$shared/a1.digest")
  log "records acknowledged: $final"
  log "b  (primary) $b_digest"
  log "b2 (replica) $b2_digest"
  log "a1 (replica) $a1_digest"
  grep -q '^OK' "$shared/a1.check" || die "a1's records: $(cat "$shared/a1.check")"
  [[ $a1_digest == "$b_digest" && $b2_digest == "$b_digest" ]] || die "the copies differ"
  log "RESULT: every acknowledged record is on a1; the three copies are equal"
  ;;
*)
  echo "PMIRROR_LAB_NODE must be a or b (run through scripts/lab/run2.sh)" >&2
  exit 2
  ;;
esac

#!/usr/bin/env bash
# Runs INSIDE the two lab guests (scripts/lab/run2.sh --nvdimm --loss ...):
# node a serves a devdax volume with pmirrord over rdma; node b mirrors
# random records to it from a plain-file local copy across the lossy link;
# then a compares the SHA-256 of its replica with b's local copy.
#   two-node-loss.sh BUILD_DIR SHARED_DIR
set -euo pipefail
build=${1:?usage: two-node-loss.sh BUILD_DIR SHARED_DIR}
shared=${2:?usage: two-node-loss.sh BUILD_DIR SHARED_DIR}
size=${PMIRROR_LAB_VOLUME_SIZE:-16MiB}
count=${PMIRROR_LAB_RECORDS:-2000}
secret="lab secret, long enough to pass"
ulimit -l unlimited
# Soft-RoCE's own counts (retransmissions, duplicates, sequence errors): what
# the lossy link did, printed when an attempt fails and at the end.
rxe_counters() {
  local dir=/sys/class/infiniband/rxe0/ports/1/hw_counters
  [[ -d $dir ]] && echo "rxe0 counters ($1): $(cd "$dir" && grep -H . -- * | grep -v ':0$' | tr '\n' ' ')"
  return 0
}

case "$PMIRROR_LAB_NODE" in
a)
  "$build/tests/integration/pmirror-volume-tool" zero "$PMIRROR_LAB_DAX_DEV" "$size"
  # The cluster file both nodes would share: b is the primary (it runs
  # pmirror-demo), a holds the replica.
  cat > /tmp/cluster.yaml <<YAML
daemon:
  state_pool: /tmp/pmirrord.state
  control_socket: /tmp/pmirrord.sock
  log_level: info
nodes:
  - {name: a, address: $PMIRROR_LAB_SELF, port: 7450, transport: rdma}
  - {name: b, address: $PMIRROR_LAB_PEER, port: 7450, transport: rdma}
volumes:
  - name: lab
    size: $size
    primary: b
    replicas: [a]
    paths: {a: $PMIRROR_LAB_DAX_DEV, b: /tmp/local.img}
    allowed_peers: [nodeb]
    secret: "$secret"
YAML
  "$build/daemon/pmirrord" --config /tmp/cluster.yaml --node a &
  daemon=$!
  for _ in $(seq 600); do
    [[ -f $shared/b.done ]] && break
    kill -0 "$daemon" || { echo "pmirrord died" >&2; exit 1; }
    sleep 0.5
  done
  [[ -f $shared/b.done ]] || { echo "node b never finished" >&2; kill "$daemon"; exit 1; }
  rxe_counters "node a, end"
  kill -TERM "$daemon"
  wait "$daemon"
  replica=$("$build/tests/integration/pmirror-volume-tool" digest "$PMIRROR_LAB_DAX_DEV" "$size")
  local_copy=$(cat "$shared/b.digest")
  echo "replica on a: $replica"
  echo "local on b:   $local_copy"
  [[ $replica == "$local_copy" ]] && echo "RESULT: replica equals the local copy" ||
    { echo "RESULT: MISMATCH" >&2; exit 1; }
  ;;
b)
  # Retry until a's daemon listens.
  for attempt in $(seq 60); do
    if "$build/examples/pmirror-demo" --volume lab --local /tmp/local.img --size "$size" \
        --replica "$PMIRROR_LAB_PEER:7450" --transport rdma --identity nodeb \
        --secret "$secret" --count "$count" --record-size 512; then
      break
    fi
    rxe_counters "node b, after attempt $attempt"
    [[ $attempt == 60 ]] && { echo "could not mirror to node a" >&2; exit 1; }
    # The local copy stays: the next attempt reopens it and resyncs what
    # the failed one left behind (its metadata says which chunks).
    sleep 1
  done
  rxe_counters "node b, end"
  "$build/tests/integration/pmirror-volume-tool" digest /tmp/local.img "$size" > "$shared/b.digest"
  touch "$shared/b.done"
  ;;
*)
  echo "PMIRROR_LAB_NODE must be a or b (run through scripts/lab/run2.sh)" >&2
  exit 2
  ;;
esac

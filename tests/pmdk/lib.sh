# Sourced by the pmirror-run tests (tests/pmdk/*.sh): one volume `v` whose
# local copy the program maps (node `app`, no daemon) and one replica served
# by a pmirrord on this machine (node `store`).
#
#   pmdk_cluster WORK SIZE POOL [TRANSPORT] [ADDRESS]   writes WORK/cluster.yaml
#   pmdk_start_daemon PMIRRORD WORK                     sets daemon_pid
#   pmdk_stop_daemon
#   fail MESSAGE                                        counts in failures

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

pmdk_cluster() {
  local work=$1 size=$2 pool=$3 transport=${4:-tcp} address=${5:-127.0.0.1}
  local port=$((20000 + RANDOM % 20000))
  head -c 32 /dev/urandom | base64 >"$work/v.secret"
  chmod 600 "$work/v.secret"
  cat >"$work/cluster.yaml" <<YAML
daemon:
  control_socket: $work/pmirrord.sock
  state_pool: $work/pmirrord.state
nodes:
  - name: app
    address: $address
    port: $((port + 1))
    state_pool: $work/app.state
    control_socket: $work/app.sock
    transport: $transport
  - name: store
    address: $address
    port: $port
    transport: $transport
volumes:
  - name: v
    size: $size
    primary: app
    replicas: [store]
    paths: {app: $pool, store: $work/replica.img}
    create: true
    allowed_peers: [app1]
    secret_file: $work/v.secret
YAML
}

daemon_pid=
pmdk_start_daemon() {
  local pmirrord=$1 work=$2
  "$pmirrord" --config "$work/cluster.yaml" --node store --foreground >>"$work/pmirrord.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 100); do
    [[ -S $work/pmirrord.sock ]] && return 0
    sleep 0.1
  done
  echo "pmirrord did not start:" >&2
  tail -20 "$work/pmirrord.log" >&2
  return 1
}

pmdk_stop_daemon() {
  [[ -n $daemon_pid ]] || return 0
  kill "$daemon_pid" 2>/dev/null
  wait "$daemon_pid" 2>/dev/null
  daemon_pid=
}

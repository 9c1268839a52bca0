# shellcheck shell=bash disable=SC2034 # its variables are for the scripts that source it
# Sourced by the pmirror-run tests (tests/pmdk/*.sh): one volume `v` whose
# local copy the program maps (node `app`, no daemon) and one or more
# replicas, each served by a pmirrord of its own on this machine: node
# `store` (WORK/replica.img, its control socket WORK/pmirrord.sock, its log
# WORK/pmirrord.log), then `store2`, `store3`, ... (WORK/replica2.img,
# WORK/store2.sock, WORK/pmirrord-store2.log, ...).
#
#   pmdk_cluster WORK SIZE POOL [TRANSPORT] [ADDRESS] [REPLICAS]
#                                   writes WORK/cluster.yaml; sets pmdk_replicas (the nodes)
#   pmdk_start_daemon PMIRRORD WORK [NODE]   sets pmdk_daemon_pids[NODE]; store (default): daemon_pid
#   pmdk_stop_daemon                         store's
#   pmdk_stop_daemons                        every replica's
#   pmdk_replica_image WORK NODE, pmdk_replica_socket WORK NODE, pmdk_replica_log WORK NODE
#   pmdk_check_image PROGRAM IMAGE LOG       a copy of IMAGE passes pmempool check and PROGRAM's checker
#   pmdk_durability MODE                     sets pmdk_run_options (pmirror-run --durability MODE)
#   pmdk_wait_bounded PID SECONDS WHAT       wait for a child; a hang is a failure with stacks
#   fail MESSAGE                             counts in failures

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

pmdk_replicas=(store)
pmdk_replica_image() { if [[ $2 == store ]]; then echo "$1/replica.img"; else echo "$1/replica${2#store}.img"; fi; }
pmdk_replica_socket() { if [[ $2 == store ]]; then echo "$1/pmirrord.sock"; else echo "$1/$2.sock"; fi; }
pmdk_replica_log() { if [[ $2 == store ]]; then echo "$1/pmirrord.log"; else echo "$1/pmirrord-$2.log"; fi; }

pmdk_cluster() {
  local work=$1 size=$2 pool=$3 transport=${4:-tcp} address=${5:-127.0.0.1} replicas=${6:-1}
  local port=$((20000 + RANDOM % 20000)) i node names paths
  pmdk_replicas=(store)
  for ((i = 2; i <= replicas; i++)); do pmdk_replicas+=("store$i"); done
  names=${pmdk_replicas[0]} paths="app: $pool"
  for node in "${pmdk_replicas[@]}"; do
    [[ $node == store ]] || names+=", $node"
    paths+=", $node: $(pmdk_replica_image "$work" "$node")"
  done
  head -c 32 /dev/urandom | base64 >"$work/v.secret"
  chmod 600 "$work/v.secret"
  {
    cat <<YAML
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
YAML
    for ((i = 2; i <= replicas; i++)); do
      cat <<YAML
  - name: store$i
    address: $address
    port: $((port + i))
    state_pool: $work/store$i.state
    control_socket: $(pmdk_replica_socket "$work" "store$i")
    transport: $transport
YAML
    done
    cat <<YAML
volumes:
  - name: v
    size: $size
    primary: app
    replicas: [$names]
    paths: {$paths}
    create: true
    allowed_peers: [app1]
    secret_file: $work/v.secret
YAML
  } >"$work/cluster.yaml"
}

daemon_pid=
declare -A pmdk_daemon_pids=()
# Waits for the child PID (its exit status is this function's) for at most
# SECONDS. A process still there then is a hang, not a slow machine: what
# each of its threads waits on (kernel and, with gdb, user stacks) goes to
# stderr, it is killed, and the status is 124 -- so that a hang costs one
# failed test with its diagnosis, not the lab's whole timeout.
pmdk_wait_bounded() {
  local pid=$1 seconds=$2 what=$3 state="" task
  # Counted in wall-clock seconds, not in rounds: in the lab's slow guest a
  # round (sed, cut, sleep) takes several times its 0.1 s.
  local deadline=$((SECONDS + seconds))
  while true; do
    state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)
    [[ -z $state || $state == Z ]] && break
    ((SECONDS < deadline)) || break
    sleep 0.1
  done
  if [[ -n $state && $state != Z ]]; then
    {
      echo "HANG: $what (pid $pid) still there after $seconds s (state $state):"
      for task in /proc/"$pid"/task/*; do
        echo "-- thread ${task##*/} ($(cat "$task/comm" 2>/dev/null)):" \
          "state $(sed 's/.*) //' "$task/stat" 2>/dev/null | cut -d' ' -f1)," \
          "waits in $(cat "$task/wchan" 2>/dev/null)"
        cat "$task/stack" 2>/dev/null
      done
      if command -v gdb >/dev/null; then
        timeout 60 gdb -batch -nx -p "$pid" -ex 'thread apply all bt' 2>&1 |
          grep -vE '^\[(New|Thread debugging)|^warning:' | head -300
      fi
    } >&2
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    return 124
  fi
  wait "$pid"
}

pmdk_start_daemon() {
  local pmirrord=$1 work=$2 node=${3:-store} socket log
  socket=$(pmdk_replica_socket "$work" "$node")
  log=$(pmdk_replica_log "$work" "$node")
  "$pmirrord" --config "$work/cluster.yaml" --node "$node" --foreground >>"$log" 2>&1 &
  pmdk_daemon_pids[$node]=$!
  [[ $node == store ]] && daemon_pid=$!
  for _ in $(seq 100); do
    [[ -S $socket ]] && return 0
    sleep 0.1
  done
  echo "pmirrord ($node) did not start:" >&2
  tail -20 "$log" >&2
  return 1
}

pmdk_stop_daemon() {
  [[ -n $daemon_pid ]] || return 0
  kill "$daemon_pid" 2>/dev/null
  wait "$daemon_pid" 2>/dev/null
  daemon_pid=
  unset 'pmdk_daemon_pids[store]'
}

# Also those stopped with SIGSTOP.
pmdk_stop_daemons() {
  local pid
  for pid in "${pmdk_daemon_pids[@]}"; do kill -CONT "$pid" 2>/dev/null && kill "$pid" 2>/dev/null; done
  for pid in "${pmdk_daemon_pids[@]}"; do wait "$pid" 2>/dev/null; done
  pmdk_daemon_pids=()
  daemon_pid=
}

# A copy of IMAGE (libpmemobj's recovery writes to what it opens) passes
# `pmempool check` and PROGRAM's checker (every transaction LOG names
# there, none torn). Prints the checker's line ("transactions K (last
# logged L)"); on failure, what failed, and returns 1.
pmdk_check_image() {
  local program=$1 image=$2 log=$3 copy=$2.copy out status=0
  cp --sparse=always "$image" "$copy"
  if ! out=$(pmempool check "$copy" 2>&1); then
    echo "pmempool check: $out"
    status=1
  elif out=$("$program" check "$copy" "$log" 2>&1); then
    echo "$out"
  else
    status=$?
    echo "the checker (exit $status$( ((status > 128)) && echo ", signal $((status - 128))")): $out" | tr '\n' ' '
    echo
    status=1
  fi
  rm -f "$copy"
  return $status
}

# pmirror-run's --durability for MODE (observed or drain; empty: none,
# pmirror-run's default) in the array pmdk_run_options; returns 2 for
# another value.
pmdk_run_options=()
pmdk_durability() {
  case ${1:-} in
    "") pmdk_run_options=() ;;
    observed | drain) pmdk_run_options=(--durability "$1") ;;
    *)
      echo "durability '$1': observed or drain" >&2
      return 2
      ;;
  esac
}

#!/usr/bin/env bash
# The quick start: installs what pmirror needs, builds it, starts a target
# (pmirrord) serving a file-backed volume on this machine over tcp, runs an
# initiator that mirrors 10,000 records to it, and shows that the replica
# matches the local copy byte for byte. Run as root on Debian 12.
#
# PMIRROR_QUICKSTART_INSTALLED=1 runs it against the installed packages
# instead (docs/packaging.md): /usr/sbin/pmirrord and /usr/sbin/pmirrorctl,
# and the example initiator compiled against libpmirror-dev (pkg-config);
# nothing is installed or built in the tree.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

work=$(mktemp -d /tmp/pmirror-quickstart.XXXXXX)
daemon_pid=
cleanup() {
  [[ -n $daemon_pid ]] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

if [[ ${PMIRROR_QUICKSTART_INSTALLED:-0} == 1 ]]; then
  pmirrord=/usr/sbin/pmirrord
  pmirrorctl=/usr/sbin/pmirrorctl
  for program in "$pmirrord" "$pmirrorctl"; do
    [[ -x $program ]] || { echo "no $program: install the pmirrord package first" >&2; exit 1; }
  done
  pkg-config --exists libpmirror ||
    { echo "pkg-config finds no libpmirror: install libpmirror-dev first" >&2; exit 1; }
  echo "== building examples/01-mirror-writes against the installed libpmirror ($(pkg-config --modversion libpmirror))"
  # shellcheck disable=SC2046  # pkg-config prints several words
  c++ -std=c++17 -O2 "$repo/examples/01-mirror-writes/mirror_writes.cpp" -o "$work/pmirror-demo" \
    $(pkg-config --cflags --libs libpmirror)
  demo=$work/pmirror-demo
else
  "$repo/scripts/install-deps.sh"
  "$repo/scripts/build.sh"
  bin=${PMIRROR_BUILD_DIR:-$repo/build}
  pmirrord=$bin/daemon/pmirrord
  pmirrorctl=$bin/daemon/pmirrorctl
  demo=$bin/examples/pmirror-demo
fi

port=${PMIRROR_PORT:-7450}
head -c 32 /dev/urandom | base64 > "$work/demo.secret"
chmod 600 "$work/demo.secret"
# The cluster file: node "demo-app" runs the initiator (pmirror-demo, no
# daemon), node "demo-replica" runs pmirrord; both on this machine, so each
# gets its own port and files. See config/cluster.example.yaml.
cat > "$work/cluster.yaml" <<YAML
daemon:
  control_socket: $work/pmirrord.sock
  state_pool: $work/pmirrord.state
  log_level: info
nodes:
  - name: demo-app
    address: 127.0.0.1
    port: $((port + 1))
    state_pool: $work/app.state
    control_socket: $work/app.sock
  - name: demo-replica
    address: 127.0.0.1
    port: $port
    transport: tcp
volumes:
  - name: demo
    size: 64MiB
    primary: demo-app
    replicas: [demo-replica]
    paths:
      demo-app: $work/local.img
      demo-replica: $work/replica.img
    create: true
    allowed_peers: [demo]
    secret_file: $work/demo.secret
YAML

echo "== starting $pmirrord (config $work/cluster.yaml, node demo-replica)"
"$pmirrord" --config "$work/cluster.yaml" --node demo-replica --foreground &
daemon_pid=$!
ctl=("$pmirrorctl" --socket "$work/pmirrord.sock" --runtime-dir "$work")
for _ in $(seq 100); do
  "${ctl[@]}" status >/dev/null 2>&1 && break
  kill -0 "$daemon_pid" 2>/dev/null || { echo "pmirrord exited; see above" >&2; exit 1; }
  sleep 0.1
done

echo "== mirroring 10000 records of 256 bytes (pmirror-demo, node demo-app)"
"$demo" --config "$work/cluster.yaml" --node demo-app --volume demo \
  --identity demo --count 10000 --record-size 256

echo "== what the replica's pmirrord says (pmirrorctl status)"
"${ctl[@]}" status

echo "== stopping pmirrord"
kill "$daemon_pid"
wait "$daemon_pid" || true
daemon_pid=

echo "== comparing the replica with the local copy"
if cmp "$work/local.img" "$work/replica.img"; then
  echo "OK: the replica ($work/replica.img) matches the local copy byte for byte"
else
  echo "MISMATCH: the replica differs from the local copy" >&2
  exit 1
fi

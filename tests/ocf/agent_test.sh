#!/usr/bin/env bash
# ocf:pmirror:pmirror on one node, without a cluster: a pmirrord serving a
# replica that an application filled, then resource-agents' ocf-tester
# (every action, in the order Pacemaker may call them), then the agent's
# own promises checked against what pmirrord reports: promote makes the
# copy primary at a new generation, demote makes it a replica again, stop
# leaves it unpromoted, and validate-all refuses files that do not hand the
# volume to Pacemaker.
#
# usage: agent_test.sh AGENT PMIRRORD PMIRRORCTL PMIRROR_DEMO
# Exit code 77 (ctest: skipped) when ocf-tester or jq is not installed
# (scripts/install-deps.sh installs both).
set -uo pipefail
agent=$1 pmirrord=$2 pmirrorctl=$3 demo=$4

for tool in ocf-tester jq; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool is not installed" >&2; exit 77; }
done

work=$(mktemp -d /tmp/pmirror-ocf.XXXXXX)
daemon_pid=
cleanup() {
  [[ -n $daemon_pid ]] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

port=$((20000 + RANDOM % 20000))
head -c 32 /dev/urandom | base64 >"$work/v.secret"
chmod 600 "$work/v.secret"
write_config() { # $1: file, $2: failover section
  cat >"$1" <<YAML
daemon:
  control_socket: $work/pmirrord.sock
  state_pool: $work/pmirrord.state
$2
nodes:
  - name: app
    address: 127.0.0.1
    port: $((port + 1))
    state_pool: $work/app.state
    control_socket: $work/app.sock
  - name: store
    address: 127.0.0.1
    port: $port
    transport: tcp
volumes:
  - name: v
    size: 16MiB
    primary: app
    replicas: [store]
    paths: {app: $work/app.img, store: $work/store.img}
    create: true
    allowed_peers: [app1]
    secret_file: $work/v.secret
YAML
}
write_config "$work/cluster.yaml" "failover: {engine: pacemaker}"
write_config "$work/manual.yaml" ""

"$pmirrord" --config "$work/cluster.yaml" --node store --foreground >"$work/pmirrord.log" 2>&1 &
daemon_pid=$!
ctl=("$pmirrorctl" --socket "$work/pmirrord.sock" --runtime-dir "$work")
for _ in $(seq 100); do
  "${ctl[@]}" status >/dev/null 2>&1 && break
  sleep 0.1
done
"${ctl[@]}" status >/dev/null || { cat "$work/pmirrord.log"; echo "FAIL: pmirrord did not start" >&2; exit 1; }
# The application writes, so that the copy holds data (an empty copy is
# never promoted), and closes.
"$demo" --config "$work/cluster.yaml" --node app --volume v --identity app1 \
  --count 200 --record-size 256 >"$work/demo.log" 2>&1 ||
  { cat "$work/demo.log"; echo "FAIL: the application could not write" >&2; exit 1; }

copy() { "${ctl[@]}" status --json v | jq -r "[.. | objects | select(.copy? != null) | .copy][0].$1"; }
written_generation=$(copy generation)
[[ $written_generation =~ ^[0-9a-f]{16}$ && $written_generation != 0000000000000000 ]] ||
  fail "the replica's generation after the writes is '$written_generation'"

export OCF_ROOT=/usr/lib/ocf HA_RSCTMP=$work/rsctmp
export PATH=$(dirname "$pmirrorctl"):$PATH
params=(-o volume=v -o config="$work/cluster.yaml" -o node=store -o runtime_dir="$work"
        -o socket="$work/pmirrord.sock" -o pmirrorctl="$pmirrorctl")
echo "== ocf-tester"
if ! ocf-tester -n pmirror-v "${params[@]}" "$agent"; then
  fail "ocf-tester"
fi

# The same actions by hand, each checked against pmirrord.
run() { # $1: action; the environment Pacemaker would give
  env OCF_RESOURCE_INSTANCE=pmirror-v OCF_RESKEY_volume=v OCF_RESKEY_config="${config:-$work/cluster.yaml}" \
    OCF_RESKEY_node=store OCF_RESKEY_runtime_dir="$work" OCF_RESKEY_socket="$work/pmirrord.sock" \
    OCF_RESKEY_pmirrorctl="$pmirrorctl" OCF_RESKEY_CRM_meta_interval=${interval:-10000} \
    "$agent" "$1" >>"$work/agent.log" 2>&1
}
expect() { # $1: expected exit code, $2: action, $3: what it means
  run "$2"
  local rc=$?
  [[ $rc -eq $1 ]] || fail "$2: exit code $rc, expected $1 ($3)"
}
echo "== actions checked against pmirrord"
expect 7 monitor "stopped after ocf-tester"
[[ $(copy promoted) == false ]] || fail "the copy is promoted after ocf-tester's last stop"
expect 0 start "start"
expect 0 monitor "started, a replica"
before=$(copy generation)
expect 0 promote "promote"
expect 8 monitor "promoted"
[[ $(copy promoted) == true ]] || fail "pmirrord's copy is not promoted after promote"
after=$(copy generation)
[[ $after != "$before" ]] || fail "promote did not give the copy a new generation ($before)"
[[ $(copy 'history[0]') == "$before" ]] || fail "the generation before promote ($before) is not first in the history"
expect 0 promote "promote of a promoted copy"
[[ $(copy generation) == "$after" ]] || fail "a second promote changed the generation"
# The application may not open the volume on its node while the copy here
# is promoted: its sessions are refused (the old primary is fenced out).
if "$demo" --config "$work/cluster.yaml" --node app --volume v --identity app1 \
  --count 1 --record-size 256 >"$work/demo2.log" 2>&1; then
  fail "the old primary wrote to a copy promoted by the agent"
fi
expect 0 demote "demote"
expect 0 monitor "demoted: a replica"
[[ $(copy promoted) == false ]] || fail "pmirrord's copy is still promoted after demote"
expect 0 promote "promote again"
interval=0 expect 8 monitor "a probe finds the promoted copy"
expect 0 stop "stop of a promoted copy"
[[ $(copy promoted) == false ]] || fail "stop left the copy promoted"
interval=0 expect 7 monitor "a probe after stop"
expect 0 stop "stop of a stopped copy"

echo "== validate-all refuses what Pacemaker cannot drive"
config=$work/manual.yaml expect 6 validate-all "a file without failover.engine: pacemaker"
config=$work/missing.yaml expect 5 validate-all "a file that does not exist"
env OCF_RESOURCE_INSTANCE=pmirror-w OCF_RESKEY_volume=w OCF_RESKEY_config="$work/cluster.yaml" \
  OCF_RESKEY_pmirrorctl="$pmirrorctl" "$agent" validate-all >>"$work/agent.log" 2>&1
[[ $? -eq 6 ]] || fail "validate-all of a volume the file does not name is not 6"
grep -q "failover.engine is none, not pacemaker" "$work/agent.log" ||
  fail "validate-all does not say why the manual file is refused"

echo "== pmirrord is down: a started copy fails its monitor, a probe finds it stopped"
expect 0 start "start before pmirrord goes"
kill "$daemon_pid"; wait "$daemon_pid" 2>/dev/null; daemon_pid=
expect 1 monitor "pmirrord gone under a started copy"
expect 0 stop "stop with pmirrord gone"
interval=0 expect 7 monitor "a probe with pmirrord gone"

if [[ $failures -ne 0 ]]; then
  echo "--- agent log"; cat "$work/agent.log"
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "OK"

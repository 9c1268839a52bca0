#!/usr/bin/env bash
# A real three-node Pacemaker + Corosync cluster on this one machine, with
# ocf:pmirror:pmirror (ocf/pmirror) managing a pmirror volume as a
# promotable clone and a test application colocated with the promoted role
# (docs/failover.md section 3). Each run: start the cluster, let Pacemaker
# promote a copy and start the application there, let it acknowledge ~100
# records, cut the promoted node off like a power cut (its link down, then
# kill -9 of every process it has), and check that Pacemaker promotes
# another copy, that the application starts there and goes on writing, and
# that every record the old application saw acknowledged is on the new
# primary's copy. Prints, from the cut to the new application's first
# acknowledged record, every run's time, the median and the maximum, and the
# load average. Exit 0 only if every run passed every check.
#
#   scripts/pacemaker-cluster.sh [RUNS (default 3)] [BUILD_DIR (default build)]
#
# Runs as root (namespaces, mounts, apt-get); needs no systemd.
#
# Decisions:
# - One machine, three nodes n1..n3: network namespaces pmn1..pmn3 (veth
#   into a bridge pmbr0 in the root namespace, 10.77.0.1..3/24). Every node
#   runs under `ip netns exec pmnI unshare --mount --uts --pid --fork
#   --mount-proc`: a private mount namespace (its own /etc/corosync,
#   /var/lib/corosync, /var/lib/pacemaker, /var/log/pacemaker,
#   /var/log/cluster bound from the run's directory; tmpfs on /run and
#   /dev/shm, because libqb's IPC uses abstract sockets (per network
#   namespace, so that part is private already) and /dev/shm files named by
#   pid, which collide across pid namespaces), hostname nI (Pacemaker node
#   name = corosync name = pmirror node name), and a pid namespace whose
#   first process is the node's "init" (below): kill -9 of it ends every
#   process of the node at once, which is the power cut.
# - Nothing is started through systemd: the node's init starts pmirrord
#   (--foreground), `corosync -f` and `pacemakerd`, and waits.
# - corosync: knet, no crypto, votequorum; token 1500 ms with
#   token_coefficient 0 (the default would be 3000 + 650 per node past two;
#   1500 still leaves room for a 2-core machine that is compiling).
# - Pacemaker: stonith-enabled=false. A production cluster needs STONITH:
#   pmirror's own fence at the targets (pmirrorctl promote) keeps the old
#   primary from changing any copy, but Pacemaker only knows that a lost
#   node's resources are stopped if it was fenced. Here the lost node is
#   really dead (its pid namespace is gone), so not fencing is safe.
#   no-quorum-policy=stop.
# - The agent under test is the repository's ocf/pmirror, bound (with the
#   test application's agent, see below) over
#   /usr/lib/ocf/resource.d/pmirror inside the nodes' mount namespaces only:
#   an installed pmirrord package is neither used nor touched.
# - Resources (cibadmin, no pcs/crmsh): the clone vol-clone of
#   ocf:pmirror:pmirror (promotable, promoted-max=1, notify=true, monitors
#   every 2 s promoted / 3 s unpromoted) and app, ocf:pmirror:pmirror-test-app
#   (an agent written by this script: runs pmirror-record-writer), colocated
#   INFINITY with the promoted role and ordered after the promotion.
# - The volume (cluster.yaml, one file for every node): failover.engine
#   pacemaker, 64 MiB, primary n1, replicas n2 n3, ack 1. ack 1 because the
#   dead node stays dead: with ack = all replicas the new primary's only
#   reachable replica would not be enough and its persists would fail. With
#   ack 1 a record acknowledged by one replica only may be missing on the
#   other: the agent must promote the copy that is furthest on (its
#   promotion rules), and the checks below prove it did.
# - A fresh volume has no data and the agent never promotes an empty copy,
#   so before Pacemaker gets the resources the configured primary n1 writes
#   records 1..10 (tag 9) through libpmirror outside Pacemaker: the volume's
#   first life, as an operator would bring it up.
# - Applications: the one on node nI writes records from FIRST[I] with tag
#   I (n1: 1001.., n2: 6001.., n3: 11001..), 50 per second, and prints
#   "acked SEQ" to app-nI.out: which node's application wrote what is plain
#   from the records and the files.
# - The measured time: from just before the link goes down to the first
#   "acked" line of another node's application (polled every 20 ms). Each
#   run also prints where it went, from the new primary's logs: the node
#   lost (corosync), the promote started, pmirrord's copy promoted, the
#   promote done (pmirrord waits for the fence of every other node, the
#   dead one's included, up to its fence timeout), the application started,
#   its volume open (libpmirror tries every replica, the dead one too).
# - Every run starts from a fresh directory (new copies, state pools, CIB,
#   corosync state); everything (processes, namespaces, bridge, mounts,
#   which die with the namespaces) is removed on exit, failure included, and
#   leftovers of an aborted run are removed first.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runs=${1:-3}
build=$(cd "${2:-$repo/build}" && pwd)
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [RUNS] [BUILD_DIR]" >&2; exit 2; }
[[ $EUID -eq 0 ]] || { echo "$0: run as root (namespaces, mounts)" >&2; exit 1; }

pmirrord=$build/daemon/pmirrord
pmirrorctl=$build/daemon/pmirrorctl
writer=$(find "$build" -name pmirror-record-writer -type f -perm -u+x | head -1)
for program in "$pmirrord" "$pmirrorctl" "$writer"; do
  [[ -x $program ]] || { echo "no ${program:-pmirror-record-writer} in $build: build first" >&2; exit 1; }
done

# ------------------------------------------------------------ packages
# What a clean Debian 12 lacks: the cluster stack, its CLI, the OCF shell
# functions (resource-agents) and jq (the agent's JSON).
need=()
command -v corosync >/dev/null || need+=(corosync)
command -v pacemakerd >/dev/null || need+=(pacemaker)
command -v cibadmin >/dev/null || need+=(pacemaker-cli-utils)
[[ -r /usr/lib/ocf/lib/heartbeat/ocf-shellfuncs ]] || need+=(resource-agents)
command -v jq >/dev/null || need+=(jq)
command -v ip >/dev/null || need+=(iproute2)
command -v nsenter >/dev/null || need+=(util-linux)
if ((${#need[@]})); then
  echo "== installing ${need[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi
# pacemaker's package starts its services where systemd runs; not here
# (and a cluster of the root namespace would be none of ours anyway).

# ------------------------------------------------------------ constants
work=/tmp/pmirror-pacemaker  # fixed, so that a later run finds leftovers
bridge=pmbr0
subnet=10.77.0
nodes=(1 2 3)
size=64MiB
record=4096
declare -A first=([1]=1001 [2]=6001 [3]=11001)
app_count=4000 # 80 s at 50 records/s: more than a run needs
ocf_dir=/usr/lib/ocf/resource.d/pmirror

log() { echo "[$(date +%T)] $*"; }

# ------------------------------------------------------------ clean-up
node_pid() { cat "$work/node$1.pid" 2>/dev/null || true; }

teardown() {
  local i pids pid
  for i in "${nodes[@]}"; do
    # Every process of the node's network namespace (started by this
    # script: its init, the daemons, nsenter'ed commands), by id.
    pids=$(ip netns pids "pmn$i" 2>/dev/null || true)
    pid=$(node_pid "$i")
    [[ -n $pid ]] && pids="$pids $pid"
    for pid in $pids; do kill -9 "$pid" 2>/dev/null || true; done
  done
  for i in "${nodes[@]}"; do
    for _ in $(seq 50); do
      [[ -z $(ip netns pids "pmn$i" 2>/dev/null) ]] && break
      sleep 0.1
    done
    ip netns del "pmn$i" 2>/dev/null || true
    ip link del "pmv$i" 2>/dev/null || true
    rm -f "$work/node$i.pid"
  done
  ip link del "$bridge" 2>/dev/null || true
}

cleanup() {
  local rc=$?
  teardown
  if [[ -e $work/created-ocf-dir ]]; then
    rmdir "$ocf_dir" 2>/dev/null || true
    rm -f "$work/created-ocf-dir"
  fi
  [[ $rc -ne 0 ]] && echo "(logs of the last run stay in $work)" >&2
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

teardown # leftovers of an aborted run
mkdir -p "$work"
rm -rf "$work"/run*
# A mount point for the agents inside the nodes' mount namespaces.
if [[ ! -d $ocf_dir ]]; then
  mkdir -p "$ocf_dir"
  touch "$work/created-ocf-dir"
fi
mkdir -p /var/log/cluster # corosync's log directory, bound per node

# ------------------------------------------------------------ agents
mkdir -p "$work/agents"
cp "$repo/ocf/pmirror" "$work/agents/pmirror"
# The application: pmirror-record-writer on the node it is started on,
# records from FIRST[node] with tag = node number, "acked SEQ" lines to
# OUTDIR/app-NODE.out. Monitor: the process lives.
cat >"$work/agents/pmirror-test-app" <<'AGENT'
#!/bin/sh
: "${OCF_FUNCTIONS_DIR:=${OCF_ROOT:-/usr/lib/ocf}/lib/heartbeat}"
. "${OCF_FUNCTIONS_DIR}/ocf-shellfuncs"
pidfile="${HA_RSCTMP}/pmirror-test-app.pid"
meta() {
	cat <<END
<?xml version="1.0"?>
<!DOCTYPE resource-agent SYSTEM "ra-api-1.dtd">
<resource-agent name="pmirror-test-app" version="1.0">
<version>1.0</version>
<longdesc lang="en">pmirror-record-writer as a test application (scripts/pacemaker-cluster.sh).</longdesc>
<shortdesc lang="en">pmirror test application</shortdesc>
<parameters>
<parameter name="writer" required="1"><content type="string"/><shortdesc lang="en">writer</shortdesc></parameter>
<parameter name="config" required="1"><content type="string"/><shortdesc lang="en">cluster file</shortdesc></parameter>
<parameter name="outdir" required="1"><content type="string"/><shortdesc lang="en">output directory</shortdesc></parameter>
<parameter name="count" required="0"><content type="integer" default="4000"/><shortdesc lang="en">records</shortdesc></parameter>
</parameters>
<actions>
<action name="start" timeout="20s"/><action name="stop" timeout="20s"/>
<action name="monitor" timeout="10s" interval="2s"/><action name="meta-data" timeout="5s"/>
</actions>
</resource-agent>
END
}
running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
app_monitor() {
	running && return $OCF_SUCCESS
	if [ -f "$pidfile" ] && ! ocf_is_probe; then
		ocf_exit_reason "the record writer exited"
		return $OCF_ERR_GENERIC
	fi
	return $OCF_NOT_RUNNING
}
app_start() {
	running && return $OCF_SUCCESS
	node=$(uname -n)
	case $node in n1) first=1001 ;; n2) first=6001 ;; n3) first=11001 ;; *) return $OCF_ERR_CONFIGURED ;; esac
	mkdir -p "$HA_RSCTMP"
	echo "start $(date +%s%N)" >>"$OCF_RESKEY_outdir/app-$node.events"
	PMIRROR_RUNTIME_DIR=/run/pmirror setsid "$OCF_RESKEY_writer" write --config "$OCF_RESKEY_config" \
		--volume v --node "$node" --identity app --record-size 4096 --first-seq "$first" \
		--count "${OCF_RESKEY_count:-4000}" --tag "${node#n}" --rate 50 --hold-open --open-timeout 30 \
		>>"$OCF_RESKEY_outdir/app-$node.out" 2>>"$OCF_RESKEY_outdir/app-$node.err" </dev/null &
	echo $! >"$pidfile"
	return $OCF_SUCCESS
}
app_stop() {
	if running; then
		pid=$(cat "$pidfile")
		kill -TERM "$pid"
		i=0
		while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
		kill -KILL "$pid" 2>/dev/null
	fi
	rm -f "$pidfile"
	return $OCF_SUCCESS
}
case $__OCF_ACTION in
meta-data) meta; exit $OCF_SUCCESS ;;
start) app_start ;;
stop) app_stop ;;
monitor | status) app_monitor ;;
validate-all) exit $OCF_SUCCESS ;;
*) exit $OCF_ERR_UNIMPLEMENTED ;;
esac
AGENT
chmod 755 "$work/agents/pmirror" "$work/agents/pmirror-test-app"

# ------------------------------------------------------------ node init
# Runs as the first process of a node's pid namespace (inside its network,
# mount and UTS namespaces): private directories, then pmirrord, corosync,
# pacemakerd. Arguments: node number, run directory.
cat >"$work/node-init.sh" <<'INIT'
#!/usr/bin/env bash
set -euo pipefail
i=$1 run=$2 agents=$3 pmirrord=$4
d=$run/n$i
hostname "n$i"
# Nothing mounted here propagates back to the root namespace.
mount --make-rprivate /
bind() { mkdir -p "$d/$1" "$2"; mount --bind "$d/$1" "$2"; }
bind etc-corosync /etc/corosync
bind lib-corosync /var/lib/corosync
bind lib-pacemaker /var/lib/pacemaker
bind log-pacemaker /var/log/pacemaker
bind log-cluster /var/log/cluster
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount --bind "$agents" /usr/lib/ocf/resource.d/pmirror
cp "$run/corosync.conf" /etc/corosync/corosync.conf
mkdir -p /var/lib/pacemaker/{cib,pengine,blackbox,cores} /run/pmirror /run/crm /run/resource-agents
chown -R hacluster:haclient /var/lib/pacemaker /var/log/pacemaker /run/crm
chmod 750 /var/lib/pacemaker/{cib,pengine,blackbox,cores}
chmod 770 /var/log/pacemaker
ip link set lo up

"$pmirrord" --config "$run/cluster.yaml" --node "n$i" --foreground >"$d/pmirrord.log" 2>&1 &
corosync -f >"$d/corosync.out" 2>&1 &
for _ in $(seq 100); do
  corosync-cmapctl totem.cluster_name >/dev/null 2>&1 && break
  sleep 0.1
done
export PCMK_logfile=/var/log/pacemaker/pacemaker.log
pacemakerd >"$d/pacemakerd.out" 2>&1 &
# Stay (as the namespace's init: its end ends the node) and reap orphans.
sleep infinity &
wait
INIT
chmod 755 "$work/node-init.sh"

# ------------------------------------------------------------ helpers
# Runs a command inside node I (all its namespaces).
in_node() {
  local i=$1
  shift
  nsenter --target "$(node_pid "$i")" --net --mount --uts --pid -- "$@"
}

# Waits up to $1 seconds for a command to succeed.
wait_for() {
  local seconds=$1
  shift
  local deadline=$((SECONDS + seconds))
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

acked_count() { grep -c '^acked' "$1" 2>/dev/null || true; }
last_acked() { grep '^acked' "$1" 2>/dev/null | tail -1 | awk '{print $2}'; }

network_up() {
  ip link add "$bridge" type bridge
  ip addr add "$subnet.254/24" dev "$bridge"
  ip link set "$bridge" up
  local i
  for i in "${nodes[@]}"; do
    ip netns add "pmn$i"
    ip link add "pmv$i" type veth peer name eth0 netns "pmn$i"
    ip link set "pmv$i" master "$bridge" up
    ip -n "pmn$i" addr add "$subnet.$i/24" dev eth0
    ip -n "pmn$i" link set eth0 up
    ip -n "pmn$i" link set lo up
  done
}

write_configs() { # $1: run directory
  local run=$1 i
  head -c 32 /dev/urandom | base64 >"$run/v.secret"
  chmod 600 "$run/v.secret"
  {
    echo "cluster: {name: pacemaker-test}"
    echo "daemon:"
    echo "  control_socket: /run/pmirror/pmirrord.sock"
    echo "failover: {engine: pacemaker}"
    echo "nodes:"
    for i in "${nodes[@]}"; do
      echo "  - name: n$i"
      echo "    address: $subnet.$i"
      echo "    port: 7450"
      echo "    transport: tcp"
      echo "    state_pool: $run/n$i/pmirrord.state"
    done
    echo "volumes:"
    echo "  - name: v"
    echo "    size: $size"
    echo "    primary: n1"
    echo "    replicas: [n2, n3]"
    echo "    ack: 1"
    echo "    paths: {n1: $run/n1/v.img, n2: $run/n2/v.img, n3: $run/n3/v.img}"
    echo "    create: true"
    echo "    allowed_peers: [app]"
    echo "    secret_file: $run/v.secret"
  } >"$run/cluster.yaml"
  {
    cat <<EOF
totem {
	version: 2
	cluster_name: pmirror-test
	transport: knet
	crypto_cipher: none
	crypto_hash: none
	token: 1500
	token_coefficient: 0
}
logging {
	to_stderr: no
	to_syslog: no
	to_logfile: yes
	logfile: /var/log/cluster/corosync.log
	timestamp: on
}
quorum {
	provider: corosync_votequorum
}
uidgid {
	gid: haclient
}
nodelist {
EOF
    for i in "${nodes[@]}"; do
      printf '\tnode {\n\t\tname: n%s\n\t\tnodeid: %s\n\t\tring0_addr: %s\n\t}\n' "$i" "$i" "$subnet.$i"
    done
    echo "}"
  } >"$run/corosync.conf"
}

start_node() { # $1: node number, $2: run directory
  local i=$1 run=$2 upid pid=
  mkdir -p "$run/n$i"
  ip netns exec "pmn$i" unshare --mount --uts --pid --fork --mount-proc \
    "$work/node-init.sh" "$i" "$run" "$work/agents" "$pmirrord" >"$run/n$i/init.log" 2>&1 &
  upid=$!
  disown "$upid" # its end (kill -9) is the test, not news
  # The namespace's first process is unshare's child.
  for _ in $(seq 50); do
    pid=$(cat "/proc/$upid/task/$upid/children" 2>/dev/null | awk '{print $1}')
    [[ -n $pid ]] && break
    sleep 0.1
  done
  [[ -n $pid ]] || { echo "node n$i did not start: $(cat "$run/n$i/init.log")" >&2; return 1; }
  echo "$pid" >"$work/node$i.pid"
}

pmirrord_up() { in_node "$1" "$pmirrorctl" --runtime-dir /run/pmirror --timeout 2000 status >/dev/null 2>&1; }

cluster_online() { # $1: node to ask; all three online and a DC
  local out
  out=$(in_node "$1" crm_mon -1 2>/dev/null) || return 1
  grep -q "Current DC: n" <<<"$out" && grep -Eq "Online: \[ n1 n2 n3 \]" <<<"$out"
}

configure_cib() { # $1: node to configure through, $2: run directory
  local i=$1 run=$2
  in_node "$i" crm_attribute --type crm_config --name stonith-enabled --update false
  in_node "$i" crm_attribute --type crm_config --name no-quorum-policy --update stop
  in_node "$i" cibadmin --create --scope resources --xml-text "
<clone id=\"vol-clone\">
  <meta_attributes id=\"vol-clone-meta\">
    <nvpair id=\"vol-clone-promotable\" name=\"promotable\" value=\"true\"/>
    <nvpair id=\"vol-clone-promoted-max\" name=\"promoted-max\" value=\"1\"/>
    <nvpair id=\"vol-clone-promoted-node-max\" name=\"promoted-node-max\" value=\"1\"/>
    <nvpair id=\"vol-clone-clone-max\" name=\"clone-max\" value=\"3\"/>
    <nvpair id=\"vol-clone-clone-node-max\" name=\"clone-node-max\" value=\"1\"/>
    <nvpair id=\"vol-clone-notify\" name=\"notify\" value=\"true\"/>
  </meta_attributes>
  <primitive id=\"vol\" class=\"ocf\" provider=\"pmirror\" type=\"pmirror\">
    <instance_attributes id=\"vol-params\">
      <nvpair id=\"vol-volume\" name=\"volume\" value=\"v\"/>
      <nvpair id=\"vol-config\" name=\"config\" value=\"$run/cluster.yaml\"/>
      <nvpair id=\"vol-pmirrorctl\" name=\"pmirrorctl\" value=\"$pmirrorctl\"/>
      <nvpair id=\"vol-runtime-dir\" name=\"runtime_dir\" value=\"/run/pmirror\"/>
    </instance_attributes>
    <operations>
      <op id=\"vol-start\" name=\"start\" interval=\"0s\" timeout=\"30s\"/>
      <op id=\"vol-stop\" name=\"stop\" interval=\"0s\" timeout=\"60s\"/>
      <op id=\"vol-promote\" name=\"promote\" interval=\"0s\" timeout=\"60s\"/>
      <op id=\"vol-demote\" name=\"demote\" interval=\"0s\" timeout=\"60s\"/>
      <op id=\"vol-notify\" name=\"notify\" interval=\"0s\" timeout=\"20s\"/>
      <op id=\"vol-monitor-promoted\" name=\"monitor\" interval=\"2s\" role=\"Promoted\" timeout=\"20s\"/>
      <op id=\"vol-monitor-unpromoted\" name=\"monitor\" interval=\"3s\" role=\"Unpromoted\" timeout=\"20s\"/>
    </operations>
  </primitive>
</clone>"
  in_node "$i" cibadmin --create --scope resources --xml-text "
<primitive id=\"app\" class=\"ocf\" provider=\"pmirror\" type=\"pmirror-test-app\">
  <instance_attributes id=\"app-params\">
    <nvpair id=\"app-writer\" name=\"writer\" value=\"$writer\"/>
    <nvpair id=\"app-config\" name=\"config\" value=\"$run/cluster.yaml\"/>
    <nvpair id=\"app-outdir\" name=\"outdir\" value=\"$run\"/>
    <nvpair id=\"app-count\" name=\"count\" value=\"$app_count\"/>
  </instance_attributes>
  <operations>
    <op id=\"app-start\" name=\"start\" interval=\"0s\" timeout=\"20s\"/>
    <op id=\"app-stop\" name=\"stop\" interval=\"0s\" timeout=\"20s\"/>
    <op id=\"app-monitor\" name=\"monitor\" interval=\"2s\" timeout=\"10s\"/>
  </operations>
</primitive>"
  in_node "$i" cibadmin --create --scope constraints --xml-text \
    '<rsc_colocation id="app-with-promoted" rsc="app" with-rsc="vol-clone" with-rsc-role="Promoted" score="INFINITY"/>'
  in_node "$i" cibadmin --create --scope constraints --xml-text \
    '<rsc_order id="promote-then-app" first="vol-clone" first-action="promote" then="app" then-action="start" kind="Mandatory"/>'
}

# The node whose application acknowledged records, other than $1 (0: any).
writing_node() {
  local i
  for i in "${nodes[@]}"; do
    [[ $i == "$1" ]] && continue
    [[ $(acked_count "$run/app-n$i.out") -gt 0 ]] && { echo "$i"; return 0; }
  done
  return 1
}

# Which nodes Pacemaker has the clone promoted on, asked at node $1.
promoted_nodes() {
  in_node "$1" crm_mon -1 --output-as=xml 2>/dev/null |
    tr -d '\n' | grep -o '<resource id="vol"[^>]*role="Promoted"[^>]*>[^/]*<node name="[^"]*"' |
    sed 's/.*<node name="\([^"]*\)"/\1/' | sort | tr '\n' ' ' | sed 's/ $//'
}

status_json() { # $1: node; what its processes (pmirrord, an application) report
  in_node "$1" "$pmirrorctl" --runtime-dir /run/pmirror --timeout 5000 status --json v 2>/dev/null
}

copy_field() { # $1: node, $2: jq filter on pmirrord's copy of v
  status_json "$1" | jq -r "[(.processes // [.])[] | select(.process.kind == \"pmirrord\")
    | .volumes[]? | select(.name == \"v\") | .copy][0] | $2"
}

# Milliseconds from the cut to the first line of file $1 after the cut that
# matches $3; its time stamp is the line's first $2 characters ("-" if none).
phase_ms() {
  local line stamp ns
  while IFS= read -r line; do
    stamp=$(cut -c1-"$2" <<<"$line")
    ns=$(date -d "$stamp" +%s%N 2>/dev/null) || continue
    ((ns >= t_cut)) || continue
    echo $(((ns - t_cut) / 1000000))
    return
  done < <(grep -E "$3" "$1" 2>/dev/null)
  echo "-"
}

# Where the time went, from the new primary's logs.
breakdown() {
  local pl=$run/n$new/log-pacemaker/pacemaker.log
  echo "n$old lost $(phase_ms "$pl" 19 "Node n$old state is now lost") ms," \
    "promote started $(phase_ms "$pl" 19 "executing - rsc:vol action:promote") ms," \
    "copy promoted $(phase_ms "$run/n$new/pmirrord.log" 23 "promoted on node n$new") ms," \
    "promote done $(phase_ms "$pl" 19 "vol promote \(call") ms," \
    "app started $(phase_ms "$pl" 19 "executing - rsc:app action:start") ms," \
    "volume opened $(phase_ms "$run/app-n$new.err" 23 "replica n$other: .*-> connected|replica n$other: connecting -> syncing") ms"
}

check_records() { # description, args for pmirror-record-writer check
  local what=$1
  shift
  local out
  if out=$("$writer" check --size "$size" --record-size "$record" "$@" 2>&1); then
    log "  ok: $what ($(tail -1 <<<"$out"))"
  else
    log "  FAIL: $what: $out"
    failures=$((failures + 1))
  fi
}

fail() {
  log "  FAIL: $*"
  failures=$((failures + 1))
}

dump_logs() { # what to look at when a run goes wrong
  local i
  for i in "${nodes[@]}"; do
    echo "--- n$i: pacemaker.log (agent lines, last 30)"
    grep -E "pmirror|app|error|warning" "$run/n$i/log-pacemaker/pacemaker.log" 2>/dev/null | tail -30 || true
    echo "--- n$i: app-n$i.err"
    tail -5 "$run/app-n$i.err" 2>/dev/null || true
  done
}

# ------------------------------------------------------------ runs
times=()
total_failures=0
for ((r = 1; r <= runs; r++)); do
  failures=0
  run=$work/run$r
  mkdir -p "$run"
  log "== run $r: three nodes in $run"
  network_up
  write_configs "$run"
  for i in "${nodes[@]}"; do mkdir -p "$run/n$i"; done
  "$pmirrorctl" config check "$run/cluster.yaml" --node n1 --volume v --engine pacemaker >"$run/config-check.txt" 2>&1 ||
    { cat "$run/config-check.txt"; exit 1; }
  for i in "${nodes[@]}"; do start_node "$i" "$run"; done
  for i in "${nodes[@]}"; do
    wait_for 60 pmirrord_up "$i" || { cat "$run/n$i/pmirrord.log"; echo "pmirrord on n$i did not start" >&2; exit 1; }
  done
  # The volume's first life: the configured primary writes records 1..10
  # (an empty copy is never promoted), then closes.
  in_node 1 env PMIRROR_RUNTIME_DIR=/run/pmirror "$writer" write --config "$run/cluster.yaml" --volume v \
    --node n1 --identity app --record-size "$record" --first-seq 1 --count 10 --tag 9 --open-timeout 30 \
    >"$run/bootstrap.out" 2>&1 || { cat "$run/bootstrap.out"; echo "the first write failed" >&2; exit 1; }
  wait_for 90 cluster_online 1 || { in_node 1 crm_mon -1 || true; echo "the cluster did not come up" >&2; exit 1; }
  log "cluster up (DC elected, n1 n2 n3 online); configuring resources"
  configure_cib 1 "$run" >"$run/cib.log" 2>&1 || { cat "$run/cib.log"; exit 1; }

  # The first primary: wherever Pacemaker promotes; its application writes.
  if ! wait_for 90 writing_node 0 >/dev/null; then
    in_node 1 crm_mon -1 -A || true
    dump_logs
    echo "no application acknowledged records within 90 s" >&2
    exit 1
  fi
  old=$(writing_node 0)
  wait_for 60 eval '[[ $(acked_count "$run/app-n$old.out") -ge 100 ]]' ||
    { dump_logs; echo "n$old's application did not reach 100 records" >&2; exit 1; }
  log "n$old is promoted and its application acknowledged $(acked_count "$run/app-n$old.out") records; cutting n$old off"

  # The power cut: nothing more leaves the node, then all of it dies.
  t_cut=$(date +%s%N)
  ip link set "pmv$old" down
  kill -9 "$(node_pid "$old")"
  rm -f "$work/node$old.pid"
  survivors=()
  for i in "${nodes[@]}"; do [[ $i != "$old" ]] && survivors+=("$i"); done

  new=
  deadline=$((SECONDS + 120))
  while ((SECONDS < deadline)); do
    if new=$(writing_node "$old"); then break; fi
    sleep 0.02
  done
  t_first=$(date +%s%N)
  if [[ -z $new ]]; then
    in_node "${survivors[0]}" crm_mon -1 -A || true
    dump_logs
    echo "no other node's application acknowledged a record within 120 s of the cut" >&2
    exit 1
  fi
  ms=$(((t_first - t_cut) / 1000000))
  times+=("$ms")
  log "n$new's application acknowledged its first record $ms ms after the cut"
  other=${survivors[0]}
  [[ $other == "$new" ]] && other=${survivors[1]}
  log "  after the cut: $(breakdown)"

  # It goes on writing.
  wait_for 30 eval '[[ $(acked_count "$run/app-n$new.out") -ge 50 ]]' ||
    fail "n$new's application did not acknowledge 50 records"

  log "checks:"
  acked_old=$(last_acked "$run/app-n$old.out")
  acked_new=$(last_acked "$run/app-n$new.out")
  # Every record the old application saw acknowledged is on the new
  # primary's copy, and (ack 1: the one replica the new primary reaches is
  # in sync with it) on the other survivor's.
  check_records "n$old's records ${first[$old]}..$acked_old (tag $old) on the new primary n$new" \
    --path "$run/n$new/v.img" --first "${first[$old]}" --last "$acked_old" --tag "$old"
  check_records "n$old's records ${first[$old]}..$acked_old (tag $old) on n$other" \
    --path "$run/n$other/v.img" --first "${first[$old]}" --last "$acked_old" --tag "$old"
  check_records "the first life's records 1..10 on n$new" \
    --path "$run/n$new/v.img" --first 1 --last 10 --tag 9
  check_records "n$new's records ${first[$new]}..$acked_new (tag $new) on n$new" \
    --path "$run/n$new/v.img" --first "${first[$new]}" --last "$acked_new" --tag "$new"
  check_records "n$new's records ${first[$new]}..$acked_new (tag $new) on n$other" \
    --path "$run/n$other/v.img" --first "${first[$new]}" --last "$acked_new" --tag "$new"
  # The dead node's copy is not used: none of the new application's records.
  check_records "none of n$new's records on the dead n$old's copy" \
    --path "$run/n$old/v.img" --first "${first[$new]}" --last $((first[$new] + app_count - 1)) --absent
  # Exactly one promoted copy, the new primary's, in Pacemaker's and in
  # pmirrord's view; the application runs there and nowhere else.
  for i in "${survivors[@]}"; do
    promoted=$(promoted_nodes "$i")
    [[ $promoted == "n$new" ]] || fail "Pacemaker, asked on n$i, has the clone promoted on '$promoted', not n$new"
  done
  status_json "$new" >"$run/status-n$new.json" || true
  status_json "$other" >"$run/status-n$other.json" || true
  # pmirrord reports the copy an application has open as in use by the
  # local primary (its metadata is the application's then), not as promoted.
  [[ $(copy_field "$new" '(.promoted == true or .in_use_by_local_primary == true)') == true ]] ||
    fail "pmirrord on n$new reports its copy neither promoted nor in use by the application"
  [[ $(jq -r '[(.processes // [.])[] | select(.process.kind == "initiator") | .volumes[]?
        | select(.name == "v") | .role][0]' "$run/status-n$new.json") == primary ]] ||
    fail "no application on n$new has v open as the primary"
  [[ $(copy_field "$other" '(.promoted == true or .in_use_by_local_primary == true)') == false ]] ||
    fail "pmirrord on n$other reports its copy promoted or in use"
  app_at=$(in_node "$new" crm_resource --resource app --locate 2>/dev/null || true)
  [[ $app_at == *"running on: n$new"* && $(grep -c "running on" <<<"$app_at") -eq 1 ]] ||
    fail "the application is not running on n$new alone: $app_at"
  [[ $(acked_count "$run/app-n$other.out") -eq 0 ]] || fail "n$other's application wrote too"
  in_node "$new" crm_mon -1 | grep -E "Online|OFFLINE|Promoted|Unpromoted|Started|Stopped|Failed" | sed 's/^/    /' || true
  if ((failures)); then
    dump_logs
    log "run $r: $failures check(s) failed"
    total_failures=$((total_failures + failures))
  else
    log "run $r: passed (n$old -> n$new, $ms ms)"
  fi
  teardown
done

sorted=$(printf '%s\n' "${times[@]}" | sort -n)
median=$(awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : int((a[NR/2]+a[NR/2+1])/2)}' <<<"$sorted")
max=$(tail -1 <<<"$sorted")
echo "takeover (cut -> new application's first acknowledged record) over $runs runs: ${times[*]} ms; p50 ${median} ms, max ${max} ms (corosync token 1500 ms)"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
if ((total_failures)); then
  echo "FAILED: $total_failures check(s)" >&2
  exit 1
fi
echo "OK"

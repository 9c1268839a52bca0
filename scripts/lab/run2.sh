#!/usr/bin/env bash
# pmirror lab: boot TWO QEMU guests joined by a private Ethernet link (QEMU
# -netdev stream over a unix socket; no host IP traffic) and run one command on
# each, concurrently.
#
#   scripts/lab/run2.sh [options] --a 'CMD on node A' --b 'CMD on node B'
#
# Options:
#   --a CMD / --b CMD  shell strings (bash -c) or script paths; both required
#   --loss PCT      netem loss on eth0 of both guests, e.g. 1% or 0.5%
#   --timeout SEC   hard limit per guest (default 300; $PMIRROR_LAB_TIMEOUT)
#   --nvdimm        NVDIMMs in both guests (separate backing files per node)
#   --env NAME[=VALUE], --rw DIR, --mem SIZE, --keep, --verbose: as for run.sh
#                   (given to both guests)
# Nodes: A = 192.168.78.1, B = 192.168.78.2, 1 vCPU each, rxe0 on eth0 (mtu 4200).
# In each guest: PMIRROR_LAB_NODE=a|b, PMIRROR_LAB_SELF=<own ip>,
# PMIRROR_LAB_PEER=<other ip>, plus everything run.sh provides. The command runs
# in the caller's current directory. Servers must be started by one side and the
# other side must retry its connection until the server listens (the guests do
# not boot in lock step).
# Output: every line of A is prefixed "[a] ", of B "[b] " (stdout to stdout,
# stderr to stderr). Exit status: 0 if both succeeded, else A's nonzero status,
# else B's (124 timeout, 125 harness/boot failure, as for run.sh). When one node
# fails, the other gets $PMIRROR_LAB_PEER_GRACE seconds (default 30) and is then
# stopped (its status is then 130).
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=scripts/lab/common.sh
source "$here/common.sh"

cmd_a="" cmd_b="" loss="" common=()
need() { [[ $# -ge 2 && -n $2 ]] || lab_die "option $1 needs a value"; }
while (($#)); do
  case $1 in
    --a) need "$@"; cmd_a=$2; shift 2 ;;
    --b) need "$@"; cmd_b=$2; shift 2 ;;
    --loss) need "$@"; loss=$2; shift 2 ;;
    --timeout|--env|--rw|--mem) need "$@"; common+=("$1" "$2"); shift 2 ;;
    --nvdimm|--keep|--verbose|-v) common+=("$1"); shift ;;
    -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) lab_die "run2: unknown option '$1' (see --help)" ;;
  esac
done
[[ -n $cmd_a && -n $cmd_b ]] || lab_die "run2: both --a CMD and --b CMD are required"
[[ -z $loss || $loss =~ ^[0-9.]+%$ ]] || lab_die "run2: --loss wants a percentage like 1%"

# The link socket is host-only (the guests never see it); keep it short (<108 chars).
sockdir=$(mktemp -d "${TMPDIR:-/tmp}/pmlab-link.XXXXXX")
sock="$sockdir/link.sock"
pa="" pb=""
cleanup() {
  [[ -n $pa ]] && kill "$pa" 2>/dev/null
  [[ -n $pb ]] && kill "$pb" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$sockdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

lossargs=()
[[ -n $loss ]] && lossargs=(--loss "$loss")
ip_a=192.168.78.1 ip_b=192.168.78.2

t0=$(date +%s.%N)
"$here/run.sh" "${common[@]}" "${lossargs[@]}" --smp 1 --node a --self "$ip_a" --peer "$ip_b" \
  --prefix "[a]" --link-listen "$sock" -- "$cmd_a" &
pa=$!
# QEMU A creates the listening socket at start-up; B must connect after that.
for _ in $(seq 200); do
  [[ -S $sock ]] && break
  kill -0 "$pa" 2>/dev/null || break
  sleep 0.05
done
if [[ ! -S $sock ]]; then
  set +e; wait "$pa"; ra=$?; set -e; pa=""
  echo "pmirror-lab: node A's QEMU never opened the link socket (run.sh exit $ra)" >&2
  exit 125
fi
"$here/run.sh" "${common[@]}" "${lossargs[@]}" --smp 1 --node b --self "$ip_b" --peer "$ip_a" \
  --prefix "[b]" --link-connect "$sock" -- "$cmd_b" &
pb=$!

# When one node fails, the other usually waits for it forever (a server with no
# client, a client retrying): give it PMIRROR_LAB_PEER_GRACE seconds (default 30), then stop it.
grace=${PMIRROR_LAB_PEER_GRACE:-30}
set +e
wait -n -p first "$pa" "$pb"; r1=$?
if [[ $first == "$pa" ]]; then ra=$r1; pa=""; other=$pb; else rb=$r1; pb=""; other=$pa; fi
if ((r1 != 0)); then
  for ((i = 0; i < grace * 10; i++)); do kill -0 "$other" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$other" 2>/dev/null; then
    echo "pmirror-lab: one node failed; stopping the other after ${grace} s grace" >&2
    kill "$other" 2>/dev/null
  fi
fi
wait "$other"; r2=$?
if [[ -z $pa ]]; then rb=$r2; else ra=$r2; fi
pa="" pb=""
set -e
t1=$(date +%s.%N)
secs=$(awk "BEGIN{printf \"%.1f\", $t1-$t0}")
if ((ra == 0 && rb == 0)); then
  [[ -n ${PMIRROR_LAB_TIMING:-} ]] && echo "pmirror-lab: both nodes ok (${secs} s)" >&2
  exit 0
fi
echo "pmirror-lab: FAILED: node a exit $ra, node b exit $rb (${secs} s)" >&2
((ra != 0)) && exit "$ra"
exit "$rb"

#!/usr/bin/env bash
# pmirror lab self-test: proves the harness end to end. Run as root.
#   1. setup.sh (a no-op when already set up)
#   2. ONE guest (--nvdimm): ibv_devices shows rxe0; rping and ib_write_lat -x 1
#      client+server over rxe0 on 192.168.77.1; /dev/dax1.0 and /mnt/pmem exist;
#      pmempool create obj on /mnt/pmem works.
#   3. TWO guests (with 1% netem loss): ib_write_lat server on A, client on B
#      (B retries until A listens).
# Exit 0 only if all pass.  Options: --skip-setup, --no-loss.
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)

# ---- parts that run INSIDE a guest (called through run.sh / run2.sh) ----------
check() { # NAME CMD...
  local name=$1; shift
  local t0 t1
  t0=$(date +%s.%N)
  if "$@"; then
    t1=$(date +%s.%N)
    printf 'selftest: PASS %-32s (%.1f s)\n' "$name" "$(awk "BEGIN{print $t1-$t0}")"
  else
    printf 'selftest: FAIL %s\n' "$name"
    failed=$((failed + 1))
  fi
}
retry() { # TRIES CMD...: retry until the peer's server listens
  local n=$1; shift
  for ((i = 0; i < n; i++)); do "$@" && return 0; sleep 1; done
  return 1
}
one_ibv_devices() { ibv_devices | grep -q rxe0; }
one_rping() {
  timeout 60 rping -s -a "$PMIRROR_LAB_SELF" -C 5 >/dev/null 2>&1 &
  local srv=$!
  retry 20 timeout 30 rping -c -a "$PMIRROR_LAB_SELF" -C 5 -v >/tmp/rping.out 2>&1 || { cat /tmp/rping.out; return 1; }
  wait "$srv" && grep -q 'ping data' /tmp/rping.out
}
one_write_lat() {
  timeout 60 ib_write_lat -d rxe0 -x 1 -n 200 >/tmp/srv.out 2>&1 &
  local srv=$!
  sleep 0.5
  retry 20 timeout 30 ib_write_lat -d rxe0 -x 1 -n 200 "$PMIRROR_LAB_SELF" >/tmp/cli.out 2>&1 || { cat /tmp/cli.out /tmp/srv.out; return 1; }
  wait "$srv" || { cat /tmp/srv.out; return 1; }
  grep -A1 't_avg' /tmp/cli.out | tail -n1 | awk '{print "selftest:   ib_write_lat 2 B one guest: t_typical " $5 " us"}'
}
one_pmem() {
  [[ -c /dev/dax1.0 ]] || { echo "no /dev/dax1.0"; return 1; }
  mountpoint -q /mnt/pmem || { echo "/mnt/pmem not mounted"; return 1; }
  grep -q ' /mnt/pmem .*dax' /proc/mounts || { echo "/mnt/pmem not mounted with dax"; return 1; }
  rm -f /mnt/pmem/selftest.obj
  pmempool create obj /mnt/pmem/selftest.obj && pmempool info /mnt/pmem/selftest.obj >/dev/null &&
    rm -f /mnt/pmem/selftest.obj
}
two_a() { timeout 120 ib_write_lat -d rxe0 -x 1 -n 200 >/tmp/srv.out 2>&1 || { cat /tmp/srv.out; return 1; }; }
two_b() {
  retry 60 timeout 30 ib_write_lat -d rxe0 -x 1 -n 200 "$PMIRROR_LAB_PEER" >/tmp/cli.out 2>&1 || { cat /tmp/cli.out; return 1; }
  grep -A1 't_avg' /tmp/cli.out | tail -n1 | awk '{print "selftest:   ib_write_lat 2 B two guests: t_typical " $5 " us"}'
}

if [[ ${1:-} == --guest-one || ${1:-} == --guest-two ]]; then
  [[ ${PMIRROR_LAB_GUEST:-} == 1 ]] || { echo "selftest: $1 runs inside a lab guest only" >&2; exit 2; }
  cd /tmp
  failed=0
  if [[ $1 == --guest-one ]]; then
    check "ibv_devices shows rxe0" one_ibv_devices
    check "rping over rxe0 (rdmacm)" one_rping
    check "ib_write_lat -x 1 (one guest)" one_write_lat
    check "devdax + fsdax + pmempool" one_pmem
  elif [[ $PMIRROR_LAB_NODE == a ]]; then
    check "ib_write_lat server (node a)" two_a
  else
    check "ib_write_lat client (node b)" two_b
  fi
  exit $((failed > 0))
fi

# ---- host side -------------------------------------------------------------------
skip_setup=0 loss=(--loss 1%)
for a in "$@"; do
  case $a in
    --skip-setup) skip_setup=1 ;;
    --no-loss) loss=() ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "selftest: unknown argument '$a'" >&2; exit 2 ;;
  esac
done
[[ ${EUID} -eq 0 ]] || { echo "selftest: run as root" >&2; exit 2; }

now() { date +%s.%N; }
el() { awk "BEGIN{printf \"%.1f\", $(now)-$1}"; }
fail=0
t=$(now)
if ((skip_setup == 0)); then
  "$here/setup.sh" || { echo "selftest: FAIL setup.sh" >&2; exit 1; }
  echo "selftest: setup $(el "$t") s"
fi

t=$(now)
if "$here/run.sh" --nvdimm --timeout 240 -- "$here/selftest.sh" --guest-one; then
  echo "selftest: one-guest round PASSED ($(el "$t") s)"
else
  echo "selftest: one-guest round FAILED ($(el "$t") s)" >&2
  fail=1
fi

t=$(now)
if "$here/run2.sh" "${loss[@]}" --timeout 240 \
     --a "$here/selftest.sh --guest-two" --b "$here/selftest.sh --guest-two"; then
  echo "selftest: two-guest round PASSED ($(el "$t") s${loss:+, netem loss 1%})"
else
  echo "selftest: two-guest round FAILED ($(el "$t") s)" >&2
  fail=1
fi

if ((fail)); then echo "selftest: FAILED" >&2; exit 1; fi
echo "selftest: ALL PASSED"

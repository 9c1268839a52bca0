#!/usr/bin/env bash
# A tcp-only build (-DPMIRROR_RDMA=OFF) of pmirrord, pmirrorctl and
# libpmirror, into a temporary directory: it configures and compiles without
# rdma-core (no object includes an rdma-core header, no binary needs
# libibverbs or librdmacm), and a cluster file naming `transport: rdma` is refused with the
# reason at `pmirrorctl config check`, at `pmirrord --check-config` and at
# pmirrord's start. scripts/test-extended.sh runs it (PMIRROR_EXTENDED=1).
#
#   rdma_off_build.sh SOURCE_DIR [COMPILER_LAUNCHER]
#
# PMIRROR_OFF_BUILD_JOBS: parallel compile jobs (default 2).
set -euo pipefail
src=${1:?usage: rdma_off_build.sh SOURCE_DIR [COMPILER_LAUNCHER]}
launcher=${2:-}
dir=$(mktemp -d /tmp/pmirror-rdma-off.XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# Unoptimised and without debug info: this build proves what it includes and
# links, not how its code runs, and -O0 without -g compiles in about half
# the time of the default -O2 -g.
configure=(-S "$src" -B "$dir/build" -G Ninja -DPMIRROR_RDMA=OFF -DPMIRROR_BUILD_TESTS=OFF
           -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 -DCMAKE_C_FLAGS_DEBUG=-O0)
if [[ -n $launcher ]]; then
  configure+=(-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" -DCMAKE_C_COMPILER_LAUNCHER="$launcher")
fi
cmake "${configure[@]}" >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; fail "configure"; }
if grep -qiE '^(IBVERBS|RDMACM)_' "$dir/build/CMakeCache.txt"; then
  fail "the OFF build looked for rdma-core (CMakeCache.txt has IBVERBS_/RDMACM_ entries)"
fi
start=$SECONDS
cmake --build "$dir/build" --target pmirrord pmirrorctl pmirror -j "${PMIRROR_OFF_BUILD_JOBS:-2}" \
  >"$dir/build.log" 2>&1 || { tail -50 "$dir/build.log"; fail "build"; }
echo "PMIRROR_RDMA=OFF: pmirrord, pmirrorctl and libpmirror built in $((SECONDS - start)) s"

# No object included an rdma-core header; no binary links rdma-core.
if ninja -C "$dir/build" -t deps | grep -E 'infiniband/|rdma/rdma_(cma|verbs)\.h'; then
  fail "an object of the OFF build includes an rdma-core header (above)"
fi
for binary in daemon/pmirrord daemon/pmirrorctl lib/initiator/libpmirror.so; do
  if readelf -d "$dir/build/$binary" | grep -E 'NEEDED.*(libibverbs|librdmacm)'; then
    fail "$binary needs rdma-core (above)"
  fi
done

# A cluster file naming rdma: refused, with the reason, everywhere.
cat >"$dir/cluster.yaml" <<EOF
daemon:
  state_pool: $dir/state.pool
  control_socket: $dir/pmirrord.sock
nodes:
  - {name: a, address: 127.0.0.1, port: 17490, transport: tcp}
  - {name: b, address: 127.0.0.2, port: 17491, transport: rdma}
EOF
want='nodes[1].transport: this build of pmirror has no rdma transport (built with PMIRROR_RDMA=OFF)'
expect_refused() {
  local what=$1
  shift
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  ((rc != 0)) || fail "$what accepted a cluster file naming rdma: $out"
  grep -qF "$want" <<<"$out" || fail "$what did not say why: $out"
  echo "$what refuses it: exit $rc"
}
expect_refused "pmirrorctl config check" "$dir/build/daemon/pmirrorctl" config check "$dir/cluster.yaml"
expect_refused "pmirrord --check-config" \
  "$dir/build/daemon/pmirrord" --config "$dir/cluster.yaml" --node a --check-config
expect_refused "pmirrord (start)" "$dir/build/daemon/pmirrord" --config "$dir/cluster.yaml" --node a
[[ ! -e $dir/state.pool ]] || fail "pmirrord created its state pool before refusing the file"
echo "ok"

#!/usr/bin/env bash
# The rdma tests, in the QEMU lab: sets the lab up (idempotent), then
#  1. one guest with Soft-RoCE and NVDIMMs: the rdma transport tests and the
#     data-path integration tests over rdma (devdax + file targets, fsdax
#     start-up check; the recovery tests whose path over rdma no other part
#     takes, all of them with PMIRROR_EXTENDED=1);
#  1b. (PMIRROR_EXTENDED=1 only) one guest on the newer kernel
#     (PMIRROR_LAB_KERNEL=6.12, whose rxe has FLUSH and ATOMIC WRITE): the
#     rdma transport tests, the device's capabilities and the data-path
#     tests (scripts/lab/tests/guest-next-kernel.sh);
#  1c. (PMIRROR_EXTENDED=1 only) one guest on kernel 7 (ODP too) with a
#     build against rdma-core 56 (scripts/lab/rdma-core.sh, into
#     $PMIRROR_BUILD56_DIR, default build-rdma56/): the transport tests and
#     the data path once per method -- one-sided commit, native flush, APM;
#  2. (PMIRROR_EXTENDED=1 only: scripts/test-extended.sh) two guests joined
#     by a link with packet loss: a mirrored stream across nodes, compared
#     by SHA-256; and one guest where pmirror-run is killed under load over
#     rdma (scripts/lab/tests/guest-pmdk-kill.sh, PMIRROR_LAB_KILLS per
#     program and mode, default 10);
#  3. two guests: replica recovery over rdma -- kill -9 of a replica's
#     pmirrord mid-stream and 100% netem loss, each followed by a dirty-only
#     resync (chunks counted), every acknowledged record checked, copies
#     compared by SHA-256.
# Needs a build (scripts/build.sh) in $PMIRROR_BUILD_DIR (default build/).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${PMIRROR_BUILD_DIR:-$repo/build}
loss=${PMIRROR_LAB_LOSS:-1%}
[[ -x $build/daemon/pmirrord ]] || { echo "no build in $build: run scripts/build.sh" >&2; exit 1; }

"$repo/scripts/lab/setup.sh"

# Each part's start, so that a run's log shows what each took.
section() { echo "== lab ($(date +%T)): $*"; }

data_path_args=()
[[ ${PMIRROR_EXTENDED:-0} == 1 ]] && data_path_args=(--all)
section "one guest (rxe0 + NVDIMMs): rdma transport and data path"
"$repo/scripts/lab/run.sh" --nvdimm --timeout 2000 -- \
  "$repo/scripts/lab/tests/guest-data-path.sh" "$build" "${data_path_args[@]}"

# The newer guests do not fit CI's 60 minutes (docs/testing.md):
# scripts/test-extended.sh runs them (PMIRROR_EXTENDED=1).
if [[ ${PMIRROR_EXTENDED:-0} == 1 ]]; then
  section "one guest on kernel 6.12 (rxe0 with FLUSH and ATOMIC WRITE): rdma transport and data path"
  PMIRROR_LAB_KERNEL=6.12 "$repo/scripts/lab/setup.sh"
  PMIRROR_LAB_KERNEL=6.12 "$repo/scripts/lab/run.sh" --nvdimm --timeout 1500 -- \
    "$repo/scripts/lab/tests/guest-next-kernel.sh" "$build" --data-path


  section "one guest on kernel 7 (FLUSH, ATOMIC WRITE, ODP), rdma-core 56: transport, data path per method"
  PMIRROR_LAB_KERNEL=7 "$repo/scripts/lab/setup.sh"
  pkgconfig=$(PMIRROR_LAB_KERNEL=7 "$repo/scripts/lab/rdma-core.sh")
  build56=${PMIRROR_BUILD56_DIR:-$repo/build-rdma56}
  PKG_CONFIG_PATH=$pkgconfig cmake -S "$repo" -B "$build56" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPMIRROR_BUILD_PROGRAMS=OFF >/dev/null
  cmake --build "$build56" --target pmirrord transport_rdma_test data_path_test
  PMIRROR_LAB_KERNEL=7 "$repo/scripts/lab/run.sh" --nvdimm --timeout 2400 -- \
    "$repo/scripts/lab/tests/guest-next-kernel.sh" "$build56" --data-path
fi

# The packet-loss run does not fit CI's 60 minutes any more
# (docs/testing.md): scripts/test-extended.sh runs it (PMIRROR_EXTENDED=1).
shared="$build/lab-shared.$$"
if [[ ${PMIRROR_EXTENDED:-0} == 1 ]]; then
  section "two guests, $loss packet loss: mirrored stream across nodes"
  rm -rf "$shared" && mkdir -p "$shared"
  trap 'rm -rf "$shared"' EXIT
  "$repo/scripts/lab/run2.sh" --nvdimm --loss "$loss" --timeout 900 --rw "$shared" \
    --a "$repo/scripts/lab/tests/two-node-loss.sh $build $shared" \
    --b "$repo/scripts/lab/tests/two-node-loss.sh $build $shared"
  section "one guest: pmirror-run killed under load over rdma (docs/pmdk.md, crash tests)"
  "$repo/scripts/lab/run.sh" --nvdimm --timeout 2400 -- \
    "$repo/scripts/lab/tests/guest-pmdk-kill.sh" "$build" "${PMIRROR_LAB_KILLS:-10}"
fi

section "two guests: replica recovery (kill -9, 100% loss, dirty-only resync)"
recovery="$build/lab-recovery.$$"
rm -rf "$recovery" && mkdir -p "$recovery"
trap 'rm -rf "$shared" "$recovery"' EXIT
"$repo/scripts/lab/run2.sh" --nvdimm --timeout 1200 --rw "$recovery" \
  --a "$repo/scripts/lab/tests/two-node-recovery.sh $build $recovery" \
  --b "$repo/scripts/lab/tests/two-node-recovery.sh $build $recovery"
section "all passed"

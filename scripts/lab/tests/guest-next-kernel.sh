#!/usr/bin/env bash
# Runs INSIDE one lab guest booted with a newer kernel
# (PMIRROR_LAB_KERNEL=6.12 scripts/lab/run.sh --nvdimm): the rdma transport
# tests -- the transport contract, and the device's FLUSH / ATOMIC WRITE
# capabilities (RdmaTransport.ReportsTheDevicesPersistenceVerbs) -- and,
# with --data-path (scripts/test-extended.sh: under this kernel's TCG, one
# vCPU, it does not fit CI's 60 minutes), the data-path integration tests
# over rdma (devdax and file targets), so that a newer rxe keeps working
# with what pmirror uses today (docs/transport-rdma.md, "Native
# persistence").
set -euo pipefail
build=${1:?usage: guest-next-kernel.sh BUILD_DIR [--data-path]}
data_path=0
[[ ${2:-} == --data-path ]] && data_path=1
: "${PMIRROR_LAB_SELF:?not in a lab guest}"
: "${PMIRROR_LAB_DAX_DEV:?run with --nvdimm}"
export PMIRROR_TEST_TRANSPORT=rdma
export PMIRROR_TEST_ADDRESS=$PMIRROR_LAB_SELF
export PMIRROR_TEST_DAX=$PMIRROR_LAB_DAX_DEV
export PMIRROR_TEST_FSDAX_DIR=$PMIRROR_LAB_PMEM_DIR
export PMIRROR_TEST_PERSISTS=${PMIRROR_TEST_PERSISTS:-2000}
# A build against rdma-core >= 45 (scripts/lab/rdma-core.sh) posts FLUSH
# and ATOMIC WRITE: the devdax target then declares native flush, and, with
# its metadata on the fs-dax mount, one-sided commit where the commit word
# registers (on-demand paging: rxe from 7.x); the data path runs once per
# method (native_persistence auto, flush, off: docs/config.md).
methods=("")
if grep -q '^PMIRROR_HAVE_IBV_WR_FLUSH:INTERNAL=1' "$build/CMakeCache.txt" 2>/dev/null; then
  export PMIRROR_TEST_METADATA_DIR=$PMIRROR_LAB_PMEM_DIR
  best=native-flush
  [[ $(uname -r) == [7-9].* ]] && best=one-sided-commit
  methods=("auto:$best" "flush:native-flush" "off:apm")
fi
ulimit -l unlimited
echo "== kernel $(uname -r): rdma transport tests (rxe0, devdax, fsdax)"
"$build/tests/unit/transport_rdma/transport_rdma_test" --gtest_brief=1
((data_path)) || exit 0
for method in "${methods[@]}"; do
  if [[ -n $method ]]; then
    export PMIRROR_TEST_NATIVE_PERSISTENCE=${method%%:*} PMIRROR_TEST_PMEM_METHOD=${method#*:}
  fi
  echo "== kernel $(uname -r): data path over rdma (devdax target + file target)${method:+, native_persistence ${method%%:*}: method ${method#*:}}"
  PMIRROR_TEST_TIME_SCALE=${PMIRROR_TEST_TIME_SCALE:-10} \
    "$build/tests/integration/data_path_test" --gtest_brief=1 \
    --gtest_filter='DataPathTest.*:DaemonTest.Fsdax*'
done
# With on-demand paging an fs-dax file registers -- except on rxe, whose ODP
# misplaces the bytes of Writes (docs/transport-rdma.md, "fs-dax over
# ODP"): the transport tests above saw it refused. PMIRROR_RXE_ODP=trust
# lifts the refusal: the canary below shows whether this kernel still has
# the defect; where it does not, the data path runs with the first target's
# copy on the fs-dax mount -- mirrored, a target killed and restarted,
# resynced, byte for byte.
if [[ ${best:-} == one-sided-commit ]]; then
  echo "== kernel $(uname -r): does rxe's ODP place page-crossing Writes exactly? (PMIRROR_RXE_ODP=trust)"
  if ! PMIRROR_RXE_ODP=trust "$build/tests/unit/transport_rdma/transport_rdma_test" --gtest_brief=1 \
    --gtest_filter='RdmaTransport.FsdaxFileRegistersWithOdpOrSaysWhyNot'; then
    echo "== kernel $(uname -r): no -- rxe's ODP defect is still here; fs-dax stays refused on rxe"
    exit 0
  fi
  echo "== kernel $(uname -r): yes -- lift the rxe ODP refusal (lib/transport/rdma/verbs.cpp)"
  fsdax_copy=$PMIRROR_LAB_PMEM_DIR/pmirror-data-path-copy.img
  rm -f "$fsdax_copy" && fallocate -l 16MiB "$fsdax_copy"
  echo "== kernel $(uname -r): data path over rdma (fs-dax target over ODP + file target), method one-sided-commit"
  PMIRROR_RXE_ODP=trust PMIRROR_TEST_DAX=$fsdax_copy PMIRROR_TEST_NATIVE_PERSISTENCE=auto \
    PMIRROR_TEST_PMEM_METHOD=one-sided-commit PMIRROR_TEST_TIME_SCALE=${PMIRROR_TEST_TIME_SCALE:-10} \
    "$build/tests/integration/data_path_test" --gtest_brief=1 --gtest_filter='DataPathTest.*'
  rm -f "$fsdax_copy"
fi

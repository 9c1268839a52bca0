#!/usr/bin/env bash
# Runs INSIDE one lab guest (scripts/lab/run.sh --nvdimm): the data-path
# integration tests over rdma (rxe0), the first target on devdax, the second
# on a plain file; the fsdax start-up check; the rdma transport tests; the
# three-node cluster status transitions over rdma; the ack policy at open
# and on a lost replica; pmirror-run with a libpmemobj program, and with
# one whose replica is lost between two of its steps.
#
# With --all (scripts/test-extended.sh) every recovery test; without it
# (CI's time) those whose path over rdma no other lab part takes: the kill
# -9s, the promotion and its first-handshake fence, split brain and verify
# (docs/testing.md).
set -euo pipefail
build=${1:?usage: guest-data-path.sh BUILD_DIR [--all]}
all=0
[[ ${2:-} == --all ]] && all=1
: "${PMIRROR_LAB_SELF:?not in a lab guest}"
: "${PMIRROR_LAB_DAX_DEV:?run with --nvdimm}"

export PMIRROR_TEST_TRANSPORT=rdma
export PMIRROR_TEST_ADDRESS=$PMIRROR_LAB_SELF
export PMIRROR_TEST_DAX=$PMIRROR_LAB_DAX_DEV
export PMIRROR_TEST_FSDAX_DIR=$PMIRROR_LAB_PMEM_DIR
# The guest CPU is 5-20x slower than the host: fewer, still thousands.
export PMIRROR_TEST_PERSISTS=${PMIRROR_TEST_PERSISTS:-2000}
ulimit -l unlimited

echo "== rdma transport tests (rxe0, devdax, fsdax)"
"$build/tests/unit/transport_rdma/transport_rdma_test" --gtest_brief=1
echo "== data path over rdma (devdax target + file target)"
PMIRROR_TEST_TIME_SCALE=${PMIRROR_TEST_TIME_SCALE:-10} \
  "$build/tests/integration/data_path_test" --gtest_brief=1 --gtest_filter='DataPathTest.*:DaemonTest.Fsdax*'
echo "== cluster status over rdma (a replica stopped, restarted, resynced; reload)"
"$build/tests/integration/cluster_test" --gtest_brief=1
echo "== replica recovery over rdma (kill -9 target/initiator, promote, split brain, verify)"
recovery_filter='RecoveryTest.Killed*:RecoveryTest.PromotedReplica*:RecoveryTest.SplitBrain*'
recovery_filter+=':RecoveryTest.Verify*:RecoveryTest.TheNewPrimary*'
((all)) && recovery_filter='*'
PMIRROR_TEST_TIME_SCALE=${PMIRROR_TEST_TIME_SCALE:-10} \
  "$build/tests/integration/recovery_test" --gtest_brief=1 --gtest_filter="$recovery_filter"
echo "== the ack policy over rdma: open without a replica that does not answer; fail; failed persists left dirty; block"
PMIRROR_TEST_TIME_SCALE=${PMIRROR_TEST_TIME_SCALE:-10} \
  "$build/tests/integration/insufficient_test" --gtest_brief=1 \
  --gtest_filter='InsufficientTest.OpenGoesOn*:InsufficientTest.FailReturns*:InsufficientTest.FailedPersists*:InsufficientTest.BlockWaits*'
echo "== the operator's switches over rdma: down/up a volume, disconnect/connect a replica"
"$build/tests/integration/operator_test" --gtest_brief=1
# The pool on a plain file: rxe0 cannot register fsdax pages (no ODP), and
# libpmirror registers the program's local copy as the source of its RDMA
# Writes (docs/transport-rdma.md); a pool on devdax is the next step.
echo "== pmirror-run over rdma: an unmodified libpmemobj program"
env -u PMIRROR_TEST_FSDAX_DIR "$(dirname "$0")/../../../tests/pmdk/pmirror_run_test.sh" \
  "$build/daemon/pmirror-run" "$build/daemon/pmirrord" "$build/examples/pmemobj-counters"
echo "== pmirror-run over rdma: the replica lost between two steps stops the program at its next observation point"
"$(dirname "$0")/../../../tests/pmdk/observation_point_test.sh" \
  "$build/daemon/pmirror-run" "$build/daemon/pmirrord" "$build/tests/pmdk/pmemobj-steps"

#!/usr/bin/env bash
# Runs INSIDE one lab guest (scripts/lab/run.sh --nvdimm): the crash tests of
# docs/pmdk.md ("Crash tests") over rdma (rxe0): each libpmemobj program
# under pmirror-run killed with SIGKILL at random moments, in both
# durability modes, two replicas checked after every kill. The pools are
# plain files in the guest (rxe0 cannot register fsdax pages without ODP).
# Started by scripts/lab/test.sh with PMIRROR_EXTENDED=1
# (scripts/test-extended.sh).
#   guest-pmdk-kill.sh BUILD_DIR [KILLS (default 10)]
set -euo pipefail
build=${1:?usage: guest-pmdk-kill.sh BUILD_DIR [KILLS]}
kills=${2:-10}
: "${PMIRROR_LAB_SELF:?not in a lab guest}"
repo=$(cd "$(dirname "$0")/../../.." && pwd)
export PMIRROR_TEST_TRANSPORT=rdma
export PMIRROR_TEST_ADDRESS=$PMIRROR_LAB_SELF
ulimit -l unlimited
status=0
for mode in observed drain; do
  for program in pmemobj-counters pmemobj-two-counters; do
    echo "== pmirror-run over rdma: $program killed $kills times, --durability $mode"
    PMIRROR_TEST_DURABILITY=$mode "$repo/tests/pmdk/kill_test.sh" "$build/daemon/pmirror-run" \
      "$build/daemon/pmirrord" "$build/examples/$program" "$kills" 16MiB || status=1
  done
done
echo "== pmirror-run over rdma: the log written inside the next transaction, killed $kills times"
TWO_COUNTERS_LOG_IN_TX=1 PMIRROR_TEST_DURABILITY=observed "$repo/tests/pmdk/kill_test.sh" \
  "$build/daemon/pmirror-run" "$build/daemon/pmirrord" "$build/examples/pmemobj-two-counters" \
  "$kills" 16MiB || status=1
exit "$status"

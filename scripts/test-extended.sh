#!/usr/bin/env bash
# Everything scripts/test.sh runs (what CI runs), plus what does not fit
# CI's time budget: the ThreadSanitizer build and pass, fuzzing each
# harness for 60 s, the crash tests (each
# PMDK program under pmirror-run killed 50 times in each durability mode),
# a three-node Pacemaker cluster losing its primary, and in the lab the
# two-guest packet-loss run, pmirror-run killed over rdma, the data path
# in the 6.12 guest, and in a kernel 7 guest with a build against rdma-core
# 56 the data path once per method (scripts/lab/test.sh). Run it before
# resolving an issue that touches the protocol, the config or the control
# parsers, failover, threads and locks, the data path or pmirror-run.
# As root on Debian 12, like test.sh. docs/testing.md.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PMIRROR_EXTENDED=1 exec "$repo/scripts/test.sh" "$@"

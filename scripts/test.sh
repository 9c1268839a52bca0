#!/usr/bin/env bash
# Installs what pmirror needs, builds it, and runs every test: unit and
# integration tests (ctest), the same under ASan+UBSan, the quick start, and
# the rdma tests in the QEMU lab (scripts/lab/test.sh).
# Run as root on Debian 12. `.ci/run` calls this.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$repo/scripts/install-deps.sh"

echo "== build"
"$repo/scripts/build.sh"
echo "== tests"
(cd "$repo/build" && ctest --output-on-failure --timeout 600 -j 2)

if [[ ${PMIRROR_SKIP_ASAN:-0} != 1 ]]; then
  echo "== build with ASan+UBSan"
  "$repo/scripts/build.sh" --asan
  echo "== tests under ASan+UBSan"
  (cd "$repo/build-asan" && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure --timeout 900 -j 2)
fi

echo "== quick start"
PMIRROR_PORT=${PMIRROR_PORT:-17450} "$repo/scripts/quickstart.sh"

if [[ ${PMIRROR_SKIP_LAB:-0} != 1 ]]; then
  echo "== rdma tests in the QEMU lab (Soft-RoCE + NVDIMMs)"
  "$repo/scripts/lab/test.sh"
fi

#!/usr/bin/env bash
# Configures and builds pmirror into build/ (or $PMIRROR_BUILD_DIR).
#   scripts/build.sh            release build with tests
#   scripts/build.sh --asan     ASan+UBSan build into build-asan/
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${PMIRROR_BUILD_DIR:-$repo/build}
extra=()
if [[ ${1:-} == --asan ]]; then
  build_dir=${PMIRROR_BUILD_DIR:-$repo/build-asan}
  extra+=(-DPMIRROR_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug)
fi
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$repo" -B "$build_dir" "${generator[@]}" "${extra[@]}" >/dev/null
cmake --build "$build_dir" --parallel "$(nproc)"
echo "built into $build_dir"

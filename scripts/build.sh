#!/usr/bin/env bash
# Configures and builds pmirror into build/ (or $PMIRROR_BUILD_DIR).
#   scripts/build.sh            release build with tests
#   scripts/build.sh --asan     ASan+UBSan build into build-asan/
#   scripts/build.sh --tsan     ThreadSanitizer build into build-tsan/
# (The fuzz harnesses have their own: scripts/fuzz.sh, into build-fuzz/.)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${PMIRROR_BUILD_DIR:-$repo/build}
extra=()
case ${1:-} in
  --asan)
    build_dir=${PMIRROR_BUILD_DIR:-$repo/build-asan}
    extra+=(-DPMIRROR_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug -DPMIRROR_BUILD_PROGRAMS=OFF)
    ;;
  --tsan)
    # Optimised (TSan's own advice: -O1 or more) with debug info for stacks.
    build_dir=${PMIRROR_BUILD_DIR:-$repo/build-tsan}
    extra+=(-DPMIRROR_TSAN=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPMIRROR_BUILD_PROGRAMS=OFF)
    ;;
  "") ;;
  *)
    echo "usage: $0 [--asan | --tsan]" >&2
    exit 2
    ;;
esac
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$repo" -B "$build_dir" "${generator[@]}" "${extra[@]}" >/dev/null
cmake --build "$build_dir" --parallel "$(nproc)"
echo "built into $build_dir"

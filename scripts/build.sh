#!/usr/bin/env bash
# Configures and builds pmirror into build/ (or $PMIRROR_BUILD_DIR).
#   scripts/build.sh            release build with tests
#   scripts/build.sh --asan     ASan+UBSan build into build-asan/
#   scripts/build.sh --tsan     ThreadSanitizer build into build-tsan/
# (The fuzz harnesses have their own: scripts/fuzz.sh, into build-fuzz/.)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${PMIRROR_BUILD_DIR:-$repo/build}
# Line tables only (-g1), not full debug info (-g): stacks, perf and gdb
# backtraces keep their file:line, and every build compiles 10-45 % faster
# (docs/testing.md, "Time each stage takes"). PMIRROR_FULL_DEBUG_INFO=1
# builds with -g for a debugger session that inspects variables.
debug_info=-g1
[[ ${PMIRROR_FULL_DEBUG_INFO:-0} == 1 ]] && debug_info=-g
extra=()
case ${1:-} in
  --asan)
    build_dir=${PMIRROR_BUILD_DIR:-$repo/build-asan}
    extra+=(-DPMIRROR_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug -DPMIRROR_BUILD_PROGRAMS=OFF)
    extra+=("-DCMAKE_C_FLAGS_DEBUG=$debug_info" "-DCMAKE_CXX_FLAGS_DEBUG=$debug_info")
    ;;
  --tsan)
    # -O1, TSan's own advice ("-O1 or more"): it compiles in half the time
    # of -O2 and reports the same races.
    build_dir=${PMIRROR_BUILD_DIR:-$repo/build-tsan}
    extra+=(-DPMIRROR_TSAN=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPMIRROR_BUILD_PROGRAMS=OFF)
    extra+=("-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 $debug_info -DNDEBUG"
      "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 $debug_info -DNDEBUG")
    ;;
  "")
    extra+=("-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 $debug_info -DNDEBUG"
      "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 $debug_info -DNDEBUG")
    ;;
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

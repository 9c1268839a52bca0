#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz/<name>_fuzz.cpp) with clang,
# ASan and UBSan into build-fuzz/ and runs each for a bounded time from a
# copy of its committed corpus (tests/fuzz/corpus/<name>/). docs/testing.md.
#
#   scripts/fuzz.sh                   every harness, 60 s each
#   scripts/fuzz.sh config control    only these
#   PMIRROR_FUZZ_SECONDS=600 scripts/fuzz.sh handshake
#
# PMIRROR_FUZZ_SECONDS  seconds per harness (default 60)
# PMIRROR_FUZZ_JOBS     harnesses run at once (default: the number of cores)
# PMIRROR_BUILD_DIR     build tree (default build-fuzz/)
#
# Fails if a harness finds a crash, a leak, undefined behaviour, an input
# that takes longer than 10 s or needs more than 2 GiB; prints where the
# input was saved and how to keep it as a regression input.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${PMIRROR_BUILD_DIR:-$repo/build-fuzz}
seconds=${PMIRROR_FUZZ_SECONDS:-60}
jobs=${PMIRROR_FUZZ_JOBS:-$(nproc)}
all=(protocol handshake config control)

# The longest input worth trying: a whole protocol message (4096 bytes);
# the handshake's tcp hello and four messages; a cluster file or request
# far beyond any real one (the parsers' costs grow with size, which a
# larger limit would only make slower to find).
declare -A max_len=([protocol]=4200 [handshake]=16500 [config]=16384 [control]=8192)

harnesses=("$@")
((${#harnesses[@]})) || harnesses=("${all[@]}")
for name in "${harnesses[@]}"; do
  if [[ -z ${max_len[$name]:-} ]]; then
    echo "fuzz: no harness '$name' (harnesses: ${all[*]})" >&2
    exit 2
  fi
done
if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found: run scripts/install-deps.sh" >&2
  exit 1
fi

# -O1 -g with assertions on, as libFuzzer's documentation recommends.
# Warnings are not errors here: the gcc builds enforce them, and clang warns
# about macros in system headers (infiniband/verbs.h) that gcc accepts.
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
CC=clang CXX=clang++ cmake -S "$repo" -B "$build_dir" "${generator[@]}" -DPMIRROR_FUZZ=ON \
  -DPMIRROR_WERROR=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" >/dev/null
targets=()
for name in "${harnesses[@]}"; do targets+=("${name}_fuzz"); done
cmake --build "$build_dir" --parallel "$(nproc)" --target "${targets[@]}"

work=$(mktemp -d "${TMPDIR:-/tmp}/pmirror-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
logs=$build_dir/fuzz-logs
mkdir -p "$logs"

# Runs one harness; its output goes to $logs/<name>.log, what it finds to
# $build_dir/fuzz-artifacts/<name>/.
run_one() {
  local name=$1
  local artifacts=$build_dir/fuzz-artifacts/$name
  rm -rf "$artifacts"
  mkdir -p "$artifacts" "$work/corpus"
  # A copy: what the fuzzer adds to its corpus is not committed.
  cp -r "$repo/tests/fuzz/corpus/$name" "$work/corpus/$name"
  local dict=()
  [[ -f $repo/tests/fuzz/$name.dict ]] && dict=(-dict="$repo/tests/fuzz/$name.dict")
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "$build_dir/tests/fuzz/${name}_fuzz" "$work/corpus/$name" "${dict[@]}" \
    -max_total_time="$seconds" -max_len="${max_len[$name]}" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts/" -print_final_stats=1 >"$logs/$name.log" 2>&1
}

report() {
  local name=$1 status=$2
  local artifacts=$build_dir/fuzz-artifacts/$name
  if ((status == 0)); then
    local runs
    runs=$(grep -m1 '^stat::number_of_executed_units' "$logs/$name.log" | awk '{print $2}')
    echo "fuzz: $name: nothing found in ${seconds} s (${runs:-?} inputs run)"
    return 0
  fi
  echo "fuzz: $name FAILED; the end of its output ($logs/$name.log):"
  grep -v -E '^#[0-9]+' "$logs/$name.log" | tail -n 60 | sed 's/^/  /'
  local input
  input=$(ls -t "$artifacts" 2>/dev/null | head -n 1)
  if [[ -n $input ]]; then
    cat <<MSG
fuzz: the input that failed is $artifacts/$input
  reproduce:  $build_dir/tests/fuzz/${name}_fuzz $artifacts/$input
  fix the bug, then keep the input as a regression input, which every build
  then runs (ctest -R fuzz_corpus.$name):
    cp $artifacts/$input $repo/tests/fuzz/corpus/$name/regress-<what-it-found>
MSG
  fi
  return 1
}

failed=0
pending=("${harnesses[@]}")
while ((${#pending[@]})); do
  batch=("${pending[@]:0:$jobs}")
  pending=("${pending[@]:$jobs}")
  pids=()
  for name in "${batch[@]}"; do
    echo "fuzz: running $name for ${seconds} s"
    run_one "$name" &
    pids+=($!)
  done
  for i in "${!batch[@]}"; do
    status=0
    wait "${pids[$i]}" || status=$?
    report "${batch[$i]}" "$status" || failed=1
  done
done
exit $failed

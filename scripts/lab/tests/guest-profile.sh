#!/usr/bin/env bash
# Runs INSIDE one lab guest (scripts/lab/run.sh --nvdimm --rw OUT_DIR): where
# a depth-1 persist's time goes. pmirror-bench (one devdax replica, 64 B,
# depth 1, 200,000 persists) and, in the middle of its persists (after its
# tcp ping-pong of the same count), `perf record -a -g` for 7 s. Writes
# OUT_DIR/bench.txt, perf.data and three reports (dso.txt: by process and
# object; sym.txt: the bench's symbols; children.txt: the bench's call
# totals). docs/benchmarks.md ("Where a depth-1 persist's time goes").
#   scripts/lab/run.sh --nvdimm --rw DIR -- scripts/lab/tests/guest-profile.sh DIR [BUILD_DIR]
set -u
out=${1:?usage: guest-profile.sh OUT_DIR [BUILD_DIR]}
build=${2:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)/build}
: "${PMIRROR_LAB_DAX_DEV:?run with --nvdimm}"
command -v perf > /dev/null || { echo "guest-profile: no perf (Debian's linux-perf)" >&2; exit 1; }
ulimit -l unlimited
mkdir -p /var/lib/pmirror
"$build/bench/pmirror-bench" --spawn-targets 1 --target-volume "$PMIRROR_LAB_DAX_DEV" \
  --pmirrord "$build/daemon/pmirrord" --transport rdma --address "$PMIRROR_LAB_SELF" \
  --dir /dev/shm --size 16MiB --sizes 64 --depths 1 --replicas-list 1 --iterations 200000 \
  --warmup 100 --poll adaptive > "$out/bench.txt" 2>&1 &
bench=$!
# The ping-pong of 200,000 round trips takes about 30 s under TCG, the
# persists about 12 s: sample 7 s of the persists.
sleep 37
perf record -a -g -F 999 -o "$out/perf.data" -- sleep 7 2> "$out/record.err"
wait "$bench" || { echo "guest-profile: pmirror-bench failed" >&2; cat "$out/bench.txt" >&2; exit 1; }
grep -E "^ +64 B" "$out/bench.txt"
report() { perf report -i "$out/perf.data" --stdio -g none "$@" 2>&1 | grep -v '^#' | grep -v '^$'; }
report --no-children --sort comm,dso | head -20 > "$out/dso.txt"
report --no-children --comm pmirror-bench --sort sym | head -50 > "$out/sym.txt"
report --children --comm pmirror-bench --sort sym | head -70 > "$out/children.txt"
cat "$out/dso.txt"

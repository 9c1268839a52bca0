#!/usr/bin/env bash
# pmirror's persist latency over real verbs (Soft-RoCE) next to perftest, in
# ONE QEMU lab guest: sets the lab up (scripts/lab/setup.sh, idempotent),
# boots one guest with NVDIMMs and a writable results folder, and runs
# scripts/lab/tests/guest-bench.sh there: R rounds, each of ib_write_lat,
# ib_read_lat (server + client on rxe0's address) and pmirror-bench over rdma
# (targets on devdax = APM: depth 1 with one and two replicas, 16 in flight,
# 4 writer threads; with PMIRROR_LAB_BENCH_GPSPM=1 also a tmpfs file target
# = GPSPM) and
# librpma's write + flush(persistent) to devdax (bench/rpma-write-flush,
# tool librpma-flush: the library pmirror replaces) at every size,
# interleaved. Prints the median over rounds of each tool's per-round median
# (and p99) and the ratios pmirror / ib_read_lat, pmirror / librpma-flush and
# pmirror / ib_write_lat, two replicas / one, and the persists/s of 16 in
# flight and of 4 writer threads over depth 1's. docs/benchmarks.md ("Over
# RDMA") shows results.
#
# Builds nothing: give a build folder (argument or $PMIRROR_BUILD_DIR, default
# build/) with daemon/pmirrord and bench/pmirror-bench, and bench/rpma-write-flush
# (built only where librpma-dev is installed; without it the librpma step is
# skipped with a warning).
#
#   scripts/lab/bench.sh [BUILD_DIR]
#   scripts/lab/bench.sh --summarize RESULTS_DIR   # only print the summary again
#
# With --resync (first argument) it runs scripts/lab/tests/guest-resync-bench.sh
# instead: the resync benchmark (pmirror-bench --scenario resync) over rdma,
# target on devdax, next to ib_write_bw of 1 MiB; summary by
# bench/resync_summary.py. Knobs PMIRROR_LAB_RESYNC_{ROUNDS,SIZE,RATES,ITERS,
# LATENCY_SIZE} (see that script); NVDIMM set "resync" unless
# PMIRROR_LAB_BENCH_NODE is set.
#   scripts/lab/bench.sh --resync [BUILD_DIR]
#   scripts/lab/bench.sh --resync --summarize RESULTS_DIR
#
# With --pmdk (first argument) it runs scripts/lab/tests/guest-pmdk-bench.sh
# instead: scripts/bench-pmdk.sh over rdma (issue 25), a small libpmemobj
# transaction and its 1-line log write plain, under pmirror-run --durability
# drain and --durability observed, and rewritten for libpmirror, in the same
# rounds; the replica's copies on devdax (/dev/dax1.0 and /dev/dax2.0, APM),
# the primary's pools in the guest's /dev/shm. Needs daemon/pmirror-run,
# daemon/pmirrord, examples/pmemobj-counters, bench/pmirror-counters-bench
# and lib/preload/libpmirror-preload.so in the build folder. The guest boots
# with `clocksource=tsc tsc=reliable` unless PMIRROR_LAB_KARGS is set. Knobs
# PMIRROR_LAB_PMDK_ROUNDS (default 5), PMIRROR_LAB_PMDK_COUNT (transactions per
# way and round, default 2000); NVDIMM set "bench" unless PMIRROR_LAB_BENCH_NODE
# is set.
#   scripts/lab/bench.sh --pmdk [BUILD_DIR]
#   scripts/lab/bench.sh --pmdk --summarize RESULTS_DIR
#
# With --native (first argument; PMIRROR_LAB_KERNEL=7 or 6.12, and a build
# against rdma-core 56, scripts/lab/README.md) it runs
# scripts/lab/tests/guest-native-bench.sh instead: pmirror-bench once per
# native_persistence setting (auto = one-sided commit on 7, flush, off = APM)
# in R rounds, one target on devdax with its metadata on the fs-dax mount:
# the persist's p50/p99 and the target's CPU time and context switches per
# persist (issue 26), and in the same rounds librpma's write + flush to the
# same devdax (bench/rpma-write-flush; skipped with a line saying why where
# it is missing or fails), each method's p50 over librpma's. Knobs
# PMIRROR_LAB_BENCH_{ROUNDS,SIZES,ITERS,WARMUP,POLL}.
#   PMIRROR_LAB_KERNEL=7 scripts/lab/bench.sh --native build-rdma56
#   scripts/lab/bench.sh --native --summarize RESULTS_DIR
#
# Environment:
#   PMIRROR_LAB_BENCH_OUT     results folder (default bench/results/lab-<date>-<host>)
#   PMIRROR_LAB_BENCH_ROUNDS  rounds (default 5)
#   PMIRROR_LAB_BENCH_SIZES   sizes in bytes, comma-separated (default 64,4096)
#   PMIRROR_LAB_BENCH_ITERS   measured ops per tool, size and round (default 500)
#   PMIRROR_LAB_BENCH_WARMUP  pmirror-bench warm-up persists per cell (default 100)
#   PMIRROR_LAB_BENCH_POLL    pmirror-bench --poll: busy | adaptive | event (default adaptive)
#   PMIRROR_LAB_BENCH_GPSPM   1: also a file-backed target (GPSPM); 0 (default): devdax only
#   PMIRROR_LAB_BENCH_NODE    NVDIMM set (run.sh --node; default bench, so that the
#                             run neither waits for nor disturbs the tests' NVDIMMs)
#   PMIRROR_LAB_BENCH_TIMEOUT whole guest boot limit in seconds (default 1500)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# summarize OUT_DIR: the table and ratios from OUT_DIR/rounds.tsv (+ host.txt,
# guest-versions.txt) to stdout, OUT_DIR/summary.txt and summary.json.
summarize() {
  python3 - "$1" <<'PY' | tee "$1/summary.txt"
import csv, json, statistics, sys
out = sys.argv[1]
import math
rows = list(csv.DictReader(open(f"{out}/rounds.tsv"), delimiter="\t"))
# perftest prints "inf" when its CPU-frequency calibration fails (seen under
# TCG on a loaded host): such a run has no usable numbers; drop it.
dropped = [r for r in rows if not math.isfinite(float(r["p50_us"]))]
rows = [r for r in rows if math.isfinite(float(r["p50_us"]))]
facts = {}
for name in ("host.txt", "guest-versions.txt"):
    for line in open(f"{out}/{name}"):
        if "=" in line:
            k, v = line.rstrip("\n").split("=", 1)
            facts[k] = v
# librpma-flush: only in runs since the librpma comparator (older folders
# have no such rows; they summarize as before).
tools = ["ib_write_lat", "ib_read_lat", "ib_read_lat-x2", "ib_write_bw", "librpma-flush", "pmirror-apm", "pmirror-apm-2r",
         "pmirror-apm-d16", "pmirror-apm-w4", "pmirror-gpspm"]
# persists/s (column ops_per_s: pmirror rows of runs since the throughput
# cells; "-" for perftest and librpma rows, absent in older folders).
def ops(r):
    v = r.get("ops_per_s", "-")
    return float(v) if v not in ("-", "", None) else None
sizes = sorted({int(r["size"]) for r in rows})
med = lambda xs: statistics.median(xs) if xs else float("nan")
summary = {}
for t in tools:
    for s in sizes:
        sel = [r for r in rows if r["tool"] == t and int(r["size"]) == s]
        if not sel:
            continue
        p50s = [float(r["p50_us"]) for r in sel]
        p99s = [float(r["p99_us"]) for r in sel]
        summary[(t, s)] = {
            "tool": t, "size": s, "rounds": len(sel),
            "p50_us": med(p50s), "p50_min_us": min(p50s), "p50_max_us": max(p50s),
            "p99_us": med(p99s), "p99_min_us": min(p99s), "p99_max_us": max(p99s),
            "method": sel[0]["method"],
        }
        rates = [ops(r) for r in sel if ops(r) is not None]
        if rates:
            summary[(t, s)]["ops_per_s"] = med(rates)
# Per-round ratios (same round, same size), then their median: pairs the
# numbers taken closest together in time.
def ratio(num, den, s, value=lambda x: float(x["p50_us"])):
    rs = []
    for r in {x["round"] for x in rows}:
        a = [value(x) for x in rows if x["round"] == r and x["tool"] == num and int(x["size"]) == s]
        b = [value(x) for x in rows if x["round"] == r and x["tool"] == den and int(x["size"]) == s]
        if a and b and a[0] is not None and b[0]:
            rs.append(a[0] / b[0])
    return rs
label = {"ib_write_lat": "ib_write_lat (one-way)", "ib_read_lat": "ib_read_lat (round trip)",
         "ib_read_lat-x2": "two ib_read_lat at once (slower)", "ib_write_bw": "ib_write_bw (us/message)",
         "librpma-flush": "librpma write+flush(persistent)",
         "pmirror-apm": "pmirror persist, devdax target", "pmirror-gpspm": "pmirror persist, file target",
         "pmirror-apm-2r": "pmirror, two devdax replicas", "pmirror-apm-d16": "pmirror, 16 in flight",
         "pmirror-apm-w4": "pmirror, 4 writer threads"}
print(f"guest {facts.get('guest_kernel')}; rdma-core {facts.get('rdma_core', '?').split()[0]}; "
      f"perftest {facts.get('perftest')}; {facts.get('qemu')}")
if "librpma" in facts:
    print(f"librpma {facts['librpma']}")
print(f"host load before {facts.get('host_load_before')}, during {facts.get('host_load_during')}, "
      f"after {facts.get('host_load_after')}; wall {facts.get('wall_s')} s")
print(f"rounds={facts.get('rounds')}")
for r in dropped:
    print(f"dropped: round {r['round']} {r['tool']} {r['size']} B (no finite numbers: perftest's CPU-frequency calibration failed)")
print()
print("median over rounds of each round's median (p50) and p99, microseconds; [min-max of the per-round p50]")
print(f"{'what':34} {'size':>6} {'method':>9} {'p50':>8} {'[range]':>17} {'p99':>8} {'persists/s':>10}")
for t in tools:
    for s in sizes:
        c = summary.get((t, s))
        if c:
            rng = f"[{c['p50_min_us']:.1f}-{c['p50_max_us']:.1f}]"
            rate = f"{c['ops_per_s']:10.0f}" if "ops_per_s" in c else f"{'-':>10}"
            print(f"{label[t]:34} {s:>6} {c['method']:>9} {c['p50_us']:8.1f} {rng:>17} {c['p99_us']:8.1f} {rate}")
print()
print("ratios of p50: median over rounds of the per-round ratio (and ratio of the medians above)")
ratios = []
# pmirror / librpma-flush: the same persist (write, then an 8-byte read after
# it) through librpma, next to the raw read round trip.
pairs = [("pmirror-apm", "ib_read_lat"), ("pmirror-apm", "librpma-flush"), ("pmirror-apm", "ib_write_lat"),
         ("pmirror-apm-2r", "pmirror-apm"), ("pmirror-apm-2r", "ib_read_lat-x2"),
         ("ib_read_lat-x2", "ib_read_lat"),
         ("pmirror-gpspm", "ib_read_lat"), ("pmirror-gpspm", "librpma-flush"), ("pmirror-gpspm", "ib_write_lat"),
         ("librpma-flush", "ib_read_lat")]
for num, den in pairs:
    for s in sizes:
        if (num, s) not in summary or (den, s) not in summary:
            continue
        rs = ratio(num, den, s)
        if not rs:
            continue
        of_medians = summary[(num, s)]["p50_us"] / summary[(den, s)]["p50_us"]
        ratios.append({"num": num, "den": den, "size": s, "median_of_round_ratios": med(rs),
                       "min": min(rs), "max": max(rs), "ratio_of_medians": of_medians})
        print(f"  {num:15} / {den:13} {s:>6} B: {med(rs):5.2f} (rounds {min(rs):.2f}-{max(rs):.2f}; "
              f"of medians {of_medians:.2f})")
# Throughput: persists/s of 16 in flight and of 4 writer threads over the
# same round's depth-1, one-thread persists/s (issue 11: >= 4x at 4 KiB for
# depth 16).
print()
print("ratios of persists/s: median over rounds of the per-round ratio")
for num, den in (("pmirror-apm-d16", "pmirror-apm"), ("pmirror-apm-w4", "pmirror-apm"),
                 ("pmirror-apm-d16", "ib_write_bw")):
    for s in sizes:
        rs = ratio(num, den, s, value=ops)
        if rs:
            ratios.append({"num": num, "den": den, "size": s, "of": "persists_per_s",
                           "median_of_round_ratios": med(rs), "min": min(rs), "max": max(rs)})
            print(f"  {num:15} / {den:13} {s:>6} B: {med(rs):5.2f} (rounds {min(rs):.2f}-{max(rs):.2f})")
json.dump({"facts": facts, "dropped": dropped, "summary": list(summary.values()), "ratios": ratios, "rounds": rows},
          open(f"{out}/summary.json", "w"), indent=2)
print(f"\nwrote {out}/summary.txt, summary.json, rounds.tsv, raw/")
PY
}
# summarize_resync OUT_DIR: the resync benchmark's summary (+ ib_write_bw).
summarize_resync() {
  local dir=$1
  {
    cat "$dir/host.txt" "$dir/guest-versions.txt" 2>/dev/null | grep -v '^$'
    if [[ -s $dir/bw.tsv ]]; then
      echo "ib_write_bw 1 MiB messages, MB/sec average per round: $(cut -f2 "$dir/bw.tsv" | tr '\n' ' ')"
    fi
    echo
  } > "$dir/summary-head.txt"
  cat "$dir/summary-head.txt"
  local jsons
  mapfile -t jsons < <(ls "$dir"/raw/round*.json | sort -V)
  python3 "$repo/bench/resync_summary.py" "$dir" "${jsons[@]}"
  cat "$dir/summary-head.txt" "$dir/summary.txt" > "$dir/summary.tmp" && mv "$dir/summary.tmp" "$dir/summary.txt"
  rm -f "$dir/summary-head.txt"
}
# summarize_pmdk OUT_DIR: the facts and scripts/bench-pmdk.sh's own summary
# (it printed it in the guest) to stdout.
summarize_pmdk() {
  local dir=$1
  cat "$dir/host.txt" "$dir/guest-versions.txt" 2>/dev/null | grep -v '^$'
  echo
  sed -n '/^medians over/,$p' "$dir/summary.txt"
}
mode=latency
if [[ ${1:-} == --resync ]]; then
  mode=resync
  shift
elif [[ ${1:-} == --pmdk ]]; then
  mode=pmdk
  shift
elif [[ ${1:-} == --native ]]; then
  mode=native
  shift
fi
if [[ ${1:-} == --summarize ]]; then
  if [[ $mode == resync ]]; then
    summarize_resync "${2:?usage: bench.sh --resync --summarize RESULTS_DIR}"
  elif [[ $mode == pmdk ]]; then
    summarize_pmdk "${2:?usage: bench.sh --pmdk --summarize RESULTS_DIR}"
  elif [[ $mode == native ]]; then
    cat "${2:?usage: bench.sh --native --summarize RESULTS_DIR}/summary.txt"
  else
    summarize "${2:?usage: bench.sh --summarize RESULTS_DIR}"
  fi
  exit
fi

build=${1:-${PMIRROR_BUILD_DIR:-$repo/build}}
build=$(cd "$build" && pwd) || { echo "bench.sh: no build folder $build" >&2; exit 1; }
if [[ $mode == pmdk ]]; then
  needed=(daemon/pmirrord daemon/pmirror-run examples/pmemobj-counters bench/pmirror-counters-bench
          lib/preload/libpmirror-preload.so)
else
  needed=(daemon/pmirrord bench/pmirror-bench)
fi
for f in "${needed[@]}"; do
  [[ -e $build/$f ]] || { echo "bench.sh: $build/$f missing (build first, e.g. scripts/build.sh)" >&2; exit 1; }
done
if [[ ($mode == latency || $mode == native) && ! -x $build/bench/rpma-write-flush ]]; then
  echo "bench.sh: warning: $build/bench/rpma-write-flush missing: no librpma-flush comparator in this run" \
    "(install librpma-dev, e.g. scripts/lab/setup.sh, reconfigure and build the target rpma-write-flush)" >&2
fi
if [[ $mode == pmdk ]]; then
  "$build/daemon/pmirror-run" --help | grep -q -- --durability ||
    { echo "bench.sh: $build/daemon/pmirror-run has no --durability (rebuild)" >&2; exit 1; }
else
  "$build/bench/pmirror-bench" --help | grep -q -- --target-volume ||
    { echo "bench.sh: $build/bench/pmirror-bench has no --target-volume (rebuild)" >&2; exit 1; }
fi
if [[ $mode == resync ]]; then
  "$build/bench/pmirror-bench" --help | grep -q -- --scenario ||
    { echo "bench.sh: $build/bench/pmirror-bench has no --scenario (rebuild)" >&2; exit 1; }
fi

stamp=$(date +%Y%m%d-%H%M%S)-$(hostname -s)
if [[ $mode == resync ]]; then
  out=${PMIRROR_LAB_BENCH_OUT:-$repo/bench/results/lab-$stamp-resync}
  node=${PMIRROR_LAB_BENCH_NODE:-resync}
elif [[ $mode == native ]]; then
  out=${PMIRROR_LAB_BENCH_OUT:-$repo/bench/results/lab-$stamp-native}
  node=${PMIRROR_LAB_BENCH_NODE:-bench}
  export PMIRROR_LAB_KARGS=${PMIRROR_LAB_KARGS-clocksource=tsc tsc=reliable}
  [[ ${PMIRROR_LAB_KERNEL:-6.1} != 6.1 ]] ||
    { echo "bench.sh --native: set PMIRROR_LAB_KERNEL=7 (or 6.12): 6.1's rxe has no FLUSH" >&2; exit 1; }
elif [[ $mode == pmdk ]]; then
  out=${PMIRROR_LAB_BENCH_OUT:-$repo/bench/results/lab-$stamp-pmdk}
  node=${PMIRROR_LAB_BENCH_NODE:-bench}
  # The guest's clock: TSC, not the slow emulated HPET/ACPI PM timer that
  # every clock_gettime would otherwise read under TCG.
  export PMIRROR_LAB_KARGS=${PMIRROR_LAB_KARGS-clocksource=tsc tsc=reliable}
  export PMIRROR_LAB_PMDK_ROUNDS=${PMIRROR_LAB_PMDK_ROUNDS:-5}
  export PMIRROR_LAB_PMDK_COUNT=${PMIRROR_LAB_PMDK_COUNT:-2000}
else
  out=${PMIRROR_LAB_BENCH_OUT:-$repo/bench/results/lab-$stamp}
  node=${PMIRROR_LAB_BENCH_NODE:-bench}
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PMIRROR_LAB_BENCH_ROUNDS=${PMIRROR_LAB_BENCH_ROUNDS:-5}
export PMIRROR_LAB_BENCH_SIZES=${PMIRROR_LAB_BENCH_SIZES:-64,4096}
export PMIRROR_LAB_BENCH_ITERS=${PMIRROR_LAB_BENCH_ITERS:-500}
export PMIRROR_LAB_BENCH_WARMUP=${PMIRROR_LAB_BENCH_WARMUP:-100}
export PMIRROR_LAB_BENCH_POLL=${PMIRROR_LAB_BENCH_POLL:-adaptive}
export PMIRROR_LAB_BENCH_GPSPM=${PMIRROR_LAB_BENCH_GPSPM:-0}

"$repo/scripts/lab/setup.sh"

{
  echo "date=$(date -Is)"
  echo "host_kernel=$(uname -srm)"
  echo "host_cpus=$(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "qemu=$(qemu-system-x86_64 --version | head -n1)"
  echo "commit=$(git -C "$repo" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "build=$build"
  echo "host_load_before=$(cut -d' ' -f1-3 /proc/loadavg)"
  [[ $mode == pmdk ]] && echo "guest_kargs=${PMIRROR_LAB_KARGS:-}"
} > "$out/host.txt"
cat "$out/host.txt"

# Host load every 10 s while the guest runs (TCG slows down with it), and
# "build" when a ninja runs on the host then (a build of the shared tree).
(while :; do
  echo "$(date +%s) $(cut -d' ' -f1 /proc/loadavg)$(pgrep -x ninja > /dev/null && echo ' build')"
  sleep 10
done) > "$out/host-load.log" &
sampler=$!
trap 'kill "$sampler" 2>/dev/null || true' EXIT

started=$(date +%s)
status=0
if [[ $mode == resync ]]; then
  # run.sh passes every PMIRROR_* variable of ours into the guest.
  PMIRROR_LAB_TIMING=1 "$repo/scripts/lab/run.sh" --nvdimm --node "$node" --rw "$out" \
    --timeout "${PMIRROR_LAB_BENCH_TIMEOUT:-1500}" -- \
    "$repo/scripts/lab/tests/guest-resync-bench.sh" "$build" "$out" 2>&1 | tee "$out/guest.log" ||
    status=$?
elif [[ $mode == native ]]; then
  # run.sh passes every PMIRROR_* variable of ours into the guest.
  PMIRROR_LAB_TIMING=1 "$repo/scripts/lab/run.sh" --nvdimm --node "$node" --rw "$out" \
    --timeout "${PMIRROR_LAB_BENCH_TIMEOUT:-1500}" -- \
    "$repo/scripts/lab/tests/guest-native-bench.sh" "$build" "$out" 2>&1 | tee "$out/guest.log" ||
    status=$?
elif [[ $mode == pmdk ]]; then
  # Two devdax: one per volume (the libpmemobj pool's copy, the rewritten
  # program's copy). run.sh passes every PMIRROR_* variable into the guest.
  PMIRROR_LAB_TIMING=1 "$repo/scripts/lab/run.sh" --nvdimms 3 --node "$node" --rw "$out" \
    --timeout "${PMIRROR_LAB_BENCH_TIMEOUT:-1500}" -- \
    "$repo/scripts/lab/tests/guest-pmdk-bench.sh" "$build" "$out" 2>&1 | tee "$out/guest.log" ||
    status=$?
else
PMIRROR_LAB_TIMING=1 "$repo/scripts/lab/run.sh" --nvdimms 3 --node "$node" --rw "$out" \
  --timeout "${PMIRROR_LAB_BENCH_TIMEOUT:-1500}" \
  --env PMIRROR_LAB_BENCH_ROUNDS --env PMIRROR_LAB_BENCH_SIZES --env PMIRROR_LAB_BENCH_ITERS \
  --env PMIRROR_LAB_BENCH_WARMUP --env PMIRROR_LAB_BENCH_GPSPM --env PMIRROR_LAB_BENCH_POLL -- \
  "$repo/scripts/lab/tests/guest-bench.sh" "$build" "$out" 2>&1 | tee "$out/guest.log" ||
  status=$?
fi
kill "$sampler" 2>/dev/null || true
{
  echo "host_load_after=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "host_load_during=$(awk '{s += $2; n++; if ($2 > m) m = $2; if ($3 == "build") b++} END {if (n) printf "mean %.1f, max %.1f (%d samples, %d with a host build running)", s / n, m, n, b}' "$out/host-load.log")"
  echo "wall_s=$(($(date +%s) - started))"
} >> "$out/host.txt"
if [[ $mode == resync ]]; then
  if [[ $status != 0 ]] || ! ls "$out"/raw/round*.json > /dev/null 2>&1; then
    echo "bench.sh: the guest run failed (status $status); see $out/guest.log" >&2
    [[ $status == 0 ]] && status=1
    exit "$status"
  fi
  summarize_resync "$out"
  exit
fi
if [[ $mode == pmdk || $mode == native ]]; then
  if [[ $status != 0 || ! -s $out/summary.txt ]]; then
    echo "bench.sh: the guest run failed (status $status); see $out/guest.log" >&2
    [[ $status == 0 ]] && status=1
    exit "$status"
  fi
  echo
  if [[ $mode == native ]]; then cat "$out/host.txt"; cat "$out/summary.txt"; else summarize_pmdk "$out"; fi
  exit
fi
if [[ $status != 0 || ! -s $out/rounds.tsv ]]; then
  echo "bench.sh: the guest run failed (status $status); see $out/guest.log" >&2
  [[ $status == 0 ]] && status=1
  exit "$status"
fi

summarize "$out"

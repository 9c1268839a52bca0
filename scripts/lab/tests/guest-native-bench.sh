#!/usr/bin/env bash
# Runs INSIDE one lab guest with a newer kernel (PMIRROR_LAB_KERNEL=7 or
# 6.12), started by `scripts/lab/bench.sh --native BUILD_DIR` with a build
# against rdma-core 56 (scripts/lab/rdma-core.sh): what each persistence
# method costs the target's CPU and the persist's latency (issue 26). R
# rounds, each running pmirror-bench over rdma once per method, in an order
# rotated from round to round, one spawned target on devdax with its
# metadata pool on the fs-dax mount:
#   auto  one-sided commit (kernel 7: the commit word registers over ODP):
#         Writes, FLUSH, ATOMIC WRITE of the commit word; no Send
#   flush native flush: Writes, FLUSH, and a Commit (a Send) per persist
#   off   APM: Writes, a Read as the flush, and a Commit per persist
# at depth 1 and each size. pmirror-bench reads the target's CPU time
# (utime + stime of /proc/PID/stat) and context switches (voluntary +
# involuntary, /proc/PID/status) before and after each cell: per persist,
# warm-up included. Raw outputs in OUT_DIR/raw/, one line per (round,
# method, size) in OUT_DIR/rounds.tsv, the summary in OUT_DIR/summary.txt.
#   guest-native-bench.sh BUILD_DIR OUT_DIR
# Environment: PMIRROR_LAB_BENCH_ROUNDS (default 5), PMIRROR_LAB_BENCH_SIZES
# (default 64,4096), PMIRROR_LAB_BENCH_ITERS (default 2000),
# PMIRROR_LAB_BENCH_WARMUP (default 200), PMIRROR_LAB_BENCH_POLL (default
# adaptive).
set -euo pipefail
build=${1:?usage: guest-native-bench.sh BUILD_DIR OUT_DIR}
out=${2:?usage: guest-native-bench.sh BUILD_DIR OUT_DIR}
: "${PMIRROR_LAB_SELF:?not in a lab guest}"
: "${PMIRROR_LAB_DAX_DEV:?run with --nvdimm}"
: "${PMIRROR_LAB_PMEM_DIR:?run with --nvdimm (the fs-dax mount)}"
rounds=${PMIRROR_LAB_BENCH_ROUNDS:-5}
sizes=${PMIRROR_LAB_BENCH_SIZES:-64,4096}
iters=${PMIRROR_LAB_BENCH_ITERS:-2000}
warmup=${PMIRROR_LAB_BENCH_WARMUP:-200}
poll=${PMIRROR_LAB_BENCH_POLL:-adaptive}
methods=(auto flush off)
[[ $(uname -r) == [7-9].* ]] || methods=(flush off)
mkdir -p "$out/raw"
ulimit -l unlimited
{
  echo "guest_kernel=$(uname -r)"
  echo "rounds=$rounds"
  echo "iterations=$iters warmup=$warmup poll=$poll"
  echo "guest_load_before=$(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/guest-versions.txt"
for ((r = 1; r <= rounds; r++)); do
  n=${#methods[@]}
  for ((i = 0; i < n; i++)); do
    m=${methods[$(((i + r) % n))]}
    echo "== round $r: native_persistence $m"
    rm -f "$PMIRROR_LAB_PMEM_DIR"/pmirror-bench.*-target*.pmirror  # the last round's pool
    "$build/bench/pmirror-bench" --transport rdma --address "$PMIRROR_LAB_SELF" \
      --spawn-targets 1 --target-volume "$PMIRROR_LAB_DAX_DEV" --native-persistence "$m" \
      --target-metadata-dir "$PMIRROR_LAB_PMEM_DIR" --size 16MiB --sizes "$sizes" --depths 1 \
      --replicas-list 1 --iterations "$iters" --warmup "$warmup" --poll "$poll" \
      --json "$out/raw/round$r-$m.json" > "$out/raw/round$r-$m.txt" 2>&1 ||
      { echo "pmirror-bench failed (round $r, $m):"; tail -20 "$out/raw/round$r-$m.txt"; exit 1; }
    grep -E "target pmirrord|uses " "$out/raw/round$r-$m.txt" || true
  done
done
echo "guest_load_after=$(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/guest-versions.txt"
python3 - "$out" <<'PY' | tee "$out/summary.txt"
import glob, json, os, re, statistics, sys
out = sys.argv[1]
rows = []
for path in sorted(glob.glob(f"{out}/raw/round*.json")):
    r, m = re.match(r".*round(\d+)-(\w+)\.json", path).groups()
    doc = json.load(open(path))
    used = ",".join(x["method"] for x in doc["setup"]["methods"])
    for c in doc["persist"]:
        rows.append({"round": int(r), "setting": m, "method": used, "size": c["size"],
                     "p50_us": c["p50_us"], "p99_us": c["p99_us"],
                     "cpu_us": c.get("target_cpu_us_per_persist", float("nan")),
                     "switches": c.get("target_switches_per_persist", float("nan"))})
with open(f"{out}/rounds.tsv", "w") as f:
    keys = list(rows[0].keys())
    f.write("\t".join(keys) + "\n")
    for row in rows:
        f.write("\t".join(str(row[k]) for k in keys) + "\n")
for line in open(f"{out}/guest-versions.txt"):
    print(line.rstrip())
med = statistics.median
settings = sorted({x["setting"] for x in rows}, key=["auto", "flush", "off"].index)
sizes = sorted({x["size"] for x in rows})
print("\nmedian over rounds; target CPU time and context switches per persist (warm-up included)")
print(f"{'setting':8} {'method':18} {'size':>6} {'p50 us':>8} {'p99 us':>8} {'CPU us':>8} {'switches':>9}")
for s in settings:
    for z in sizes:
        sel = [x for x in rows if x["setting"] == s and x["size"] == z]
        print(f"{s:8} {sel[0]['method']:18} {z:6} {med([x['p50_us'] for x in sel]):8.1f} "
              f"{med([x['p99_us'] for x in sel]):8.1f} {med([x['cpu_us'] for x in sel]):8.2f} "
              f"{med([x['switches'] for x in sel]):9.3f}")
def ratio(num, den, z, key):
    rs = []
    for r in sorted({x["round"] for x in rows}):
        a = [x[key] for x in rows if x["round"] == r and x["setting"] == num and x["size"] == z]
        b = [x[key] for x in rows if x["round"] == r and x["setting"] == den and x["size"] == z]
        if a and b and b[0] > 0:
            rs.append(a[0] / b[0])
    return rs
print("\nratios: median of the same round's ratios [min-max]")
for num, den, key in (("off", "auto", "cpu_us"), ("flush", "auto", "cpu_us"),
                      ("auto", "off", "p50_us"), ("flush", "off", "p50_us"),
                      ("auto", "flush", "p50_us")):
    for z in sizes:
        rs = ratio(num, den, z, key)
        if rs:
            what = "target CPU" if key == "cpu_us" else "p50"
            print(f"  {what:10} {num:5} / {den:5} {z:6} B: {med(rs):6.2f} [{min(rs):.2f}-{max(rs):.2f}]")
PY

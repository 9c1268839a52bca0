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
# warm-up included. Each round also runs librpma's write +
# flush(persistent) to the same devdax (bench/rpma-write-flush, as
# guest-bench.sh's librpma-flush; rdma-core 44 on its own: librpma 1.2's flush
# is a Read after the Write) at every size, same iterations and warm-up,
# rotated with the methods; where it is missing or fails, a line says why
# and the rounds go on without it. Raw outputs in OUT_DIR/raw/, one line per
# (round, setting, size) in OUT_DIR/rounds.tsv, the summary in
# OUT_DIR/summary.txt.
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
rpma_bin="$build/bench/rpma-write-flush"
mkdir -p "$out/raw"
ulimit -l unlimited
{
  echo "guest_kernel=$(uname -r)"
  echo "rounds=$rounds"
  echo "iterations=$iters warmup=$warmup poll=$poll"
  echo "guest_load_before=$(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/guest-versions.txt"

# rpma ROUND SIZE: rpma-write-flush server on the devdax, client here (as
# guest-bench.sh runs it); its "result ..." line stays in the raw .client
# file for the summary. Fails with the reason in $out/raw/rpma-why.
port=20000
rpma() {
  local log="$out/raw/round$1-librpma-$2" ok=0 rc=0 src=0
  port=$((port + 1))
  timeout 300 "$rpma_bin" server "$PMIRROR_LAB_SELF" "$port" "$2" "$iters" "$warmup" \
    "$PMIRROR_LAB_DAX_DEV" > "$log.server" 2>&1 &
  local server=$!
  for _ in $(seq 40); do
    sleep 0.25
    rc=0
    timeout 300 "$rpma_bin" client "$PMIRROR_LAB_SELF" "$port" "$2" "$iters" "$warmup" \
      > "$log.client" 2>&1 || rc=$?
    if [[ $rc == 0 ]]; then ok=1; break; fi
    # 2: not listening yet; retry while the server runs.
    if [[ $rc != 2 ]] || ! kill -0 "$server" 2> /dev/null; then break; fi
  done
  if [[ $ok != 1 ]]; then kill "$server" 2> /dev/null || true; fi
  wait "$server" || src=$?
  if [[ $ok == 1 && $src == 0 ]] && grep -q '^result ' "$log.client"; then return 0; fi
  # Why: its messages, less the server's progress lines.
  { echo "client status $rc, server status $src, $2 B:"
    cat "$log.client" "$log.server" | grep -v -e '^result ' -e ' mapped, ' -e 'holds the client' |
      head -6 || true
  } > "$out/raw/rpma-why"
  return 1
}
steps=("${methods[@]}")
if [[ -x $rpma_bin ]]; then
  steps+=(librpma)
  echo "librpma=$(dpkg-query -W -f '${Version}' librpma0 2>/dev/null || echo '?')" \
    "(write + flush(persistent) to $PMIRROR_LAB_DAX_DEV: $rpma_bin)" >> "$out/guest-versions.txt"
else
  echo "== librpma comparator SKIPPED: $rpma_bin not built (needs librpma-dev on the host)"
  echo "librpma=skipped: $rpma_bin not built" >> "$out/guest-versions.txt"
fi
for ((r = 1; r <= rounds; r++)); do
  n=${#steps[@]}
  for ((i = 0; i < n; i++)); do
    m=${steps[$(((i + r) % n))]}
    if [[ $m == librpma ]]; then
      [[ -e $out/raw/rpma-why ]] && continue  # it failed once: not on this guest
      echo "== round $r: librpma write + flush(persistent)"
      for z in ${sizes//,/ }; do
        rpma "$r" "$z" && continue
        echo "== librpma comparator SKIPPED from round $r on: rpma-write-flush failed" \
          "($(tr '\n' ' ' < "$out/raw/rpma-why"))"
        echo "librpma=failed in round $r: $(tr '\n' ' ' < "$out/raw/rpma-why")" \
          >> "$out/guest-versions.txt"
        break
      done
      continue
    fi
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
import glob, json, math, os, re, statistics, sys
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
# librpma: the client's result line; its passive side's CPU is not measured.
for path in sorted(glob.glob(f"{out}/raw/round*-librpma-*.client")):
    r = int(re.match(r".*round(\d+)-", path).group(1))
    for line in open(path):
        if line.startswith("result "):
            v = dict(kv.split("=", 1) for kv in line.split()[1:])
            rows.append({"round": r, "setting": "librpma", "method": "read-after-write",
                         "size": int(v["size"]), "p50_us": float(v["p50_us"]),
                         "p99_us": float(v["p99_us"]), "cpu_us": float("nan"),
                         "switches": float("nan")})
with open(f"{out}/rounds.tsv", "w") as f:
    keys = list(rows[0].keys())
    f.write("\t".join(keys) + "\n")
    for row in rows:
        f.write("\t".join(str(row[k]) for k in keys) + "\n")
for line in open(f"{out}/guest-versions.txt"):
    print(line.rstrip())
med = statistics.median
settings = sorted({x["setting"] for x in rows}, key=["auto", "flush", "off", "librpma"].index)
sizes = sorted({x["size"] for x in rows})
fmt = lambda v, w, p: f"{'-':>{w}}" if math.isnan(v) else f"{v:{w}.{p}f}"
print("\nmedian over rounds; target CPU time and context switches per persist (warm-up included)")
print(f"{'setting':8} {'method':18} {'size':>6} {'p50 us':>8} {'p99 us':>8} {'CPU us':>8} {'switches':>9}")
for s in settings:
    for z in sizes:
        sel = [x for x in rows if x["setting"] == s and x["size"] == z]
        if not sel:
            continue
        cpu, sw = med([x["cpu_us"] for x in sel]), med([x["switches"] for x in sel])
        print(f"{s:8} {sel[0]['method']:18} {z:6} {med([x['p50_us'] for x in sel]):8.1f} "
              f"{med([x['p99_us'] for x in sel]):8.1f} {fmt(cpu, 8, 2)} {fmt(sw, 9, 3)}")
def ratio(num, den, z, key):
    rs = []
    for r in sorted({x["round"] for x in rows}):
        a = [x[key] for x in rows if x["round"] == r and x["setting"] == num and x["size"] == z]
        b = [x[key] for x in rows if x["round"] == r and x["setting"] == den and x["size"] == z]
        if a and b and b[0] > 0:
            rs.append(a[0] / b[0])
    return rs
print("\nratios: median of the same round's ratios [min-max]")
for a, b, key in (("off", "auto", "cpu_us"), ("flush", "auto", "cpu_us"),
                  ("auto", "off", "p50_us"), ("flush", "off", "p50_us"),
                  ("auto", "flush", "p50_us"), ("auto", "librpma", "p50_us"),
                  ("flush", "librpma", "p50_us"), ("off", "librpma", "p50_us")):
    for z in sizes:
        rs = ratio(a, b, z, key)
        if rs:
            what = "target CPU" if key == "cpu_us" else "p50"
            print(f"  {what:10} {a:5} / {b:7} {z:6} B: {med(rs):6.2f} "
                  f"[{min(rs):.2f}-{max(rs):.2f}]")
PY

#!/usr/bin/env python3
"""The soak's report (scripts/soak.sh; docs/testing.md, "The soak").

Reads the run's work directory: faults.log (when each fault started and
ended), the writers' logs (n*/writer-v*.log: "acked SEQ LATENCY_US UNIX_MS",
"failed SEQ UNIX_MS ..."), synced.log (when each volume was back in sync),
checks.log (each copy's check) and resources.log (n1's pmirrord every 5 s:
RSS and anonymous memory in KiB, threads, fds). Prints a Markdown report; exit 1 when a record
was lost, a copy's check failed, a volume was not back in sync, or (runs
of 20 minutes or more) n1's pmirrord's anonymous memory or file
descriptors grew steadily.
"""
import argparse
import bisect
import glob
import os
import re
import sys
from collections import Counter


def percentile(sorted_values, p):
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, max(0, int(round(p / 100.0 * (len(sorted_values) - 1)))))
    return sorted_values[i]


def slope_per_minute(points):
    """Least-squares slope of (ms, value) points, per minute."""
    if len(points) < 3:
        return None
    n = len(points)
    xs = [t / 60000.0 for t, _ in points]
    ys = [v for _, v in points]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def fmt_ms(us):
    return "-" if us is None else f"{us / 1000.0:.2f} ms"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    for name in ("seed", "mode", "nodes", "volumes", "duration", "rate", "skipped", "started"):
        ap.add_argument("--" + name, required=True)
    a = ap.parse_args()
    d = a.dir

    # Faults: windows [start, end] by kind.
    windows, started, skipped, t0, healed = [], Counter(), int(a.skipped), None, None
    open_faults = {}
    with open(os.path.join(d, "faults.log")) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 2:
                continue
            ms = int(parts[0])
            if parts[1] == "run-start":
                t0 = ms
            elif parts[1] == "healed":
                healed = ms
            elif parts[1] == "start":
                started[parts[2]] += 1
                open_faults[(parts[2], parts[3], parts[4], len(windows))] = ms
                windows.append([ms, None])
            elif parts[1] == "end":
                for key in list(open_faults):
                    if key[0] == parts[2] and key[1] == parts[3] and key[2] == parts[4]:
                        windows[key[3]][1] = ms
                        del open_faults[key]
                        break
    for w in windows:
        if w[1] is None:
            w[1] = healed or w[0]
    # The union of the windows, for "during a fault".
    merged = []
    for s, e in sorted(windows):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    starts = [s for s, _ in merged]

    def during(begin, end):
        i = bisect.bisect_right(starts, end) - 1
        return i >= 0 and merged[i][1] >= begin

    # Persists.
    acked = 0
    failed = 0
    lat_out, lat_in = [], []
    for path in glob.glob(os.path.join(d, "n*", "writer-v*.log")):
        with open(path) as f:
            for line in f:
                if line.startswith("acked "):
                    parts = line.split()
                    acked += 1
                    if len(parts) >= 4:
                        lat, when = int(parts[2]), int(parts[3])
                        (lat_in if during(when - lat // 1000, when) else lat_out).append(lat)
                elif line.startswith("failed "):
                    failed += 1
    lat_out.sort()
    lat_in.sort()

    # Checks.
    lost, copies, bad_copies = 0, 0, 0
    with open(os.path.join(d, "checks.log")) as f:
        for line in f:
            m = re.match(r"v\d+ \S+ acked \d+ lost (\S+) exit (\d+)", line)
            if not m:
                continue
            copies += 1
            if m.group(1).isdigit():
                lost += int(m.group(1))
            if m.group(2) != "0":
                bad_copies += 1

    # Back in sync after the heal.
    sync_ms = []
    path = os.path.join(d, "synced.log")
    if os.path.exists(path) and healed:
        with open(path) as f:
            sync_ms = [int(line.split()[1]) - healed for line in f if line.strip()]
    not_synced = int(a.volumes) - len(sync_ms)

    # n1's pmirrord: ms, VmRSS KiB, RssAnon KiB, threads, fds.
    res = []
    path = os.path.join(d, "resources.log")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 5:
                    res.append(tuple(int(x) for x in parts))
    # After the first tenth (start-up: volumes opened, first resyncs).
    steady = res[len(res) // 10:] if len(res) >= 10 else res
    rss_slope = slope_per_minute([(r[0], r[1]) for r in steady])
    anon_slope = slope_per_minute([(r[0], r[2]) for r in steady])
    thread_slope = slope_per_minute([(r[0], r[3]) for r in steady])
    fd_slope = slope_per_minute([(r[0], r[4]) for r in steady])
    minutes = int(a.duration) / 60.0

    total_faults = sum(started.values())
    print(f"## Soak report (seed {a.seed}, {a.mode})")
    print()
    print(f"- {a.nodes} nodes, {a.volumes} volumes, {a.duration} s of faults, "
          f"{a.rate} records/s per writer; wall clock {int(os.path.getmtime(os.path.join(d, 'faults.log'))) - int(a.started)} s")
    print(f"- persists acknowledged: **{acked}**; failed (reported to the writer): {failed}")
    print(f"- faults injected: **{total_faults}** ({', '.join(f'{k} {v}' for k, v in sorted(started.items()))}); "
          f"skipped (their target busy with another): {skipped}")
    print(f"- acknowledged records lost: **{lost}** (copies checked: {copies}, failing: {bad_copies})")
    print("- split-brain acknowledgements: not measured by this form (no failover in it: one "
          "writer per volume, never promoted)")
    if sync_ms:
        print(f"- back in sync after the heal: all {len(sync_ms)} volumes, the last after "
              f"**{max(sync_ms) / 1000.0:.1f} s**" + (f"; {not_synced} NOT" if not_synced else ""))
    else:
        print(f"- back in sync after the heal: NONE of {a.volumes}")
    print(f"- persist latency outside faults: p50 {fmt_ms(percentile(lat_out, 50))}, "
          f"p99 {fmt_ms(percentile(lat_out, 99))} ({len(lat_out)} persists)")
    print(f"- persist latency during faults: p50 {fmt_ms(percentile(lat_in, 50))}, "
          f"p99 {fmt_ms(percentile(lat_in, 99))} ({len(lat_in)} persists)")
    verdict_growth = []
    if res:
        rss, anon, thr, fds = ([r[i] for r in res] for i in (1, 2, 3, 4))
        print(f"- n1's pmirrord ({len(res)} samples every 5 s; slopes by least squares after the "
              f"first tenth): RSS {min(rss) / 1024:.1f}-{max(rss) / 1024:.1f} MiB "
              f"({(rss_slope or 0) / 1024:+.3f} MiB/min), of it anonymous "
              f"{min(anon) / 1024:.1f}-{max(anon) / 1024:.1f} MiB ({(anon_slope or 0) / 1024:+.3f} MiB/min); "
              f"fds {min(fds)}-{max(fds)} ({fd_slope or 0:+.3f}/min); threads {min(thr)}-{max(thr)} "
              f"({thread_slope or 0:+.3f}/min)")
        # Flat: what the slope adds over the run stays within 10% of the mean
        # anonymous memory (at least 8 MiB) and 20 fds; file-backed RSS is
        # the mapped copies filling. Judged on runs of 20 minutes or more.
        mean_anon = sum(anon) / len(anon)
        if minutes >= 20 and anon_slope is not None and anon_slope * minutes > max(0.1 * mean_anon, 8192):
            verdict_growth.append(f"anonymous memory grows {anon_slope * minutes / 1024:.1f} MiB over the run")
        if minutes >= 20 and fd_slope is not None and fd_slope * minutes > 20:
            verdict_growth.append(f"fds grow {fd_slope * minutes:.0f} over the run")
    else:
        print("- n1's pmirrord: no samples")
    ok = lost == 0 and bad_copies == 0 and not_synced == 0 and copies > 0 and acked > 0 and not verdict_growth
    for g in verdict_growth:
        print(f"- NOT FLAT: {g}")
    print(f"- verdict: **{'passed' if ok else 'FAILED'}**")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

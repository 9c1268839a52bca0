#!/usr/bin/env python3
"""Summarizes rounds of `pmirror-bench --scenario resync --json` into one
table: for every (rate limit, phase) the median over rounds of the resync
throughput and of the depth-1 persist latency percentiles, with the range of
the per-round values, and the same-round ratios of latency during a resync
to the baseline. Used by scripts/bench-resync.sh and scripts/lab/bench.sh
--resync.

    resync_summary.py OUT_DIR ROUND.json...   # writes OUT_DIR/summary.{txt,json}
"""
import json
import statistics
import sys


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def rng(xs, fmt="{:.1f}"):
    return f"{fmt.format(min(xs))}-{fmt.format(max(xs))}" if xs else "-"


def main():
    out, files = sys.argv[1], sys.argv[2:]
    docs = [json.load(open(f)) for f in files]
    lines = []
    say = lines.append
    first = docs[0]
    setup = first["setup"]
    say(f"pmirror-bench --scenario resync: {len(docs)} round(s), transport {setup['transport']}, "
        f"method {first.get('method', '?')}, volume {setup['volume_size'] >> 20} MiB "
        f"({setup['data_fs']}{', target ' + setup['target_volume'] if setup.get('target_volume') else ''}), "
        f"chunk {setup['chunk_size'] >> 10} KiB, step {setup['resync_step'] >> 10} KiB, "
        f"persists {setup['latency_size']} B at depth 1")
    say("load average before/after each round: " +
        "; ".join(f"{d['machine']['load_average_before']} / {d['machine']['load_average_after']}"
                  for d in docs))
    say("")
    say("Copy references (whole volume as persists; open = connect + initial full sync of the "
        "new replica, zero pages), median MiB/s [range]:")
    refs = {}
    for d in docs:
        for r in d["references"]:
            refs.setdefault(r["name"], []).append(r["mib_per_s"])
        o = d["open"][0]
        refs.setdefault(f"open(), rate {'unlimited' if o['rate_limit'] == 0 else str(o['rate_limit'] >> 20) + ' MiB/s'}",
                        []).append(setup["volume_size"] / o["seconds"] / 1048576)
    summary = {"setup": setup, "rounds": len(docs), "references": {}, "phases": [], "ratios": []}
    for name, xs in refs.items():
        say(f"  {name:28} {med(xs):8.1f} [{rng(xs)}]")
        summary["references"][name] = {"median_mib_per_s": med(xs), "min": min(xs), "max": max(xs)}
    say("")
    say("| rate limit | phase | resync MiB/s [range] | resync s | persists | p50 µs [range] | p99 µs | p99.9 µs | persists/s |")
    say("|---|---|---|---|---|---|---|---|---|")
    keys = []
    for p in first["phases"]:
        k = (p["rate_limit"], p["phase"])
        if k not in keys:
            keys.append(k)
    label = {"baseline": "persists only (baseline)", "resync-idle": "full resync alone",
             "resync-load": "full resync + persists"}
    by = {}
    for d in docs:
        for p in d["phases"]:
            by.setdefault((p["rate_limit"], p["phase"]), []).append(p)
    for k in keys:
        ps = by[k]
        rate = ps[0]["rate_limit_label"]
        tp = [p["resync_mib_per_s"] for p in ps if "resync_mib_per_s" in p]
        secs = [p["resync_seconds"] for p in ps if "resync_seconds" in p]
        lat = [p["latency"] for p in ps if "latency" in p]
        row = {"rate_limit": k[0], "phase": k[1], "rounds": len(ps)}
        cells = [rate, label.get(k[1], k[1])]
        if tp:
            row.update(resync_mib_per_s=med(tp), resync_mib_per_s_min=min(tp),
                       resync_mib_per_s_max=max(tp), resync_seconds=med(secs))
            cells += [f"{med(tp):.1f} [{rng(tp)}]", f"{med(secs):.2f}"]
        else:
            cells += ["–", "–"]
        if lat:
            p50 = [l["p50_us"] for l in lat]
            row.update(samples=med([l["samples"] for l in lat]), p50_us=med(p50),
                       p50_min=min(p50), p50_max=max(p50),
                       p99_us=med([l["p99_us"] for l in lat]),
                       p999_us=med([l["p999_us"] for l in lat]),
                       max_us=med([l["max_us"] for l in lat]),
                       persists_per_s=med([p["persists_per_s"] for p in ps if "persists_per_s" in p]))
            cells += [f"{row['samples']:.0f}", f"{row['p50_us']:.1f} [{rng(p50)}]",
                      f"{row['p99_us']:.0f}", f"{row['p999_us']:.0f}", f"{row['persists_per_s']:,.0f}"]
        else:
            cells += ["–"] * 5
        summary["phases"].append(row)
        say("| " + " | ".join(cells) + " |")
    say("")
    say("Latency during a resync / baseline, same round and rate block (median over rounds [range]):")
    for rate in sorted({k[0] for k in keys}, key=lambda r: (r != 0, r)):
        for q in ("p50_us", "p99_us", "p999_us"):
            rs = []
            for d in docs:
                b = [p for p in d["phases"] if p["rate_limit"] == rate and p["phase"] == "baseline"]
                l = [p for p in d["phases"] if p["rate_limit"] == rate and p["phase"] == "resync-load"]
                if b and l and b[0]["latency"][q] > 0:
                    rs.append(l[0]["latency"][q] / b[0]["latency"][q])
            if rs:
                name = "unlimited" if rate == 0 else f"{rate >> 20} MiB/s"
                say(f"  rate {name:10} {q[:-3]:6}: x{med(rs):.2f} [{rng(rs, '{:.2f}')}]")
                summary["ratios"].append({"rate_limit": rate, "quantile": q, "median": med(rs),
                                          "min": min(rs), "max": max(rs)})
    text = "\n".join(lines)
    print(text)
    open(f"{out}/summary.txt", "w").write(text + "\n")
    json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)


if __name__ == "__main__":
    main()

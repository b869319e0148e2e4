"""The scaling suite: Ferry with one worker and with two, the share of
packets whose sender and receiver sit on different shards swept, at one
offered rate that saturates neither the server nor the generator.

The machine has two cores and two workers need both, so the generator
shares them: throughput would measure the machine, not the server. What is
measured instead is the server's cost of each packet at a fixed load: its
process CPU (from /proc, over ferry-bench's window) and its shards' busy
time (ferry_shard_busy_seconds_total), each over the packets it read in
the window (ferry_shard_packets_received_total). The generator runs with
--no-spin: spinning, it would take a shard's core for whole time slices
(on a first try, a debug build's second shard got 14 turns in a second).
ferry-bench places the
peers (`throughput --cross-shard PCT`) and fails a run whose measured
share is more than 5 points off, so every recorded point has the share it
names. The per-packet cost of the cross-shard path is the slope of a
straight line through the two-worker points' medians (cost against
measured share),
the same-shard cost its value at share 0; docs/scaling.md turns them into
a model for 16 cores.
"""

import statistics

from .common import SIZE, log
from .servers import Server


def point_name(workers, pct, half=False):
    return f"w{workers}-{pct}%" + ("-half" if half else "")


# One worker at half the rate: each of two shards carries half the load,
# so its turns are as full as one worker's at half the rate, and that is the
# comparison that leaves batching out of the cost of a second shard.
HALF = "w1-0%-half"


def suite_scaling(ctx):
    p = ctx.plan["scaling"]
    points = [(1, 0, True), (1, 0, False)] + [(2, pct, False) for pct in p["shares"]]
    window = p.get("window", ctx.plan["window"])
    repeats = ctx.args.repeats or p.get("repeats", ctx.plan["repeats"])
    for rep in range(repeats):
        # Interleaved: every repeat runs every point, with a fresh server
        # per worker count and repeat.
        for workers in sorted({w for w, _, _ in points}):
            with Server(ctx, "ferry", False, workers=workers, cpus=p["cpus"]) as srv:
                for w, pct, half in points:
                    if w != workers:
                        continue
                    rate = p["rate"] / 2 if half else p["rate"]
                    ctx.bench(srv, "scaling", point_name(w, pct, half), rep, "throughput",
                              ["-n", str(p["peers"]), "--size", str(SIZE), "--total-rate", f"{rate:g}M",
                               "--metrics", "--cross-shard", str(pct), "--no-spin", "--warmup", ctx.plan["warmup"],
                               "-d", window, "--drain", ctx.plan["drain"]],
                              client_cpus=p["cpus"])


def shard_sum(report, prefix):
    """The sum over shards of a counter's change in the window; None when
    the report has no such series (never read as 0)."""
    d = report.get("metrics_delta") or {}
    vals = [v for k, v in d.items() if k.startswith(prefix + "{")]
    return sum(vals) if vals else None


def figures(report):
    """One run's per-packet costs, or None when a figure is missing."""
    res = report["result"]
    server = report.get("server") or {}
    packets = shard_sum(report, "ferry_shard_packets_received_total")
    busy = shard_sum(report, "ferry_shard_busy_seconds_total")
    cpu = server.get("cpu_seconds")
    cross = res.get("cross_shard") or {}
    if not packets or busy is None or cpu is None or "measured" not in cross:
        return None
    if (report.get("machine") or {}).get("lost", 0.0) >= 0.5:
        return None  # the machine stood still: no CPU figure (see sanity.py)
    gbit = res["delivered_mbps"] / 1000.0
    return {
        "share": cross["measured"],
        "delivered_mbps": res["delivered_mbps"],
        "loss": res["loss"],
        "cpu_ns_per_packet": cpu / packets * 1e9,
        "busy_ns_per_packet": busy / packets * 1e9,
        "cores_per_gbit": server.get("cpu_util", 0.0) / gbit if gbit > 0 else None,
        "server_cores": server.get("cpu_util"),
        "client_busy": (report.get("client") or {}).get("busy_fraction"),
    }


def fit(xs, ys):
    """Least squares y = a + b x; None with fewer than two distinct x."""
    if len(xs) < 2 or len(set(round(x, 6) for x in xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


def stat(vals):
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def summarize(records):
    """Per point: medians (min-max) of each figure; then the fits of cost
    per packet against measured share over every two-worker run."""
    runs = {}
    for r in records:
        if r["suite"] != "scaling" or not r["report"]:
            continue
        f = figures(r["report"])
        if f is None:
            log(f"scaling: {r['point']} r{r['repeat']}: a figure is missing or the machine stood still; left out")
            continue
        runs.setdefault(r["point"], []).append(f)
    if not runs:
        return {}
    out = {"points": {}}
    for point, fs in runs.items():
        out["points"][point] = {k: stat([f[k] for f in fs]) for k in fs[0]}
    # The lines go through the points' medians, so one disturbed run moves
    # them no more than it moves a median.
    two = [d for point, d in out["points"].items() if point.startswith("w2-")]
    one = runs.get(point_name(1, 0), [])
    for cost in ("cpu_ns_per_packet", "busy_ns_per_packet"):
        line = fit([d["share"]["median"] for d in two], [d[cost]["median"] for d in two])
        entry = {"one_worker": stat([f[cost] for f in one]),
                 "one_worker_half_rate": stat([f[cost] for f in runs.get(HALF, [])])}
        if line:
            a, b = line
            entry.update({"same_shard": a, "cross_shard": a + b, "cross_extra": b})
        out[cost] = entry
    return out


def section(s):
    """The scaling suite's lines for results.md (none when it did not run)."""
    if not s:
        return []

    def cell(d, digits=0):
        if not d:
            return "-"
        return f"{d['median']:.{digits}f} ({d['min']:.{digits}f}–{d['max']:.{digits}f})"

    lines = ["## Scaling: one worker and two, cross-shard share swept", "",
             "Server and generator share both CPUs; figures are the server's costs at a fixed offered rate, "
             "medians (min–max) over repeats.", "",
             "| Point | measured share % | delivered Mbit/s | loss % | server CPU ns/packet | shards busy ns/packet "
             "| server cores per Gbit/s |",
             "|---|---|---|---|---|---|---|"]
    def order(item):
        workers, pct = item[0].split("-")[:2]
        return int(workers[1:]), float(pct.rstrip("%")), item[0] != HALF

    for point, d in sorted(s["points"].items(), key=order):
        share = d["share"] and {k: v * 100 if k != "n" else v for k, v in d["share"].items()}
        loss = d["loss"] and {k: v * 100 if k != "n" else v for k, v in d["loss"].items()}
        lines.append(f"| {point} | {cell(share, 1)} | {cell(d['delivered_mbps'])} | {cell(loss, 3)} "
                     f"| {cell(d['cpu_ns_per_packet'])} | {cell(d['busy_ns_per_packet'])} "
                     f"| {cell(d['cores_per_gbit'], 3)} |")
    lines.append("")
    for cost, what in (("cpu_ns_per_packet", "process CPU"), ("busy_ns_per_packet", "shards' busy time")):
        e = s.get(cost) or {}
        if "same_shard" in e:
            lines.append(f"- {what}, two workers, fitted through the points' medians: same-shard {e['same_shard']:.0f} ns/packet, "
                         f"cross-shard {e['cross_shard']:.0f} ns/packet (+{e['cross_extra']:.0f}); one worker "
                         f"{cell(e.get('one_worker'))} ns/packet at the same rate, "
                         f"{cell(e.get('one_worker_half_rate'))} at half of it.")
    lines.append("")
    return lines

#!/usr/bin/env python3
"""Soak: Ferry under a fixed load for a long time, then idle (issue 17).

    bench/run.sh soak                                  # 10 min at 80 % of the measured peak
    bench/run.sh soak --duration 5m --peers 200 --rate 4400
    MALLOC_ARENA_MAX=1 bench/run.sh soak ...           # the server inherits the environment

One Ferry (TLS unless --transport plain), pinned like every server of the
suite. Unless --rate is given, a first Ferry process measures the unpaced
peak with the same peers (--peak-window) and the soak offers --fraction of
it to a fresh process, so the soak's memory starts from nothing. ferry-bench
samples the server every --sample (RSS, descriptors, CPU, its memory gauges,
the interval's rates and data latency); after the load stops (every
connection closed) this script keeps sampling for --idle to see what memory
comes back. Output in --out: soak.json (the ferry-bench report, the idle
samples and a summary: RSS drift between minute 2 and the end, RSS after
idle against the start) and soak.png.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as rb  # noqa: E402  (the suite's servers, pinning and build)

DEFAULT_SAMPLE = "5s"


def seconds(text):
    """'90s', '10m', '250ms' or a bare number of seconds."""
    t = str(text).strip()
    for suffix, f in (("ms", 1e-3), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if t.endswith(suffix) and t[: -len(suffix)].replace(".", "", 1).isdigit():
            return float(t[: -len(suffix)]) * f
    return float(t)


def server_state(server):
    """RSS, descriptors and memory gauges of a running server, now."""
    pid = server.proc.pid
    rss = fds = None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    gauges = {k: v for k, v in server.varz().items()
              if any(k.startswith(p) for p in ("ferry_queued_bytes", "ferry_recv_buffer", "ferry_buffer",
                                                "ferry_heap", "derp_current_connections"))}
    return {"rss": rss, "open_fds": fds, "gauges": gauges}


def bench_cmd(ctx, server, a, out, extra):
    cmd = ctx.pin(a.client_cpus) + [str(ctx.bins["ferry-bench"]), "throughput", "-q", "-o", str(out)]
    return cmd + server.client_args() + ["--metrics", "-n", str(a.peers), "--size", str(a.size),
                                         "--timeout", "60s"] + extra


def measure_peak(ctx, a):
    with rb.Server(ctx, "ferry", a.transport == "tls") as s:
        out = ctx.tmp / "peak.json"
        rb.run(bench_cmd(ctx, s, a, out, ["--rate", "max", "--warmup", "2s", "-d", a.peak_window, "--drain", "3s"]))
        r = json.loads(out.read_text())
    peak = r["result"]["delivered_mbps"]
    rb.log(f"peak: {peak:.0f} Mbit/s unpaced with {a.peers} peers")
    return peak, r


def soak(ctx, a, rate):
    tls = a.transport == "tls"
    with rb.Server(ctx, "ferry", tls) as s:
        time.sleep(1.0)
        start = server_state(s)
        rb.log(f"server RSS before the first connection: {start['rss'] / 2**20:.1f} MiB")
        out = ctx.tmp / "soak-bench.json"
        rb.run(bench_cmd(ctx, s, a, out, ["--total-rate", f"{rate:.0f}M", "--warmup", a.warmup, "-d", a.duration,
                                          "--drain", "5s", "--sample-every", a.sample]))
        report = json.loads(out.read_text())
        # Idle: every connection closed. Sample on the same period.
        idle, period = [], seconds(a.sample)
        t0 = time.time()
        for k in range(1, int(seconds(a.idle) / period) + 1):
            time.sleep(max(0.0, t0 + k * period - time.time()))
            idle.append({"t_s": round(time.time() - t0, 2)} | server_state(s))
    return start, report, idle


def rss_at(samples, t):
    """RSS of the first sample at or after t seconds."""
    for x in samples:
        if x["t_s"] >= t and x.get("rss"):
            return x["rss"]
    return None


def summarize(a, rate, start, report, idle):
    samples = report.get("samples", [])
    warm = seconds(a.warmup)
    end = samples[-1]["rss"] if samples else None
    base = rss_at(samples, warm + 120.0) or rss_at(samples, warm)
    idle_end = idle[-1]["rss"] if idle else None
    res = report["result"]
    return {
        "offered_mbps": rate,
        "delivered_mbps": res["delivered_mbps"],
        "loss": res["loss"],
        "rss_start": start["rss"],
        "rss_minute2": base,
        "rss_end_of_load": end,
        "rss_max": max((x["rss"] or 0) for x in samples) if samples else None,
        "drift_minute2_to_end": (end - base) / base if base and end else None,
        "rss_after_idle": idle_end,
        "after_idle_over_start": (idle_end - start["rss"]) / start["rss"] if idle_end and start["rss"] else None,
        "fds_start": start["open_fds"],
        "fds_after_idle": idle[-1]["open_fds"] if idle else None,
        "latency_p50_first_last_us": [samples[0]["latency_us"]["p50"], samples[-1]["latency_us"]["p50"]] if samples else None,
    }


def plot(path, a, report, idle):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        rb.log("matplotlib is missing: no plot")
        return
    samples = report.get("samples", [])
    end = samples[-1]["t_s"] if samples else 0.0
    t = [x["t_s"] / 60 for x in samples]
    ti = [(end + 5 + x["t_s"]) / 60 for x in idle]
    fig, ax = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    mib = 2 ** 20
    ax[0].plot(t, [(x["rss"] or 0) / mib for x in samples], label="RSS under load")
    ax[0].plot(ti, [(x["rss"] or 0) / mib for x in idle], label="RSS idle (all closed)")
    names = sorted({k for x in samples for k in x.get("gauges", {}) if "bytes" in k})
    for n in names:
        ax[0].plot(t, [x["gauges"].get(n, 0) / mib for x in samples], "--", label=n)
    ax[0].set_ylabel("MiB")
    ax[0].legend(fontsize=7)
    ax[1].plot(t, [x["open_fds"] or 0 for x in samples], label="under load")
    ax[1].plot(ti, [x["open_fds"] or 0 for x in idle], label="idle")
    ax[1].set_ylabel("open descriptors")
    ax[1].legend(fontsize=7)
    for q in ("p50", "p99", "p999"):
        ax[2].plot(t, [x["latency_us"][q] for x in samples], label=q)
    ax[2].set_yscale("log")
    ax[2].set_ylabel("one-way latency, µs")
    ax[2].legend(fontsize=7)
    ax[3].plot(t, [x["received_mbps"] for x in samples], label="received")
    ax[3].plot(t, [x["sent_mbps"] for x in samples], label="sent")
    ax[3].set_ylabel("Mbit/s")
    ax[3].set_xlabel("minutes")
    ax[3].legend(fontsize=7)
    fig.suptitle(f"Ferry soak: {a.transport}, {a.peers} peers, {a.size} B")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="output directory (default: a temporary one)")
    ap.add_argument("--duration", default="10m", help="how long the load runs (after the warm-up)")
    ap.add_argument("--warmup", default="10s")
    ap.add_argument("--idle", default="60s", help="how long to watch the server after the load stops")
    ap.add_argument("--sample", default=DEFAULT_SAMPLE, help="sampling period")
    ap.add_argument("--peers", type=int, default=200)
    ap.add_argument("--size", type=int, default=1400)
    ap.add_argument("--transport", choices=["tls", "plain"], default="tls")
    ap.add_argument("--rate", type=float, metavar="MBPS", help="offered Mbit/s in all (default: --fraction of the peak)")
    ap.add_argument("--fraction", type=float, default=0.8, help="share of the measured peak to offer")
    ap.add_argument("--peak-window", default="5s")
    ap.add_argument("--server-cpus", default="0")
    ap.add_argument("--client-cpus", default="1")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--no-nice", action="store_true")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--profile", choices=["release", "dev"], default="release")
    ap.add_argument("--ferry-args", default="", help="extra arguments for the ferry server (quoted)")
    a = ap.parse_args()
    target = rb.ROOT / "target" / a.profile
    if not a.no_build:
        flag = ["--release"] if a.profile == "release" else []
        rb.run(["cargo", "build", "--locked", *flag, "-p", "ferry", "-p", "ferry-bench"], cwd=rb.ROOT)
    out = a.out or Path(tempfile.mkdtemp(prefix="ferry-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    a.transports = a.transport
    a.baseline_args = ""
    with tempfile.TemporaryDirectory(prefix="ferry-soak-") as tmpname:
        tmp = Path(tmpname)
        bins = {}
        (tmp / "bin").mkdir()
        for k in ("ferry", "ferry-bench"):
            bins[k] = tmp / "bin" / k
            bins[k].write_bytes((target / k).read_bytes())
            bins[k].chmod(0o755)
        ctx = rb.Context(a, bins, out, tmp, rb.make_cert(tmp), {})
        peak, peak_report = (None, None) if a.rate else measure_peak(ctx, a)
        rate = a.rate or a.fraction * peak
        rb.log(f"soak: {rate:.0f} Mbit/s offered for {a.duration} (+{a.warmup} warm-up), then {a.idle} idle")
        start, report, idle = soak(ctx, a, rate)
    summary = summarize(a, rate, start, report, idle)
    doc = {
        "config": {k: v for k, v in vars(a).items() if k != "out"} | {"peak_mbps": peak,
                                                                      "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX")},
        "summary": summary,
        "start": start,
        "idle": idle,
        "bench": report,
        "peak": peak_report,
    }
    (out / "soak.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(out / "soak.png", a, report, idle)
    mib = 2 ** 20

    def m(v):
        return f"{v / mib:.1f} MiB" if v else "?"

    def pct(v):
        return f"{v * 100:+.1f} %" if v is not None else "?"
    rb.log(f"RSS: start {m(summary['rss_start'])}, minute 2 {m(summary['rss_minute2'])}, "
           f"end of load {m(summary['rss_end_of_load'])} (drift {pct(summary['drift_minute2_to_end'])}), "
           f"after {a.idle} idle {m(summary['rss_after_idle'])} ({pct(summary['after_idle_over_start'])} over start)")
    rb.log(f"delivered {summary['delivered_mbps']:.0f} of {rate:.0f} Mbit/s, loss {summary['loss'] * 100:.3f} %; "
           f"wrote {out / 'soak.json'} and {out / 'soak.png'}")


if __name__ == "__main__":
    main()

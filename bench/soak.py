#!/usr/bin/env python3
"""Soak: Ferry under a fixed load for a long time, then idle.

    bench/run.sh soak                                  # 10 min at 80 % of the measured peak
    bench/run.sh soak --duration 5m --peers 200 --rate 4400
    MALLOC_ARENA_MAX=1 bench/run.sh soak ...           # the server inherits the environment
    bench/run.sh soak --relay udp [--shape raw|hub|session] [--gso 46] [--pps 100000]

One Ferry (TLS unless --transport plain), pinned like every server of the
suite. Unless --rate is given, a first Ferry process measures the unpaced
peak with the same peers (--peak-window) and the soak offers --fraction of
it to a fresh process, so the soak's memory starts from nothing. ferry-bench
samples the server every --sample (RSS, descriptors, CPU, its memory gauges,
the interval's rates and data latency); after the load stops (every
connection closed) this script keeps sampling for --idle to see what memory
comes back. Output in --out (default bench/results/<date>-soak-<tag>/,
--tag defaults to the relay, shape and duration): raw/soak.json (the
ferry-bench report, the idle samples and a summary: RSS drift between
minute 2 and the end, RSS after idle against the start), raw/soak.png, and
the layout's summary.json and results.md (ferrybench.layout).

--relay udp soaks the UDP relay instead, in network namespaces, with the
same summary and plot: bench/udp/soak_udp.py.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "udp"))
from ferrybench.build import target_dir  # noqa: E402  (the DERP suite's build, servers and runs)
from ferrybench.certs import make_cert  # noqa: E402
from ferrybench.common import ROOT, log, run  # noqa: E402
from ferrybench.context import Context  # noqa: E402
from ferrybench.layout import finish, git_commit, host, run_dir  # noqa: E402
from ferrybench.servers import Server  # noqa: E402
import soak_udp  # noqa: E402  (the UDP relay's soak: --relay udp)
from soak_udp import BOUNCE_IDLE, seconds  # noqa: E402

DEFAULT_SAMPLE = "5s"


def server_state(server):
    """RSS, descriptors and memory gauges of a running server, now. The
    descriptors are counted before the scrape, whose own connection the
    server may not have closed yet when the answer is read."""
    usage = soak_udp.process_usage(server.proc.pid)
    gauges = {k: v for k, v in server.varz().items()
              if any(k.startswith(p) for p in ("ferry_queued_bytes", "ferry_recv_buffer", "ferry_buffer",
                                                "ferry_heap", "derp_current_connections"))}
    return usage | {"gauges": gauges}


def bench_cmd(ctx, server, a, out, extra):
    cmd = ctx.pin(a.client_cpus) + [str(ctx.bins["ferry-bench"]), "throughput", "-q", "-o", str(out)]
    return cmd + server.client_args() + ["--metrics", "-n", str(a.peers), "--size", str(a.size),
                                         "--timeout", "60s"] + extra


def measure_peak(ctx, a):
    with Server(ctx, "ferry", a.transport == "tls") as s:
        out = ctx.tmp / "peak.json"
        run(bench_cmd(ctx, s, a, out, ["--rate", "max", "--warmup", "2s", "-d", a.peak_window, "--drain", "3s"]))
        r = json.loads(out.read_text())
    peak = r["result"]["delivered_mbps"]
    log(f"peak: {peak:.0f} Mbit/s unpaced with {a.peers} peers")
    return peak, r


def soak(ctx, a, rate):
    tls = a.transport == "tls"
    with Server(ctx, "ferry", tls) as s:
        time.sleep(1.0)
        start = server_state(s)
        log(f"server RSS before the first connection: {start['rss'] / 2**20:.1f} MiB")
        out = ctx.tmp / "soak-bench.json"
        run(bench_cmd(ctx, s, a, out, ["--total-rate", f"{rate:.0f}M", "--warmup", a.warmup, "-d", a.duration,
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


def window_max_drift(samples, first, window=300.0):
    """Drift of the highest RSS in a window: the `window` seconds from
    `first` against the last `window` seconds of the load. Under a load
    whose queues fill and drain, RSS swings within minutes and two single
    samples say only where they fell; the highest value per window is
    what grows if anything does. None when the load was too short for
    two separate windows."""
    if not samples or samples[-1]["t_s"] < first + 2 * window:
        return None
    last = samples[-1]["t_s"] - window
    early = [x["rss"] for x in samples if first <= x["t_s"] < first + window and x["rss"]]
    late = [x["rss"] for x in samples if x["t_s"] >= last and x["rss"]]
    return (max(late) - max(early)) / max(early) if early and late else None


def summarize(a, rate, start, report, idle):
    """The same fields for both relays, plus each one's own: DERP's offered
    and delivered Mbit/s, the UDP relay's pps and its probe's losses."""
    samples = report.get("samples", [])
    warm = seconds(a.warmup)
    end = samples[-1]["rss"] if samples else None
    base = rss_at(samples, warm + 120.0) or rss_at(samples, warm)
    idle_end = idle[-1]["rss"] if idle else None
    res = report["result"]
    out = {"offered_mbps": rate} if a.relay == "derp" else {
        "offered_pps": round(rate),
        "delivered_pps": res["delivered_pps"],
        "backlog_drops": res["backlog_drops"],
        "sent_packets": res["sent_packets"],
        "delivered_packets": res["delivered_packets"],
        "probe_sent": res["probe"]["sent"],
        "probe_lost": res["probe"]["lost"],
        "drops_at_end": {k: v for k, v in samples[-1]["gauges"].items() if "drops" in k or "errors" in k}
        if samples else None,
    }
    return out | {
        "delivered_mbps": res["delivered_mbps"],
        "loss": res["loss"],
        "samples": len(samples),
        "rss_start": start["rss"],
        "rss_minute2": base,
        "rss_end_of_load": end,
        "rss_max": max((x["rss"] or 0) for x in samples) if samples else None,
        "drift_minute2_to_end": (end - base) / base if base and end else None,
        "drift_of_5min_max": window_max_drift(samples, warm + 120.0),
        "rss_after_idle": idle_end,
        "after_idle_over_start": (idle_end - start["rss"]) / start["rss"] if idle_end and start["rss"] else None,
        "fds_start": start["open_fds"],
        "fds_end_of_load": samples[-1]["open_fds"] if samples else None,
        "fds_after_idle": idle[-1]["open_fds"] if idle else None,
        "latency_p50_first_last_us": [samples[0]["latency_us"]["p50"], samples[-1]["latency_us"]["p50"]] if samples else None,
    }


def plot(path, a, report, idle):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is missing: no plot")
        return
    samples = report.get("samples", [])
    end = samples[-1]["t_s"] if samples else 0.0
    t = [x["t_s"] / 60 for x in samples]
    ti = [(end + 5 + x["t_s"]) / 60 for x in idle]
    fig, ax = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    mib = 2 ** 20
    ax[0].plot(t, [(x["rss"] or 0) / mib for x in samples], label="RSS under load")
    ax[0].plot(ti, [(x["rss"] or 0) / mib for x in idle], label="RSS idle (all closed)" if a.relay == "derp" else "RSS idle (load stopped)")
    names = sorted({k for x in samples for k in x.get("gauges", {}) if "bytes" in k and not k.endswith("_total")})
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
    ax[2].set_ylabel("one-way latency, µs" if a.relay == "derp" else "probe round trip, µs (p999: max)")
    ax[2].legend(fontsize=7)
    if a.relay == "derp":
        rates, unit = (("received_mbps", "received"), ("sent_mbps", "sent")), "Mbit/s"
        title = f"Ferry soak: {a.transport}, {a.peers} peers, {a.size} B"
    else:
        rates, unit = (("received_pps", "delivered to the sink"), ("relayed_pps", "forwarded (relay's counter)")), "datagrams/s"
        title = f"Ferry UDP relay soak: {a.shape}, {a.flows} flows, {a.size} B{f' in GSO trains of {a.gso}' if a.gso else ''}"
    for key, label in rates:
        ax[3].plot(t, [x[key] for x in samples], label=label)
    ax[3].set_ylabel(unit)
    ax[3].set_xlabel("minutes")
    ax[3].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="output directory (default: bench/results/<date>-soak-<tag>)")
    ap.add_argument("--tag", help="the last part of the default output directory's name "
                                  "(default: derp-<duration>, or udp-<shape>-<duration>)")
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
    ap.add_argument("--relay", choices=["derp", "udp"], default="derp",
                    help="DERP (ferry-bench's peers) or the UDP relay (`ferry udp-relay` in namespaces)")
    u = ap.add_argument_group("--relay udp")
    u.add_argument("--shape", choices=["raw", "hub", "session"], default="raw",
                   help="raw datagrams through a static bounce, WireGuard transport messages through the hub, "
                        "or data datagrams through relay sessions (a DERP server's session port)")
    u.add_argument("--flows", type=int, default=8, help="generator sockets (source ports)")
    u.add_argument("--gso", type=int, default=0, help="datagrams per GSO train (0: single datagrams, as WireGuard)")
    u.add_argument("--pps", type=float, help="offered datagrams per second (default: --fraction of the peak)")
    u.add_argument("--probe-rate", type=float, default=10, help="latency probe datagrams per second")
    u.add_argument("--bounce-idle", default=BOUNCE_IDLE,
                   help="the bounce's idle_timeout: its sessions (and their sockets) close this long after "
                        "their last datagram, so an --idle longer than it sees them go")
    a = ap.parse_args()
    udp = a.relay == "udp"
    target = target_dir(a.profile)
    if not a.no_build:
        flag = ["--release"] if a.profile == "release" else []
        run(["cargo", "build", "--locked", *flag, "-p", "ferry", "-p", "ferry-bench"], cwd=ROOT)
    out = a.out or run_dir("soak", a.tag or (f"udp-{a.shape}" if udp else "derp") + f"-{a.duration}")
    (out / "raw").mkdir(parents=True, exist_ok=True)
    a.transports = a.transport
    a.baseline_args = ""
    with tempfile.TemporaryDirectory(prefix="ferry-soak-") as tmpname:
        tmp = Path(tmpname)
        bins = {}
        (tmp / "bin").mkdir()
        wanted = ("ferry", "ferry-bench")
        if udp:
            wanted = ("ferry", "udp_gen") + (("session_pps",) if a.shape == "session" else ())
        for k in wanted:
            name = k.rpartition("/")[2]
            bins[name] = tmp / "bin" / name
            bins[name].write_bytes((target / k).read_bytes())
            bins[name].chmod(0o755)
        ctx = Context(a, bins, out, tmp, make_cert(tmp), {})
        if udp:
            peak, peak_report, rate, start, report, idle = soak_udp.run(ctx, a, log)
        else:
            peak, peak_report = (None, None) if a.rate else measure_peak(ctx, a)
            rate = a.rate or a.fraction * peak
            log(f"soak: {rate:.0f} Mbit/s offered for {a.duration} (+{a.warmup} warm-up), then {a.idle} idle")
            start, report, idle = soak(ctx, a, rate)
    summary = summarize(a, rate, start, report, idle)
    doc = {
        "config": {k: v for k, v in vars(a).items() if k != "out"} | {"peak_pps" if udp else "peak_mbps": peak,
                                                                      "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX")},
        "summary": summary,
        "start": start,
        "idle": idle,
        "bench": report,
        "peak": peak_report,
    }
    (out / "raw" / "soak.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(out / "raw" / "soak.png", a, report, idle)
    nice = ", both at nice -20" if ctx.nice else ""
    finish(out, "soak", f"relay on CPU {a.server_cpus}, load generator on CPU {a.client_cpus}{nice}",
           git_commit(), host())
    mib = 2 ** 20

    def m(v):
        return f"{v / mib:.1f} MiB" if v else "?"

    def pct(v):
        return f"{v * 100:+.1f} %" if v is not None else "?"
    log(f"RSS: start {m(summary['rss_start'])}, minute 2 {m(summary['rss_minute2'])}, "
           f"end of load {m(summary['rss_end_of_load'])} (drift {pct(summary['drift_minute2_to_end'])}; "
           f"of the highest per 5 minutes {pct(summary['drift_of_5min_max'])}), "
           f"after {a.idle} idle {m(summary['rss_after_idle'])} ({pct(summary['after_idle_over_start'])} over start)")
    offered = f"{summary['delivered_pps']:.0f} of {rate:.0f} pps" if udp else f"{summary['delivered_mbps']:.0f} of {rate:.0f} Mbit/s"
    log(f"delivered {offered}, loss {summary['loss'] * 100:.3f} %, descriptors {summary['fds_start']} → "
           f"{summary['fds_end_of_load']} → {summary['fds_after_idle']}; wrote {out}/summary.json, results.md, raw/")


if __name__ == "__main__":
    main()

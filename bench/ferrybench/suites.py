"""The suites: what each runs against which server, as ferry-bench
command lines."""

import json
import shutil
import statistics
import subprocess
import threading
import time

from . import scaling
from .common import PEERS, SERVERS, SIZE, log
from .servers import Region, Server
from .summary import values

def engine_args(plan, window=None):
    return ["--warmup", plan["warmup"], "-d", window or plan["window"], "--drain", plan["drain"]]


def seconds(duration):
    """A ferry-bench duration ("300ms", "2s") in seconds."""
    return float(duration[:-2]) / 1000 if duration.endswith("ms") else float(duration.rstrip("s"))


def rate_arg(total_mbps):
    return ["--rate", "max"] if total_mbps is None else ["--total-rate", f"{total_mbps}M"]


def point_name(total_mbps):
    return "max" if total_mbps is None else f"{total_mbps}M"


def suite_rate(ctx):
    p = ctx.plan["rate"]
    for rep in range(ctx.plan["repeats"]):
        for transport in ctx.transports:
            for name in p["servers"]:
                if transport == "tls" and SERVERS[name].get("plain_only"):
                    continue
                with Server(ctx, name, transport == "tls") as srv:
                    for rate in p[transport]:
                        ctx.bench(srv, "rate", point_name(rate), rep, "throughput",
                                  ["-n", str(PEERS), "--size", str(SIZE), *srv.metrics(), *rate_arg(rate),
                                   *engine_args(ctx.plan)])


def peak_delivered(ctx, server, transport):
    """A server's saturation throughput: the highest median delivered rate
    over the offered-rate sweep."""
    best = 0.0
    for point in {r["point"] for r in ctx.records if r["suite"] == "rate"}:
        vals = values(ctx.records, "rate", server, transport, point, lambda r: r["result"]["delivered_mbps"])
        if vals:
            best = max(best, statistics.median(vals))
    return best


def suite_latency(ctx):
    p = ctx.plan["latency"]
    base = p.get("fixed_base_mbps") or peak_delivered(ctx, "derper", "plain")
    if base <= 0:
        log("latency: no derper saturation figure; using 1000 Mbit/s as the base load")
        base = 1000.0
    ctx.latency_base = base
    log(f"latency: base load (derper plain saturation) = {base:.0f} Mbit/s")
    for rep in range(ctx.plan["repeats"]):
        for name in p["servers"]:
            with Server(ctx, name, False) as srv:
                for level in p["levels"]:
                    extra = ["--ping-pairs", "1", "--ping-rate", "1000", "--ping-size", str(SIZE), *srv.metrics(),
                             *engine_args(ctx.plan, p["window"])]
                    if level > 0:
                        extra += ["--load-peers", str(PEERS), "--size", str(SIZE), "--load-total-rate", f"{base * level:.0f}M"]
                    ctx.bench(srv, "latency", f"{int(level * 100)}%", rep, "latency", extra)


def suite_peers(ctx):
    p = ctx.plan["peers"]
    for rep in range(ctx.plan["repeats"]):
        for name in p["servers"]:
            with Server(ctx, name, False) as srv:
                for n in p["counts"]:
                    # Keep the generator's buffering per peer modest with many peers.
                    cap = str(max(64 * 1024, min(256 * 1024, 16 * 1024 * 1024 // n)))
                    ctx.bench(srv, "peers", str(n), rep, "throughput",
                              ["-n", str(n), "--size", str(SIZE), "--rate", "max", "--out-cap", cap, *srv.metrics(),
                               "--timeout", "30s", *engine_args(ctx.plan)])


def suite_stuck(ctx):
    p = ctx.plan["stuck"]
    for rep in range(ctx.plan["repeats"]):
        for name in p["servers"]:
            for n in p["counts"]:
                # A fresh server per point: the one before cut connections off.
                with Server(ctx, name, False) as srv:
                    ctx.bench(srv, "stuck", str(n), rep, "throughput",
                              ["-n", str(PEERS), "--size", str(SIZE), "--total-rate", f"{p['rate']}M",
                               "--stuck", str(n), "--stuck-size", str(p["size"]), "--stuck-rate", f"{p['stuck_rate']}M",
                               *srv.metrics(), *engine_args(ctx.plan, p["window"])])


def suite_idle(ctx):
    p = ctx.plan["idle"]
    for rep in range(ctx.plan["repeats"]):
        for name in p["servers"]:
            with Server(ctx, name, p["tls"]) as srv:
                ctx.bench(srv, "idle", str(p["conns"]), rep, "idle",
                          ["-n", str(p["conns"]), "--hold", p["hold"], "--concurrency", "256", "--timeout", "30s"])


def suite_churn(ctx):
    p = ctx.plan["churn"]
    for rep in range(ctx.plan["repeats"]):
        for transport in [t for t in p["transports"] if t in ctx.transports]:
            for name in p["servers"]:
                with Server(ctx, name, transport == "tls") as srv:
                    ctx.bench(srv, "churn", "max", rep, "churn",
                              ["-d", p["duration"], "--concurrency", "64", "--keys", str(p["keys"])])


def suite_mesh(ctx):
    """Senders on node A, receivers on node B of a two-node TLS region of
    each server: every packet crosses the mesh. Round trips first (on a
    quiet region), then the paced and the unpaced throughput."""
    p = ctx.plan["mesh"]
    for rep in range(ctx.plan["repeats"]):
        for name in p["servers"]:
            with Region(ctx, name) as region:
                a = region.nodes[0]
                across = region.peer_args() + a.metrics()
                for load in p["ping_loads"]:
                    extra = ["--ping-pairs", "1", "--ping-rate", "1000", "--ping-size", str(SIZE), *across,
                             *engine_args(ctx.plan)]
                    if load:
                        extra += ["--load-peers", str(PEERS), "--size", str(SIZE), "--load-total-rate", f"{load}M"]
                    ctx.bench(a, "mesh", mesh_ping_point(load), rep, "latency", extra)
                for rate in p["rates"]:
                    ctx.bench(a, "mesh", point_name(rate), rep, "throughput",
                              ["-n", str(PEERS), "--size", str(SIZE), *across, *rate_arg(rate), *engine_args(ctx.plan)])


def mesh_ping_point(load):
    return "rtt" if not load else f"rtt+{load}M"


def suite_clients(ctx):
    """Tailscale's own DERP client as the load (derpload: derphttp over Go's
    crypto/tls, each packet flushed on its own as tailscaled does), beside
    ferry-bench's: delivered rate and the server's CPU per gigabit, plain
    and TLS, Ferry and derper."""
    p = ctx.plan["clients"]
    for rep in range(ctx.plan["repeats"]):
        for transport in ctx.transports:
            for name in p["servers"]:
                with Server(ctx, name, transport == "tls") as srv:
                    ctx.derpload(srv, "clients", "max", rep, ["-n", str(PEERS), "-size", str(SIZE),
                                                             "-warmup", ctx.plan["warmup"], "-d", ctx.plan["window"]])


class RecvQueue:
    """Samples, every 100 ms while inside, the largest receive queue (bytes
    the kernel holds unread) of the server's established sockets on its
    port: for the limited suite, the limited sender's share of what waits
    on the server's side (bytes the server read but has not handled are not
    seen). The summary keeps the samples from `skip` to `skip` + `span`
    seconds after entering (ferry-bench's measured window)."""

    def __init__(self, port, skip, span):
        self.port, self.skip, self.span, self.samples = port, skip, span, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.monotonic()

    def _run(self):
        while not self._stop.wait(0.1):
            t = time.monotonic() - self._t0
            if t < self.skip:
                continue
            if t > self.skip + self.span:
                return
            try:
                out = subprocess.run(["ss", "-Htn", "state", "established", f"( sport = :{self.port} )"],
                                     capture_output=True, text=True, timeout=5).stdout
            except (OSError, subprocess.TimeoutExpired):
                return
            queues = [int(line.split()[0]) for line in out.splitlines() if line.split()]
            if queues:
                self.samples.append(max(queues))

    def __enter__(self):
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self):
        if not self.samples:
            return None
        s = sorted(self.samples)
        return {"samples": len(s), "mean_bytes": sum(s) / len(s), "p50_bytes": s[len(s) // 2], "max_bytes": s[-1]}


def suite_limited(ctx):
    """One pair through a server with --rate-config, the sender offering
    more than its limit: the one-way latency of its packets (how long they
    wait in buffers on the way, the sender's own included) and the kernel
    receive queue of the server's side of the sender's connection."""
    p = ctx.plan["limited"]
    if not shutil.which("ss"):
        log("limited: skipped: no `ss` (iproute2) to read the server's receive queue")
        return
    for rep in range(ctx.plan["repeats"]):
        for name in p["servers"]:
            with Server(ctx, name, False, rate=(p["rate"], p["burst"])) as srv:
                with RecvQueue(srv.port, seconds(p["warmup"]), seconds(p["window"])) as q:
                    report = ctx.bench(srv, "limited", f"{p['offered']}M", rep, "throughput",
                                       ["-n", "2", "--size", str(SIZE), "--rate", f"{p['offered']}M",
                                        "--warmup", p["warmup"], "-d", p["window"], "--drain", ctx.plan["drain"]])
                if report:
                    report["server_recv_queue"] = q.summary()
                    raw = ctx.out / ctx.records[-1]["raw"]
                    raw.write_text(json.dumps(report, indent=1) + "\n")


SUITES = {
    "rate": suite_rate,
    "latency": suite_latency,
    "peers": suite_peers,
    "idle": suite_idle,
    "churn": suite_churn,
    "stuck": suite_stuck,
    "mesh": suite_mesh,
    "clients": suite_clients,
    "limited": suite_limited,
    "scaling": scaling.suite_scaling,
}

# Suites a run leaves out unless --suites names them: the scaling suite
# needs both CPUs for the server and would add some 20 s to CI's quick run.
OPT_IN = ("scaling",)

"""The UDP relay's soak (bench/soak.py --relay udp; see bench/README.md).

Namespaces fu-soakPID-a (generator and latency probe, 10.77.31.2) ──
fu-soakPID-r (`ferry udp-relay`, 10.77.31.1 / 10.77.32.1) ── fu-soakPID-b (sink,
10.77.32.2), veth pairs, as bench/udp/pps.sh builds them. The relay and R's
receive processing (RPS) on --server-cpus, generator, sink and probe (and
A's and B's receive processing) on --client-cpus.

First a relay measures the peak: the generator unpaced for --peak-window,
what the sink counted per second. Then a fresh relay gets --fraction of it
(or --pps) for --warmup + --duration, and this module samples every
--sample: the relay's RSS and descriptors, its metrics (sessions, hub
tables, drops by reason, datagrams relayed), what the sink received in the
interval (`udp_gen sink --report-every`) and the round-trip times of a
probe flow (`udp_gen probe`: --probe-rate timestamped datagrams per second
through the relay, echoed by the sink back through it). After the load the
relay is watched for --idle.

The probe has the shape of the load: a bounce session of its own (raw),
or a WireGuard peer pair of its own in the hub (flow number --flows), so
both shapes have latency.
"""

import ctypes
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# Named per run, so that two soaks (a long run and a CI check, say) never
# take down each other's namespaces.
A, R, B = (f"fu-soak{os.getpid()}-{x}" for x in "arb")
GEN_IP, RELAY_IP, RELAY_B_IP, SINK_IP = "10.77.31.2", "10.77.31.1", "10.77.32.1", "10.77.32.2"
CLONE_NEWNET = 0x40000000
BOUNCE_IDLE = "30s"
METRICS_PORT, DERP_PORT, SINK_PORT = 9101, 8080, 6000
PORTS = {"raw": 5000, "hub": 5001, "session": 5002}
# What the relay exposes that a soak watches (counters as well as gauges).
SAMPLED = ("ferry_udp_sessions", "ferry_udp_hub_", "ferry_udp_drops_total", "ferry_udp_socket_drops_total",
           "ferry_udp_packets_total", "ferry_udp_kernel_udp_errors_total", "ferry_udp_relay_session", "ferry_heap",
           "derp_current_connections")


def seconds(text):
    """'90s', '10m', '250ms' or a bare number of seconds."""
    t = str(text).strip()
    for suffix, f in (("ms", 1e-3), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if t.endswith(suffix) and t[: -len(suffix)].replace(".", "", 1).isdigit():
            return float(t[: -len(suffix)]) * f
    return float(t)


def sh(*cmd, check=True, **kw):
    return subprocess.run([str(c) for c in cmd], check=check, **kw)


def nsx(ns, *cmd):
    return ["ip", "netns", "exec", ns, *[str(c) for c in cmd]]


def wait_until(what, cond, timeout=10.0):
    """Polls cond every 50 ms until it holds, for at most timeout seconds."""
    end = time.time() + timeout
    while not cond():
        if time.time() > end:
            raise RuntimeError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.05)


def bound(ns, port, tcp=False):
    """Whether something in ns listens on the UDP (or TCP) port."""
    out = subprocess.run(nsx(ns, "ss", "-Hltn" if tcp else "-Huln"), capture_output=True, text=True).stdout
    return any(line.split()[3].endswith(f":{port}") for line in out.splitlines() if len(line.split()) > 3)


class Topology:
    """The three namespaces and their links; removed on exit."""

    def __enter__(self):
        self.close()
        for ns in (A, R, B):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        for (x, xa), (y, ya) in (((A, GEN_IP), (R, RELAY_IP)), ((B, SINK_IP), (R, RELAY_B_IP))):
            ix, iy = f"v{x[-1]}-{y[-1]}", f"v{y[-1]}-{x[-1]}"
            sh("ip", "link", "add", ix, "netns", x, "type", "veth", "peer", "name", iy, "netns", y)
            sh("ip", "-n", x, "addr", "add", f"{xa}/24", "dev", ix)
            sh("ip", "-n", y, "addr", "add", f"{ya}/24", "dev", iy)
            sh("ip", "-n", x, "link", "set", ix, "up")
            sh("ip", "-n", y, "link", "set", iy, "up")
        sh("ip", "-n", A, "route", "add", "10.77.32.0/24", "via", RELAY_IP)
        sh("ip", "-n", B, "route", "add", "10.77.31.0/24", "via", RELAY_B_IP)
        return self

    def steer(self, server_cpus, client_cpus):
        """Receive processing (RPS) in R on the relay's CPUs, in A and B on the load's."""
        for ns, cpus in ((R, server_cpus), (A, client_cpus), (B, client_cpus)):
            mask = sum(1 << int(c) for c in cpu_list(cpus))
            sh(*nsx(ns, "sh", "-c", f"for q in /sys/class/net/v*/queues/rx-0/rps_cpus; do echo {mask:x} > $q; done"))

    def close(self):
        for ns in (A, R, B):
            sh("ip", "netns", "del", ns, check=False, stderr=subprocess.DEVNULL)

    def __exit__(self, *exc):
        self.close()


def in_netns(ns, fn):
    """fn() with this thread in namespace ns (for opening a socket there:
    a socket stays in the namespace it was made in), then back."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/var/run/netns/{ns}") as there, open("/proc/thread-self/ns/net") as home:
        if libc.setns(there.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {ns}")
        try:
            return fn()
        finally:
            if libc.setns(home.fileno(), CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")


def cpu_list(spec):
    """'0', '0,1' or '0-3' as a list of CPU numbers."""
    out = []
    for part in str(spec).split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


class Relay:
    """The relay under test in R, pinned (and niced like the suite's
    servers): `ferry udp-relay` for the bounce and the hub; for relay
    sessions a Ferry DERP server with its session port, and in A the SDK
    clients that allocate and bind a session per flow (`session_pps`)."""

    def __init__(self, ctx, a, config):
        self.ctx, self.a, self.config = ctx, a, config
        self.sessions = None

    def __enter__(self):
        a, ctx = self.a, self.ctx
        self.log = open(ctx.tmp / "relay.log", "ab")
        if a.shape == "session":
            args = ["-a", f"{RELAY_IP}:{DERP_PORT}", "--stun=false", "-c", ctx.tmp / "derp.key",
                    "--workers", a.workers, "--relay-port", PORTS["session"], "--metrics-addr",
                    f"{RELAY_IP}:{METRICS_PORT}"]
        else:
            args = ["udp-relay", "--config", self.config, "--log", "warn"]
        udp = PORTS[a.shape]
        cmd = nsx(R, *ctx.pin(a.server_cpus), ctx.bins["ferry"], *args, *a.ferry_args.split())
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_until("the relay binding its ports",
                       lambda: bound(R, udp) and bound(R, METRICS_PORT, tcp=True) or self.proc.poll() is not None)
            if self.proc.poll() is not None:
                raise RuntimeError(f"the relay exited: {(ctx.tmp / 'relay.log').read_text()[-2000:]}")
            if a.shape == "session":
                self.bind_sessions()
        except BaseException:
            self.__exit__()
            raise
        return self

    def bind_sessions(self):
        """A session per flow and one for the probe, bound from A: slot 0
        from the flow's port, slot 1 from the sink's (which therefore runs
        in A too, as in pps.sh); the DERP connections stay up until
        end_sessions."""
        a, ctx = self.a, self.ctx
        self.vni_file = ctx.tmp / "sessions"
        self.vni_file.unlink(missing_ok=True)
        total = seconds(a.warmup) + seconds(a.duration) + seconds(a.peak_window)
        self.sessions = subprocess.Popen(
            nsx(A, *ctx.pin(a.client_cpus), ctx.bins["session_pps"], "--derp", f"http://{RELAY_IP}:{DERP_PORT}/derp",
                "--from", GEN_IP, "--sink", f"{GEN_IP}:{SINK_PORT}", "--flows", a.flows + 1,
                "--seconds", f"{total + 120:.0f}", "--out", self.vni_file),
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_until("the relay sessions being bound", lambda: (self.vni_file.exists() and self.vni_file.stat().st_size > 0)
                   or self.sessions.poll() is not None, timeout=30)
        if self.sessions.poll() is not None:
            raise RuntimeError(f"session set-up failed: {(ctx.tmp / 'relay.log').read_text()[-2000:]}")

    def shape_args(self):
        """How the generator and the probe reach the relay."""
        extra = ["--vni-file", self.vni_file] if self.sessions else []
        return ["--to", f"{RELAY_IP}:{PORTS[self.a.shape]}", "--shape", self.a.shape, *extra]

    def sink_at(self):
        """The sink's namespace and address."""
        return (A, GEN_IP) if self.sessions else (B, SINK_IP)

    def end_sessions(self):
        """Closes the session clients' DERP connections (the load is over)."""
        if self.sessions:
            stop(self.sessions)

    def pid(self):
        """The relay's own pid: `ip netns exec`, nice and taskset exec it in place."""
        return self.proc.pid

    def metrics(self):
        """The relay's sampled metrics, name{labels} → value (empty when
        they cannot be read)."""
        try:
            conn = http.client.HTTPConnection(RELAY_IP, METRICS_PORT, timeout=3)
            conn.sock = in_netns(R, lambda: socket.create_connection((RELAY_IP, METRICS_PORT), timeout=3))
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode(errors="replace")
            conn.close()
        except (OSError, http.client.HTTPException):
            return {}
        out = {}
        for line in text.splitlines():
            if line.startswith(SAMPLED):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def state(self):
        """RSS, descriptors, metrics and the kernel's backlog drops, now
        (`at`: time.time() when the metrics were read). The descriptors
        are counted before the scrape, whose own connection the relay may
        not have closed yet when the answer is read."""
        usage = process_usage(self.pid())
        gauges = self.metrics()
        at = time.time()
        return usage | {"gauges": gauges, "backlog_drops": backlog_drops(), "at": at}

    def __exit__(self, *exc):
        self.end_sessions()
        stop(self.proc)
        self.log.close()


def process_usage(pid):
    """A process's RSS (bytes) and open descriptors, now (None if gone)."""
    rss = fds = None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    return {"rss": rss, "open_fds": fds}


def backlog_drops():
    """Packets the kernel dropped at a CPU's backlog queue, all CPUs
    (/proc/net/softnet_stat, column 2; the whole machine, not one namespace)."""
    return sum(int(line.split()[1], 16) for line in Path("/proc/net/softnet_stat").read_text().splitlines())


def stop(proc):
    """Ends a process this module started (bounded), if it still runs."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def write_config(ctx, a, gen):
    """The relay's configuration: a bounce on 5000 and a hub on 5001 with a
    peer pair per flow and one for the probe. The bounce's sessions idle out
    after --bounce-idle (BOUNCE_IDLE unless given; instead of 3 minutes), so
    the idle phase sees their sockets close; the flows never idle under
    load."""
    path = ctx.tmp / "relay.toml"
    hub = subprocess.run([str(gen), "hub-config", "--flows", str(a.flows + 1), "--sink", f"{SINK_IP}:{SINK_PORT}"],
                         check=True, capture_output=True, text=True).stdout
    path.write_text(f"""pin = true
workers = {a.workers}
metrics_addr = "{RELAY_IP}:{METRICS_PORT}"
[[bounce]]
listen = ["{RELAY_IP}:{PORTS['raw']}"]
target = "{SINK_IP}:{SINK_PORT}"
idle_timeout = "{a.bounce_idle}"
[hub]
listen = ["0.0.0.0:{PORTS['hub']}"]
""" + hub)
    return path


def start_sink(ctx, a, relay, name, seconds, report=True):
    ns, ip = relay.sink_at()
    cmd = nsx(ns, *ctx.pin(a.client_cpus), ctx.bins["udp_gen"], "sink", "--listen", f"{ip}:{SINK_PORT}",
              "--ports", a.flows + 1, "--seconds", f"{seconds:.0f}", "--quiet", "3")
    if a.shape == "hub":
        cmd.append("--answer")
    if report:
        cmd += ["--report-every", str(a.sample_s)]
    out = ctx.tmp / f"{name}.jsonl"
    proc = subprocess.Popen(cmd, stdout=open(out, "wb"), stderr=open(ctx.tmp / f"{name}.err", "wb"))
    wait_until("the sink binding its ports", lambda: bound(ns, SINK_PORT + a.flows) or proc.poll() is not None)
    return proc, out


def gen_cmd(ctx, a, relay, seconds, pps):
    return nsx(A, *ctx.pin(a.client_cpus), ctx.bins["udp_gen"], "send", *relay.shape_args(), "--flows", a.flows,
               "--size", a.size, "--gso", a.gso, "--pps", f"{pps:.0f}", "--seconds", f"{seconds:.1f}")


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip().startswith("{")]


def finish(proc, what, timeout):
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{what} did not finish within {timeout:.0f} s")


def measure_peak(ctx, a, log):
    """Delivered pps with the generator unpaced for --peak-window."""
    gen = ctx.bins["udp_gen"]
    with Relay(ctx, a, write_config(ctx, a, gen)) as relay:
        window = seconds(a.peak_window)
        sink, out = start_sink(ctx, a, relay, "peak-sink", window + 20, report=False)
        sent = json.loads(subprocess.run(gen_cmd(ctx, a, relay, window, 0), check=True, capture_output=True,
                                         text=True).stdout.splitlines()[-1])
        finish(sink, "the peak's sink", 30)
        got = lines(out)[-1]
    log(f"peak: {got['pps']:.0f} pps delivered unpaced ({sent['pps']:.0f} offered), {a.flows} flows, "
        f"{a.size} B{f', GSO trains of {a.gso}' if a.gso else ''}")
    return got["pps"], {"sent": sent, "sink": got}


def soak(ctx, a, pps, log):
    """The soak itself: (state before the load, report, idle samples), in
    the shapes bench/soak.py's summary and plot read."""
    gen = ctx.bins["udp_gen"]
    period = a.sample_s
    total = seconds(a.warmup) + seconds(a.duration)
    with Relay(ctx, a, write_config(ctx, a, gen)) as relay:
        time.sleep(1.0)
        start = relay.state()
        log(f"relay RSS before the first datagram: {start['rss'] / 2**20:.1f} MiB")
        sink, sink_out = start_sink(ctx, a, relay, "sink", total + 30)
        probe_out = ctx.tmp / "probe.jsonl"
        probe = subprocess.Popen(nsx(A, *ctx.pin(a.client_cpus), gen, "probe", *relay.shape_args(),
                                     "--flow", a.flows, "--rate", a.probe_rate,
                                     "--seconds", f"{total:.1f}", "--report-every", period),
                                 stdout=open(probe_out, "wb"), stderr=open(ctx.tmp / "probe.err", "wb"))
        t0 = time.time()
        sender = subprocess.Popen(gen_cmd(ctx, a, relay, total, pps), stdout=subprocess.PIPE,
                                  stderr=open(ctx.tmp / "send.err", "wb"), text=True)
        states = []
        for k in range(1, int(total / period) + 10):
            time.sleep(max(0.0, t0 + k * period - time.time()))
            if sender.poll() is not None:
                break
            st = relay.state()
            states.append({"t_s": round(st["at"] - t0, 2)} | st)
        finish(sender, "the generator", 60)
        sent = json.loads(sender.stdout.read().splitlines()[-1])
        finish(probe, "the probe", 30)
        finish(sink, "the sink", 30)
        relay.end_sessions()
        # Idle: the load has stopped (sessions: their clients gone); same period.
        idle, t1 = [], time.time()
        for k in range(1, int(seconds(a.idle) / period) + 1):
            time.sleep(max(0.0, t1 + k * period - time.time()))
            st = relay.state()
            idle.append({"t_s": round(st["at"] - t1, 2)} | st)
    sink_lines, probe_lines = lines(sink_out), lines(probe_out)
    report = {"result": result(a, pps, sent, sink_lines[-1], probe_lines[-1])
              | {"backlog_drops": states[-1]["backlog_drops"] - start["backlog_drops"] if states else None},
              "samples": samples(a, states, sink_lines, probe_lines, start)}
    return start, report, idle


def forwarded(gauges):
    """Datagrams the relay has forwarded towards the sink, all told."""
    keys = ('ferry_udp_packets_total{mode="bounce",direction="to_target"}',
            'ferry_udp_packets_total{mode="hub",direction="out"}', "ferry_udp_relay_session_forwarded_total")
    return sum(v for k, v in gauges.items() if k in keys)


def samples(a, states, sink_lines, probe_lines, start):
    """One sample per interval: the relay's state at its end, what the sink
    got and what the relay forwarded within it, the probe's round trips."""
    sink_iv = {x["interval"]: x for x in sink_lines if "interval" in x}
    probe_iv = {x["interval"]: x for x in probe_lines if "interval" in x}
    out, before, t = [], forwarded(start["gauges"]), start["at"]
    for k, s in enumerate(states, 1):
        got, rtt = sink_iv.get(k, {}), probe_iv.get(k, {}).get("rtt_us", {})
        now = forwarded(s["gauges"])
        dt, t = max(s["at"] - t, 1e-3), s["at"]
        out.append(s | {
            "received_pps": got.get("pps", 0.0),
            "received_mbps": got.get("mbits", 0.0),
            "relayed_pps": (now - before) / dt,
            "sent_mbps": (now - before) * a.size * 8 / 1e6 / dt,
            "probes_echoed": got.get("probes_echoed", 0),
            "latency_us": {"count": rtt.get("count", 0), "p50": rtt.get("p50", 0), "p99": rtt.get("p99", 0),
                           "p999": rtt.get("max", 0)},
        })
        before = now
    return out


def result(a, pps, sent, sink, probe):
    delivered = sink["packets"]
    return {
        "offered_pps": pps,
        "sent_packets": sent["sent_packets"],
        "sent_pps": sent["pps"],
        "delivered_packets": delivered,
        "delivered_pps": sink["pps"],
        "delivered_mbps": sink["mbits"],
        "loss": 1 - delivered / sent["sent_packets"] if sent["sent_packets"] else None,
        "sink_drops": sink["sink_drops"],
        "generator": sent,
        "probe": probe,
    }


def run(ctx, a, log):
    """Peak (unless --pps), then the soak, in namespaces made here."""
    a.sample_s = seconds(a.sample)
    # Killed (timeout, Ctrl-C): unwind, so the relay, the load and the
    # namespaces go with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with Topology() as topo:
        topo.steer(a.server_cpus, a.client_cpus)
        peak, peak_report = (None, None) if a.pps else measure_peak(ctx, a, log)
        pps = a.pps or a.fraction * peak
        log(f"soak: {pps:.0f} pps offered for {a.duration} (+{a.warmup} warm-up), then {a.idle} idle")
        start, report, idle = soak(ctx, a, pps, log)
    return peak, peak_report, pps, start, report, idle

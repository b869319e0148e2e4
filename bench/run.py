#!/usr/bin/env python3
"""Ferry against derper, side by side: build, run the suites, report.

    bench/run.sh quick            # smoke test (CI): seconds per point, one repeat
    bench/run.sh full             # the real measurement (~29 min on 2 cores)

Every server under test runs pinned to the same cores (--server-cpus,
default 0) with the same settings; ferry-bench runs on the others
(--client-cpus, default 1). Results go to bench/results/<date>/ (full) or a
temporary directory (quick): one raw JSON per run, summary.json, results.md
(medians, min-max spread, ratios) and PNG plots. bench/README.md explains the
method and how to read the output.

Only the Python standard library is needed to run; plots need matplotlib
(python3-matplotlib on Debian) and are skipped with a warning without it.
"""

import argparse
import contextlib
import datetime
import hashlib
import http.client
import json
import os
import platform
import shutil
import shlex
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
DERPER_VERSION = "v1.102.5"
TUNED_QUEUE = 4096  # TS_DEBUG_DERP_PER_CLIENT_SEND_QUEUE_DEPTH of the tuned baseline

# Servers. "plain_only" servers take no part in TLS suites; "no_varz" ones
# serve no /debug/varz for ferry-bench --metrics to read.
SERVERS = {
    "ferry": {"label": "Ferry"},
    "derper": {"label": "derper"},
    "derper-q": {"label": f"derper (queue {TUNED_QUEUE})"},
    "ceiling": {"label": "ceiling", "plain_only": True, "no_varz": True},
    # Hyper-DERP (github.com/hyper-derp/Hyper-DERP, C++/io_uring), built
    # outside the repository by bench/hyperderp/build.sh and given with
    # --hyperderp; its DERP listener has no TLS of its own (kTLS only), so
    # plain DERP only, in the rate and latency suites.
    "hyperderp": {"label": "Hyper-DERP", "plain_only": True, "no_varz": True},
}

# The suites a --hyperderp binary joins, after derper.
HYPERDERP_SUITES = ("rate", "latency")

MBIT = 1e6

# Stuck receivers: the 10 pairs paced at `rate` Mbit/s in all,
# plus `counts` receivers that stop reading; from the window's start every
# sender also sends them `size`-byte packets at `stuck_rate` Mbit/s (over all
# of them). The window outlasts the 2 s write timeout both servers apply, so
# a stall that lasts until the server cuts the stuck receivers off fits in it.
STUCK_PLAN = {"servers": ["ferry", "derper", "derper-q"], "rate": 500, "stuck_rate": 20, "size": 32768,
              "window": "4s"}

# Cross-node traffic through a two-node TLS region (the mesh suite): the
# paced point, total offered Mbit/s, besides the unpaced peak. Pings (1 pair,
# 1000/s) run with each of `ping_loads` Mbit/s of background load (0: alone).
MESH_PACED = 500

# The two modes. Rates are total offered Mbit/s over all flows (None = unpaced).
PLANS = {
    "quick": {
        "repeats": 1,
        "retries": 1,
        "retry_disturbed": False,
        "warmup": "300ms",
        "window": "1s",
        "drain": "3s",
        "rate": {
            "servers": ["ferry", "derper", "derper-q", "ceiling"],
            "plain": [500, None],
            "tls": [500, None],
        },
        "latency": {"servers": ["ferry", "derper", "ceiling"], "levels": [0.5], "window": "1s", "fixed_base_mbps": 500},
        "peers": {"servers": ["ferry", "derper", "ceiling"], "counts": [20, 100]},
        "idle": {"servers": ["ferry", "derper"], "conns": 500, "hold": "500ms", "tls": True},
        "churn": {"servers": ["ferry", "derper"], "duration": "1s", "transports": ["plain", "tls"], "keys": 256},
        "stuck": STUCK_PLAN | {"counts": [3]},
        "mesh": {"servers": ["ferry", "derper"], "rates": [None], "ping_loads": [0]},
    },
    "full": {
        "repeats": 3,
        "retries": 2,
        "retry_disturbed": True,
        "warmup": "1s",
        "window": "2s",
        "drain": "10s",
        "rate": {
            "servers": ["ferry", "derper", "derper-q", "ceiling"],
            "plain": [500, 1000, 1500, 2000, 3000, 4000, 6000, 8000, None],
            "tls": [500, 1000, 1500, 2000, 3000, 4000, None],
        },
        # Background load as a fraction of derper's plain saturation (its peak
        # delivered rate in the rate suite), 0 = pings alone.
        "latency": {"servers": ["ferry", "derper", "derper-q", "ceiling"], "levels": [0, 0.25, 0.5, 0.75, 1.0, 1.5],
                    "window": "3s"},
        "peers": {"servers": ["ferry", "derper", "derper-q", "ceiling"], "counts": [20, 100, 200, 1000]},
        "idle": {"servers": ["ferry", "derper"], "conns": 10000, "hold": "2s", "tls": True},
        "churn": {"servers": ["ferry", "derper"], "duration": "4s", "transports": ["plain", "tls"], "keys": 4096},
        "stuck": STUCK_PLAN | {"counts": [0, 3]},
        "mesh": {"servers": ["ferry", "derper"], "rates": [MESH_PACED, None], "ping_loads": [0]},
    },
}

PEERS = 20  # 20 peers in 10 pairs
SIZE = 1400


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(str(c) for c in cmd))
    return subprocess.run(cmd, check=True, **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, timeout=15.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


# ---------------------------------------------------------------------------
# Build


def build(args):
    profile = args.profile
    flag = ["--release"] if profile == "release" else []
    run(["cargo", "build", "--locked", *flag, "-p", "ferry", "-p", "ferry-bench"], cwd=ROOT)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    out = target / ("release" if profile == "release" else "debug")
    bins = {"ferry": out / "ferry", "ferry-bench": out / "ferry-bench"}
    derper = BENCH / "bin" / "derper"
    if not derper_is_current(derper):
        (BENCH / "bin").mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, GOBIN=str(BENCH / "bin"), GOFLAGS="-mod=mod")
        run(["go", "install", f"tailscale.com/cmd/derper@{DERPER_VERSION}"], env=env, cwd=BENCH)
    bins["derper"] = derper
    return bins


def derper_is_current(path):
    if not path.exists():
        return False
    try:
        out = subprocess.run(["go", "version", "-m", str(path)], capture_output=True, text=True).stdout
    except OSError:
        return False
    return f"tailscale.com\t{DERPER_VERSION}" in out


# A new ECDSA P-256 key, unencrypted (openssl req).
EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl(*args):
    subprocess.run(["openssl", *(str(a) for a in args)], check=True, capture_output=True)


def make_cert(tmp):
    certdir = tmp / "certs"
    certdir.mkdir()
    openssl("req", "-x509", *EC_KEY, "-days", "30", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
            "-addext", "basicConstraints=critical,CA:FALSE", "-addext", "extendedKeyUsage=serverAuth",
            "-keyout", certdir / "localhost.key", "-out", certdir / "localhost.crt")
    return certdir


def make_region_certs(tmp):
    """The mesh suite's certificates: a throw-away CA (ca.pem) and a
    certificate for localhost it signs, shared by the region's nodes, which
    verify each other against the CA (SSL_CERT_FILE) as a real region's
    nodes do against the system's roots; plus the region's mesh key."""
    d = tmp / "region-certs"
    d.mkdir()
    openssl("req", "-x509", *EC_KEY, "-days", "30", "-subj", "/CN=ferry bench CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
            "-keyout", d / "ca.key", "-out", d / "ca.pem")
    openssl("req", "-new", *EC_KEY, "-subj", "/CN=localhost", "-keyout", d / "localhost.key", "-out", d / "localhost.csr")
    (d / "leaf.ext").write_text("subjectAltName=DNS:localhost\nbasicConstraints=critical,CA:FALSE\n"
                                "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n")
    openssl("x509", "-req", "-in", d / "localhost.csr", "-CA", d / "ca.pem", "-CAkey", d / "ca.key",
            "-set_serial", "0x" + os.urandom(8).hex(), "-days", "30", "-extfile", d / "leaf.ext",
            "-out", d / "localhost.crt")
    (d / "mesh.key").write_text(os.urandom(32).hex() + "\n")
    (d / "mesh.key").chmod(0o600)
    return d


# ---------------------------------------------------------------------------
# Servers


class Server:
    """One server process, pinned and niced like every other. A node of a
    region (the mesh suite) has its CA-signed certificate in `certdir`, the
    CA in `ca` and `mesh` = (mesh key file, --mesh-with list)."""

    def __init__(self, ctx, name, tls, certdir=None):
        self.ctx, self.name, self.tls = ctx, name, tls
        self.port = free_port()
        self.proc = None
        self.certdir = certdir or ctx.certdir
        self.ca = self.certdir / ("ca.pem" if certdir else "localhost.crt")
        self.mesh = None

    def command(self):
        c = self.ctx
        addr = f"127.0.0.1:{self.port}"
        state = c.tmp / f"{self.name}-{self.port}"
        state.mkdir()
        env = dict(os.environ)
        if self.name in ("ferry", "ferry-base"):
            cmd = [str(c.bins[self.name]), "-a", addr, "--stun=false", "-c", str(state / "ferry.key"),
                   "--workers", str(c.args.workers), "--log", "warn"]
            cmd += shlex.split(c.args.ferry_args if self.name == "ferry" else c.args.baseline_args)
            if self.tls:
                cmd += ["--certmode", "manual", "--certdir", str(self.certdir), "--hostname", "localhost", "--http-port", "-1"]
        elif self.name in ("derper", "derper-q"):
            cmd = [str(c.bins["derper"]), "-a", addr, "-http-port", "-1", "-stun=false", "-c", str(state / "derper.json")]
            if self.tls:
                cmd += ["-certmode", "manual", "-certdir", str(self.certdir), "-hostname", "localhost"]
            if self.name == "derper-q":
                env["TS_DEBUG_DERP_PER_CLIENT_SEND_QUEUE_DEPTH"] = str(TUNED_QUEUE)
        elif self.name == "ceiling":
            assert not self.tls, "the ceiling speaks plain DERP only"
            cmd = [str(c.bins["ferry-bench"]), "ceiling-server", "-a", addr]
        elif self.name == "hyperderp":
            assert not self.tls, "Hyper-DERP is measured with plain DERP only"
            # It listens on every address (no bind-address option); the
            # generator connects over loopback. Its key is made at start, like
            # the others' (their key files are new per run). The workers
            # count is Ferry's; taskset confines all its threads, as for the
            # others, so --pin-workers would add nothing on one CPU.
            cmd = [str(c.bins["hyperderp"]), "--port", str(self.port), "--workers", str(c.args.workers),
                   "--log-level", "warn"]
        else:
            raise ValueError(self.name)
        if self.mesh:
            psk, peers = self.mesh
            # The same flags for both servers (derper takes either dash).
            cmd += ["--mesh-psk-file", str(psk), "--mesh-with", peers]
            env["SSL_CERT_FILE"] = str(self.ca)
        return c.pin(c.args.server_cpus) + cmd, env

    def __enter__(self):
        cmd, env = self.command()
        logf = open(self.ctx.tmp / f"{self.name}-{self.port}.log", "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT)
        wait_port(self.port, self.proc)
        time.sleep(0.2)
        return self

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def url(self):
        return f"{'https://localhost' if self.tls else 'http://127.0.0.1'}:{self.port}"

    def metrics(self):
        """--metrics for servers that serve /debug/varz."""
        return [] if SERVERS[self.name].get("no_varz") else ["--metrics"]

    def client_args(self):
        a = ["-s", self.url(), "--server-pid", str(self.proc.pid)]
        if self.tls:
            a += ["--connect", f"127.0.0.1:{self.port}", "--ca", str(self.ca)]
        return a

    def varz(self):
        """The server's /debug/varz samples (name{labels} -> value); empty
        when it cannot be read (yet)."""
        try:
            if self.tls:
                tls = ssl.create_default_context(cafile=str(self.ca))
                conn = http.client.HTTPSConnection("localhost", self.port, context=tls, timeout=2)
            else:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            conn.request("GET", "/debug/varz")
            resp = conn.getresponse()
            body = resp.read().decode(errors="replace") if resp.status == 200 else ""
            conn.close()
        except (OSError, http.client.HTTPException):
            return {}
        out = {}
        for line in body.splitlines():
            parts = line.split()
            if len(parts) >= 2 and not line.startswith("#"):
                try:
                    out[parts[0]] = float(parts[1])
                except ValueError:
                    pass
        return out


class Region:
    """Two TLS nodes of one server, meshed both ways: each dials the other
    (--mesh-with localhost:PORT/127.0.0.1) with the region's mesh key and
    trusts the CA that signed both certificates. Node 0 takes the senders,
    node 1 the receivers."""

    def __init__(self, ctx, name):
        certdir = ctx.region_certdir()
        self.name = name
        self.nodes = [Server(ctx, name, True, certdir=certdir) for _ in range(2)]
        for i, node in enumerate(self.nodes):
            other = self.nodes[1 - i]
            node.mesh = (certdir / "mesh.key", f"localhost:{other.port}/127.0.0.1")

    def __enter__(self):
        self.stack = contextlib.ExitStack()
        with self.stack as stack:
            for node in self.nodes:
                stack.enter_context(node)
            self.wait_meshed()
            self.stack = stack.pop_all()
        return self

    def __exit__(self, *exc):
        self.stack.close()

    def wait_meshed(self, timeout=30.0):
        """Until each node has the other's mesh link watching its clients
        (derp_watchers, as both servers count it), so each knows the other's
        clients. derper dials a peer that was not up yet again after 5 s,
        Ferry after about 1 s."""
        started = time.time()
        while time.time() < started + timeout:
            for node in self.nodes:
                if node.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} region: a node exited with {node.proc.returncode}")
            if all(node.varz().get("derp_watchers", 0) >= 1 for node in self.nodes):
                log(f"{self.name} region: meshed both ways after {time.time() - started:.1f} s")
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} region: the nodes did not mesh within {timeout:.0f} s")

    def peer_args(self):
        """ferry-bench's flags for the receivers' node."""
        b = self.nodes[1]
        return ["--peer-url", b.url(), "--peer-connect", f"127.0.0.1:{b.port}", "--peer-server-pid", str(b.proc.pid)]


# ---------------------------------------------------------------------------
# Running ferry-bench


class Context:
    def __init__(self, args, bins, out, tmp, certdir, plan):
        self.args, self.bins, self.out, self.tmp, self.certdir, self.plan = args, bins, out, tmp, certdir, plan
        self.records = []
        self._region_certdir = None
        self.nice = os.geteuid() == 0 and not args.no_nice
        self.transports = [t for t in getattr(args, "transports", "plain,tls").split(",") if t]

    def region_certdir(self):
        if self._region_certdir is None:
            self._region_certdir = make_region_certs(self.tmp)
        return self._region_certdir

    def pin(self, cpus):
        prefix = []
        if self.nice:
            prefix += ["nice", "-n", "-20"]
        if cpus and shutil.which("taskset"):
            prefix += ["taskset", "-c", cpus]
        return prefix

    def bench(self, server, suite, point, repeat, mode, extra):
        """Runs ferry-bench once (retrying disturbed runs) and records it."""
        name = f"{suite}/{server.name}-{'tls' if server.tls else 'plain'}-{point}-r{repeat}"
        raw = self.out / "raw" / f"{name}.json"
        raw.parent.mkdir(parents=True, exist_ok=True)
        attempts = 0
        report, error = None, None
        tried = []  # (report, disturbed, insane) of every attempt that ran
        for attempts in range(1, self.plan["retries"] + 2):
            cmd = self.pin(self.args.client_cpus) + [str(self.bins["ferry-bench"]), mode, "-q", "-o", str(raw)]
            cmd += server.client_args() + extra
            started = time.time()
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                error = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
                log(f"{name}: FAILED: {error}")
                if server.proc.poll() is not None:
                    break
                continue
            attempt = json.loads(raw.read_text())
            disturbed = (attempt.get("machine") or {}).get("disturbed", False)
            why = insane(attempt)
            tried.append((attempt, disturbed, why))
            log(f"{name}: {headline(attempt)} ({time.time() - started:.1f} s{', disturbed' if disturbed else ''}"
                f"{', NOT SANE: ' + why if why else ''})")
            # Full runs retry what other work on the machine disturbed; quick
            # runs only what came out unusable.
            if not why and not (disturbed and self.plan["retry_disturbed"]):
                break
        if tried:
            # Keep the first clean attempt; failing that the sane one the
            # rest of the machine disturbed least; failing that the last.
            clean = [t for t in tried if not t[1] and not t[2]]
            sane = sorted((t for t in tried if not t[2]), key=lambda t: disturbance(t[0]))
            report = (clean or sane or tried[-1:])[0][0]
            report.setdefault("bench", {})["disturbed_attempts"] = sum(1 for t in tried if t[1])
            error = None
        rec = {
            "suite": suite,
            "server": server.name,
            "transport": "tls" if server.tls else "plain",
            "point": point,
            "repeat": repeat,
            "attempts": attempts,
            "error": error,
            "raw": str(raw.relative_to(self.out)) if report else None,
            "report": report,
        }
        if report:
            report.setdefault("bench", {}).update({k: rec[k] for k in ("suite", "server", "transport", "point", "repeat", "attempts")})
            raw.write_text(json.dumps(report, indent=1) + "\n")
        self.records.append(rec)
        return report


def disturbance(r):
    """How much a run was disturbed: other work and steal (cores), plus how
    far a spinning generator fell short of its core."""
    m = r.get("machine") or {}
    c = r.get("client") or {}
    starved = max(0.0, 0.9 - c.get("cpu_util_per_thread", 1.0)) if c.get("busy_fraction") is not None else 0.0
    return m.get("other_cpu", 0.0) + m.get("steal", 0.0) + starved


def headline(r):
    res = r["result"]
    m = res["mode"]
    if m == "throughput":
        line = f"{res['delivered_mbps']:.0f} Mbit/s, loss {res['loss'] * 100:.3f}%"
        if "gap_us" in res:
            line += f", longest gap {res['gap_us']['max'] / 1e3:.1f} ms"
        if res.get("stuck"):
            line += f", {res['stuck']['cut_off']} of {res['stuck']['peers']} stuck receivers cut off"
        return line
    if m == "latency":
        return f"rtt p50 {res['rtt_us']['p50']:.0f} p99 {res['rtt_us']['p99']:.0f} µs"
    if m == "idle":
        b = res.get("server_bytes_per_conn")
        return f"{res['established']}/{res['requested']} held, {b / 1024 if b else float('nan'):.1f} KiB/conn"
    if m == "churn":
        return f"{res['handshakes_per_s']:.0f} handshakes/s, {res['failed']} failed"
    return m


def engine_args(plan, window=None):
    return ["--warmup", plan["warmup"], "-d", window or plan["window"], "--drain", plan["drain"]]


def rate_arg(total_mbps):
    return ["--rate", "max"] if total_mbps is None else ["--total-rate", f"{total_mbps}M"]


def point_name(total_mbps):
    return "max" if total_mbps is None else f"{total_mbps}M"


# ---------------------------------------------------------------------------
# Suites


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


SUITES = {
    "rate": suite_rate,
    "latency": suite_latency,
    "peers": suite_peers,
    "idle": suite_idle,
    "churn": suite_churn,
    "stuck": suite_stuck,
    "mesh": suite_mesh,
}


# ---------------------------------------------------------------------------
# Summaries


def values(records, suite, server, transport, point, get):
    out = []
    for r in records:
        if (r["suite"], r["server"], r["transport"], r["point"]) == (suite, server, transport, point) and r["report"]:
            v = get(r["report"])
            if v is not None:
                out.append(v)
    return out


def stat(vals):
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def fmt(s, digits=0, scale=1.0):
    if not s:
        return "–"
    m, lo, hi = s["median"] * scale, s["min"] * scale, s["max"] * scale
    if s["n"] == 1:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


def ratio(a, b):
    if not a or not b or not b["median"]:
        return "–"
    return f"{a['median'] / b['median']:.2f}×"


def points_of(records, suite):
    seen = []
    for r in records:
        if r["suite"] == suite and r["point"] not in seen:
            seen.append(r["point"])
    return seen


def summarize(ctx):
    rec = ctx.records
    s = {"rate": {}, "latency": {}, "peers": {}, "idle": {}, "churn": {}, "stuck": {}, "mesh": {}}
    tp = lambda r: r["result"]["delivered_mbps"]  # noqa: E731
    for transport in ("plain", "tls"):
        for name in SERVERS:
            for point in points_of(rec, "rate"):
                d = stat(values(rec, "rate", name, transport, point, tp))
                if d:
                    s["rate"].setdefault(transport, {}).setdefault(name, {})[point] = {
                        "delivered_mbps": d,
                        "sent_mbps": stat(values(rec, "rate", name, transport, point, lambda r: r["result"]["sent_mbps"])),
                        "loss": stat(values(rec, "rate", name, transport, point, lambda r: r["result"]["loss"])),
                        "latency_p99_us": stat(values(rec, "rate", name, transport, point, lambda r: r["result"]["latency_us"]["p99"])),
                        "server_cpu": stat(values(rec, "rate", name, transport, point, lambda r: (r.get("server") or {}).get("cpu_util"))),
                        "client_busy": stat(values(rec, "rate", name, transport, point, lambda r: r["client"].get("busy_fraction"))),
                    }
    for name in SERVERS:
        for point in points_of(rec, "latency"):
            q = {}
            for pct in ("p50", "p90", "p99", "p999", "max"):
                q[pct] = stat(values(rec, "latency", name, "plain", point, lambda r, pct=pct: r["result"]["rtt_us"][pct]))
            if q["p50"]:
                q["ping_loss"] = stat(values(rec, "latency", name, "plain", point, lambda r: r["result"]["ping_loss"]))
                q["background_mbps"] = stat(values(rec, "latency", name, "plain", point,
                                                   lambda r: (r["result"].get("background") or {}).get("delivered_mbps")))
                q["server_cpu"] = stat(values(rec, "latency", name, "plain", point,
                                              lambda r: (r.get("server") or {}).get("cpu_util")))
                s["latency"].setdefault(name, {})[point] = q
        for point in points_of(rec, "stuck"):
            d = stat(values(rec, "stuck", name, "plain", point, tp))
            if d:
                def get(f, point=point):
                    return stat(values(rec, "stuck", name, "plain", point, f))
                s["stuck"].setdefault(name, {})[point] = {
                    "delivered_mbps": d,
                    "loss": get(lambda r: r["result"]["loss"]),
                    "gap_max_ms": get(lambda r: r["result"]["gap_us"]["max"] / 1e3),
                    "gap_p99_ms": get(lambda r: r["result"]["gap_us"]["p99"] / 1e3),
                    "disconnects": get(lambda r: r["result"]["disconnects"]),
                    "backpressured": get(lambda r: r["result"]["packets_backpressured"]),
                    "stuck_cut_off": get(lambda r: (r["result"].get("stuck") or {}).get("cut_off")),
                    "stuck_delivered": get(lambda r: stuck_delivered(r["result"].get("stuck"))),
                }
        for point in points_of(rec, "mesh"):
            def get(f, point=point):
                return stat(values(rec, "mesh", name, "tls", point, f))
            modes = values(rec, "mesh", name, "tls", point, lambda r: r["result"]["mode"])
            if "latency" in modes:
                q = {pct: get(lambda r, pct=pct: r["result"]["rtt_us"][pct]) for pct in ("p50", "p90", "p99", "p999", "max")}
                q["ping_loss"] = get(lambda r: r["result"]["ping_loss"])
                q["background_mbps"] = get(lambda r: (r["result"].get("background") or {}).get("delivered_mbps"))
                s["mesh"].setdefault(name, {})[point] = q
            elif "throughput" in modes:
                s["mesh"].setdefault(name, {})[point] = {
                    "delivered_mbps": get(tp),
                    "loss": get(lambda r: r["result"]["loss"]),
                    "latency_p99_us": get(lambda r: r["result"]["latency_us"]["p99"]),
                    "server_cpu": get(region_cpu),
                    "client_busy": get(lambda r: r["client"].get("busy_fraction")),
                }
        for point in points_of(rec, "peers"):
            d = stat(values(rec, "peers", name, "plain", point, tp))
            if d:
                s["peers"].setdefault(name, {})[point] = {
                    "delivered_mbps": d,
                    "loss": stat(values(rec, "peers", name, "plain", point, lambda r: r["result"]["loss"])),
                }
        for transport in ("plain", "tls"):
            for point in points_of(rec, "idle"):
                b = stat(values(rec, "idle", name, transport, point, lambda r: r["result"].get("server_bytes_per_conn")))
                if b:
                    s["idle"].setdefault(transport, {})[name] = {
                        "bytes_per_conn": b,
                        "established": stat(values(rec, "idle", name, transport, point, lambda r: r["result"]["established"])),
                        "connect_rate": stat(values(rec, "idle", name, transport, point, lambda r: r["result"]["connect_rate"])),
                        "conns": int(point),
                    }
            h = stat(values(rec, "churn", name, transport, "max", lambda r: r["result"]["handshakes_per_s"]))
            if h:
                s["churn"].setdefault(transport, {})[name] = {
                    "handshakes_per_s": h,
                    "p99_ms": stat(values(rec, "churn", name, transport, "max", lambda r: r["result"]["handshake_ms"]["p99"])),
                    "failed": stat(values(rec, "churn", name, transport, "max", lambda r: r["result"]["failed"])),
                }
    s["headline"] = headline_rows(ctx, s)
    return s


def region_cpu(r):
    """Both nodes' CPU (cores) over a mesh run's window, or None."""
    a = (r.get("server") or {}).get("cpu_util")
    b = ((r.get("peer") or {}).get("server") or {}).get("cpu_util")
    return None if a is None or b is None else a + b


def stuck_delivered(st):
    """The share of the packets sent to stuck receivers in the window that
    they read afterwards (what the server kept for them), or None."""
    if not st or not st["packets_sent"]:
        return None
    return st["packets_delivered"] / st["packets_sent"]


def peak(s, transport, name):
    """(median delivered at the best point, that point's stats)."""
    pts = s["rate"].get(transport, {}).get(name, {})
    best = None
    for point, v in pts.items():
        if best is None or v["delivered_mbps"]["median"] > best[1]["delivered_mbps"]["median"]:
            best = (point, v)
    return best


def offered_of(point):
    return None if point == "max" else float(point.rstrip("M"))


def headline_rows(ctx, s):
    """The issue-3 bar, row by row."""
    rows = []

    def peak_stat(transport, name):
        b = peak(s, transport, name)
        return b[1]["delivered_mbps"] if b else None

    def div(a, b):
        return a["median"] / b["median"] if a and b and b["median"] else None

    for transport, bar in (("plain", 3.0), ("tls", 2.0)):
        vals = {n: peak_stat(transport, n) for n in SERVERS}
        r = div(vals.get("ferry"), vals.get("derper"))
        rows.append({
            "metric": f"{'Plain' if transport == 'plain' else 'TLS'} throughput, 20 peers / 10 pairs, 1400 B: peak delivered, Mbit/s",
            "values": vals, "ratio": r, "ratio_q": div(vals.get("ferry"), vals.get("derper-q")),
            "bar": f"≥ {bar:.0f}× derper", "met": r is not None and r >= bar, "unit": "Mbit/s"})

    # Loss at the highest offered rate where Ferry is not saturated.
    fer = s["rate"].get("plain", {}).get("ferry", {})
    cand = [(offered_of(p), v) for p, v in fer.items() if offered_of(p)]
    unsat = [(o, v) for o, v in cand if v["delivered_mbps"]["median"] >= 0.95 * o]
    if unsat:
        o, v = max(unsat, key=lambda x: x[0])
        loss = v["loss"]
        others = {n: s["rate"].get("plain", {}).get(n, {}).get(f"{o:.0f}M", {}).get("loss") for n in SERVERS}
        rows.append({
            "metric": f"Plain loss at {o:.0f} Mbit/s offered (the highest rate Ferry carries unsaturated)",
            "values": others, "ratio": None, "bar": "< 0.1 %", "met": loss["median"] < 0.001, "unit": "loss"})

    lat = s["latency"]
    if "150%" in lat.get("ferry", {}) and "150%" in lat.get("derper", {}):
        f99, d99 = lat["ferry"]["150%"]["p99"], lat["derper"]["150%"]["p99"]
        r = div(f99, d99)
        rows.append({
            "metric": f"p99 RTT at 150 % of derper's saturation ({1.5 * getattr(ctx, 'latency_base', 0):.0f} Mbit/s offered), µs",
            "values": {n: lat.get(n, {}).get("150%", {}).get("p99") for n in SERVERS},
            "ratio": r, "ratio_q": div(f99, lat.get("derper-q", {}).get("150%", {}).get("p99")),
            "bar": "≤ 0.5× derper", "met": r is not None and r <= 0.5, "unit": "µs"})

    pe = s["peers"]
    counts = sorted({int(p) for n in pe for p in pe[n]})
    if counts and 20 in counts and max(counts) > 20:
        top = str(max(counts))
        vals = {n: pe.get(n, {}).get(top, {}).get("delivered_mbps") for n in SERVERS}
        keep = div(vals.get("ferry"), pe.get("ferry", {}).get("20", {}).get("delivered_mbps"))
        kept = f"{keep * 100:.0f} %" if keep is not None else "?"
        rows.append({
            "metric": f"{top} peers (plain, unpaced): delivered Mbit/s; Ferry keeps {kept} of its 20-peer rate",
            "values": vals, "ratio": div(vals.get("ferry"), vals.get("derper")),
            "ratio_q": div(vals.get("ferry"), vals.get("derper-q")),
            "bar": "≥ 95 % of the 20-peer rate", "met": keep is not None and keep >= 0.95, "unit": "Mbit/s"})

    idle = s["idle"].get("tls", {})
    if idle.get("ferry"):
        b = idle["ferry"]["bytes_per_conn"]
        rows.append({
            "metric": f"Server memory per idle TLS connection ({idle['ferry']['conns']} held), KiB",
            "values": {n: idle.get(n, {}).get("bytes_per_conn") for n in SERVERS},
            "ratio": (b["median"] / idle["derper"]["bytes_per_conn"]["median"]) if idle.get("derper") else None,
            "bar": "≤ 16 KiB", "met": b["median"] <= 16 * 1024, "unit": "KiB"})

    for transport in ("plain", "tls"):
        ch = s["churn"].get(transport, {})
        if ch.get("ferry"):
            vals = {n: ch.get(n, {}).get("handshakes_per_s") for n in SERVERS}
            rows.append({"metric": f"{'Plain' if transport == 'plain' else 'TLS'} churn: connect + handshake + close, per second",
                         "values": vals, "ratio": div(vals.get("ferry"), vals.get("derper")), "bar": "–", "met": None,
                         "unit": "/s"})
    return rows


def cell(v, unit):
    if not v:
        return "–"
    if unit == "loss":
        return fmt(v, 3, 100.0) + " %"
    if unit == "KiB":
        return fmt(v, 1, 1 / 1024)
    return fmt(v, 0)


def headline_table(s, servers):
    lines = ["| Metric | " + " | ".join(SERVERS[n]["label"] for n in servers) +
             f" | Ferry / derper | Ferry / derper (queue {TUNED_QUEUE}) | Bar | Met |",
             "|---|" + "---|" * len(servers) + "---|---|---|---|"]
    for row in s["headline"]:
        vals = " | ".join(cell(row["values"].get(n), row["unit"]) for n in servers)
        r = f"{row['ratio']:.2f}" if row["ratio"] is not None else "–"
        rq = f"{row['ratio_q']:.2f}" if row.get("ratio_q") is not None else "–"
        met = {True: "yes", False: "**no**", None: "–"}[row["met"]]
        lines.append(f"| {row['metric']} | {vals} | {r} | {rq} | {row['bar']} | {met} |")
    return "\n".join(lines)


def markdown(ctx, s, machine):
    out = []
    w = out.append
    w(f"# Ferry vs derper — {ctx.args.mode} run, {machine['date']}\n")
    w(f"Machine: {machine['cpu']}, {machine['cpus']} CPUs, {machine['mem_gib']:.0f} GiB, Linux {machine['kernel']}. "
      f"Servers on CPU {ctx.args.server_cpus}, ferry-bench on CPU {ctx.args.client_cpus}"
      f"{', both at nice -20' if ctx.nice else ''}. Ferry {machine['ferry_rev']} (`--workers {ctx.args.workers}`, "
      f"I/O back end: {machine.get('ferry_backend', '?')}"
      f"{extra_flags(machine)}), derper {DERPER_VERSION} ({machine['go']}), "
      f"tuned derper: `TS_DEBUG_DERP_PER_CLIENT_SEND_QUEUE_DEPTH={TUNED_QUEUE}`"
      + (f", {machine['hyperderp']} (`--workers {ctx.args.workers}`, plain DERP only)" if machine.get("hyperderp") else "")
      + ".\n")
    w(f"Cells: median over {ctx.plan['repeats']} repeat(s) (min–max). Rates: Mbit/s of DERP packet payload. "
      f"Window {ctx.plan['window']} after {ctx.plan['warmup']} warm-up. See bench/README.md.\n")
    disturbed = sum(1 for r in ctx.records if r["report"] and (r["report"].get("machine") or {}).get("disturbed"))
    failed = sum(1 for r in ctx.records if r["error"])
    w(f"Runs: {len(ctx.records)}, failed: {failed}, still disturbed after retries: {disturbed}.\n")
    servers = [n for n in SERVERS if any(r["server"] == n for r in ctx.records)]
    w("## Headline\n")
    w(headline_table(s, servers) + "\n")

    for transport in ("plain", "tls"):
        rs = s["rate"].get(transport)
        if not rs:
            continue
        names = [n for n in SERVERS if n in rs]
        w(f"## Throughput vs offered rate — {transport}, {PEERS} peers / {PEERS // 2} pairs, {SIZE} B\n")
        w("Delivered Mbit/s.\n")
        # Ferry against each of these, where it ran.
        against = [n for n in ("derper", "derper-q", "hyperderp") if n in rs or n != "hyperderp"]
        w("| Offered | " + " | ".join(SERVERS[n]["label"] for n in names) + " | "
          + " | ".join(f"Ferry/{SERVERS[n]['label']}" for n in against) + " |")
        w("|---|" + "---|" * (len(names) + len(against)))
        for point in points_of(ctx.records, "rate"):
            row = [rs.get(n, {}).get(point, {}).get("delivered_mbps") for n in names]
            f = rs.get("ferry", {}).get(point, {}).get("delivered_mbps")
            if any(row):
                w(f"| {point} | " + " | ".join(fmt(v) for v in row) + " | "
                  + " | ".join(ratio(f, rs.get(n, {}).get(point, {}).get("delivered_mbps")) for n in against) + " |")
        w("\nLoss (% of the window's packets):\n")
        w("| Offered | " + " | ".join(SERVERS[n]["label"] for n in names) + " |")
        w("|---|" + "---|" * len(names))
        for point in points_of(ctx.records, "rate"):
            row = [rs.get(n, {}).get(point, {}).get("loss") for n in names]
            if any(row):
                w(f"| {point} | " + " | ".join(fmt(v, 3, 100.0) for v in row) + " |")
        w("\nServer CPU (cores busy) / ferry-bench busy fraction:\n")
        w("| Offered | " + " | ".join(SERVERS[n]["label"] for n in names) + " |")
        w("|---|" + "---|" * len(names))
        for point in points_of(ctx.records, "rate"):
            cells = []
            for n in names:
                v = rs.get(n, {}).get(point, {})
                cells.append(f"{fmt(v.get('server_cpu'), 2)} / {fmt(v.get('client_busy'), 2)}" if v else "–")
            w(f"| {point} | " + " | ".join(cells) + " |")
        w("")

    lat = s["latency"]
    if lat:
        names = [n for n in SERVERS if n in lat]
        base = getattr(ctx, "latency_base", 0)
        w(f"## Round-trip latency under load — plain, 1 ping pair at 1000/s, {SIZE} B\n")
        w(f"Load: {PEERS} background peers, as a share of derper's saturation throughput ({base:.0f} Mbit/s). "
          "RTT in µs, p50 / p99 / p99.9, and the server's CPU in cores (medians over repeats).\n")
        against = [n for n in ("derper", "hyperderp") if n in lat or n != "hyperderp"]
        w("| Load | " + " | ".join(SERVERS[n]["label"] for n in names) + " | "
          + " | ".join(f"p99 Ferry/{SERVERS[n]['label']}" for n in against) + " |")
        w("|---|" + "---|" * (len(names) + len(against)))
        for point in points_of(ctx.records, "latency"):
            cells = []
            for n in names:
                q = lat[n].get(point)
                cpu = (q or {}).get("server_cpu")
                cells.append(f"{q['p50']['median']:.0f} / {q['p99']['median']:.0f} / {q['p999']['median']:.0f}"
                             f"{f' · {fmt(cpu, 2)}' if cpu else ''}" if q else "–")
            f = lat.get("ferry", {}).get(point)
            w(f"| {point} | " + " | ".join(cells) + " | "
              + " | ".join(ratio(f and f["p99"], (lat.get(n, {}).get(point) or {}).get("p99")) for n in against) + " |")
        w("")

    pe = s["peers"]
    if pe:
        names = [n for n in SERVERS if n in pe]
        w(f"## Throughput vs peer count — plain, unpaced, {SIZE} B\n")
        w("| Peers | " + " | ".join(SERVERS[n]["label"] for n in names) + " | Ferry/derper |")
        w("|---|" + "---|" * (len(names) + 1))
        for point in points_of(ctx.records, "peers"):
            row = [pe[n].get(point, {}).get("delivered_mbps") for n in names]
            w(f"| {point} | " + " | ".join(fmt(v) for v in row) +
              f" | {ratio(pe.get('ferry', {}).get(point, {}).get('delivered_mbps'), pe.get('derper', {}).get(point, {}).get('delivered_mbps'))} |")
        w("")

    st = s["stuck"]
    if st:
        names = [n for n in SERVERS if n in st]
        p = ctx.plan.get("stuck") or STUCK_PLAN
        w(f"## Stuck receivers among active pairs — plain, {PEERS} peers / {PEERS // 2} pairs at {p['rate']} Mbit/s, "
          f"{SIZE} B\n")
        w(f"From the window's start every sender also sends {p['size'] // 1024} KiB packets at {p['stuck_rate']} Mbit/s "
          f"to extra receivers that never read their socket after the handshake. Figures of the healthy pairs over a "
          f"{p['window']} window, except the last two rows. bench/README.md explains each row.\n")
        rows = [
            (f"Healthy delivered, Mbit/s (of {p['rate']} offered)", "delivered_mbps", 0, 1.0),
            ("Healthy loss, %", "loss", 3, 100.0),
            ("Longest gap at a healthy receiver, ms", "gap_max_ms", 1, 1.0),
            ("p99 gap at the healthy receivers, ms", "gap_p99_ms", 2, 1.0),
            ("Packets skipped while senders were held back", "backpressured", 0, 1.0),
            ("Healthy connections lost", "disconnects", 0, 1.0),
            ("Stuck receivers cut off by the server", "stuck_cut_off", 0, 1.0),
            ("Packets to stuck receivers they read afterwards, %", "stuck_delivered", 1, 100.0),
        ]
        for point in points_of(ctx.records, "stuck"):
            w(f"**{point} stuck receivers**\n")
            w("| | " + " | ".join(SERVERS[n]["label"] for n in names) + " |")
            w("|---|" + "---|" * len(names))
            for label, key, digits, scale in rows:
                if point == "0" and key.startswith("stuck_"):
                    continue
                w(f"| {label} | " + " | ".join(fmt(st[n].get(point, {}).get(key), digits, scale) for n in names) + " |")
            w("")

    me = s["mesh"]
    if me:
        names = [n for n in SERVERS if n in me]
        w("## Across a two-node region — TLS, senders on node A, receivers on node B\n")
        w(f"Two nodes of the same server meshed both ways (`--mesh-with`, one mesh key, certificates from one CA), "
          f"both on CPU {ctx.args.server_cpus}. The {PEERS // 2} senders of {PEERS // 2} pairs connect to node A, their "
          f"receivers to node B, so every packet is forwarded over the mesh link; {SIZE} B. Round trips: 1 ping pair "
          "at 1000/s, the ping on node A, the echo on node B. CPU: both nodes together.\n")
        w("| | " + " | ".join(SERVERS[n]["label"] for n in names) + " | Ferry/derper |")
        w("|---|" + "---|" * (len(names) + 1))
        # Round trips first, then throughput by offered rate, unpaced last.
        order = sorted(points_of(ctx.records, "mesh"),
                       key=lambda p: (not p.startswith("rtt"), offered_of(p) if p.rstrip("M").isdigit() else float("inf")))
        for point in order:
            cells = {n: me[n].get(point) for n in names}
            f, d = me.get("ferry", {}).get(point), me.get("derper", {}).get(point)
            if any(v and "p50" in v for v in cells.values()):
                load = "" if point == "rtt" else f", {point[4:]} background"
                w(f"| RTT p50 / p99 / p99.9{load}, µs | " + " | ".join(
                    f"{v['p50']['median']:.0f} / {v['p99']['median']:.0f} / {v['p999']['median']:.0f}" if v else "–"
                    for v in cells.values()) + f" | {ratio(f and f['p99'], d and d['p99'])} (p99) |")
                continue
            offered = "unpaced" if point == "max" else f"{point} offered"
            w(f"| Delivered, {offered}, Mbit/s | " + " | ".join(fmt(v and v["delivered_mbps"]) for v in cells.values()) +
              f" | {ratio(f and f['delivered_mbps'], d and d['delivered_mbps'])} |")
            w(f"| Loss, {offered}, % | " + " | ".join(fmt(v and v["loss"], 3, 100.0) for v in cells.values()) + " | |")
            w(f"| Both nodes' CPU, {offered}, cores | " + " | ".join(fmt(v and v["server_cpu"], 2) for v in cells.values()) +
              " | |")
        w("")

    for transport, idle in s["idle"].items():
        w(f"## Idle connections — {transport}\n")
        w("| Server | Held | Connects/s | Server KiB per connection |")
        w("|---|---|---|---|")
        for n, v in idle.items():
            w(f"| {SERVERS[n]['label']} | {fmt(v['established'])} of {v['conns']} | {fmt(v['connect_rate'])} | {fmt(v['bytes_per_conn'], 1, 1 / 1024)} |")
        w("")
    if s["churn"]:
        w("## Churn — connect, handshake, close, 64 in flight\n")
        w("| Transport | Server | Handshakes/s | p99 handshake ms | Failed |")
        w("|---|---|---|---|---|")
        for transport, ch in s["churn"].items():
            for n, v in ch.items():
                w(f"| {transport} | {SERVERS[n]['label']} | {fmt(v['handshakes_per_s'])} | {fmt(v['p99_ms'], 1)} | {fmt(v['failed'])} |")
        w("")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# Plots


STYLE = {"ferry": ("tab:blue", "o"), "ferry-base": ("tab:cyan", "v"), "derper": ("tab:red", "s"),
         "derper-q": ("tab:orange", "^"), "ceiling": ("tab:gray", "D"), "hyperderp": ("tab:green", "P")}
# Drawing order and a small horizontal nudge, so coinciding lines stay visible.
LAYER = {"ferry": (4, 0.0), "ferry-base": (4, 0.006), "derper": (3, -0.012), "derper-q": (3, 0.012), "ceiling": (2, 0.0),
         "hyperderp": (3, 0.0)}


def line_style(n):
    return {"linestyle": "--", "alpha": 0.75} if n == "ceiling" else {}


def plots(ctx, s):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is missing: no plots (apt-get install python3-matplotlib)")
        return []
    made = []

    def err(stats):
        med = [v["median"] for v in stats]
        return med, [[m - v["min"] for m, v in zip(med, stats)], [v["max"] - m for m, v in zip(med, stats)]]

    def save(fig, name):
        path = ctx.out / name
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        made.append(path)

    rate_pts = [p for p in points_of(ctx.records, "rate")]
    paced = [p for p in rate_pts if p != "max"]
    for key, ylabel, fname, scale in (("delivered_mbps", "delivered (Gbit/s)", "throughput_vs_rate.png", 1e-3),
                                      ("loss", "loss (%)", "loss_vs_rate.png", 100.0)):
        transports = [t for t in ("plain", "tls") if s["rate"].get(t)]
        if not transports:
            continue
        fig, axes = plt.subplots(1, len(transports), figsize=(6 * len(transports), 4.2), squeeze=False)
        for ax, t in zip(axes[0], transports):
            for n, pts in s["rate"][t].items():
                xs = [offered_of(p) / 1e3 for p in paced if p in pts]
                if not xs:
                    continue
                stats = [pts[p][key] for p in paced if p in pts]
                med, e = err(stats)
                color, marker = STYLE[n]
                z, nudge = LAYER[n]
                xs = [x * (1 + nudge) for x in xs]
                ax.errorbar(xs, [m * scale for m in med], yerr=[[x * scale for x in e[0]], [x * scale for x in e[1]]],
                            label=SERVERS[n]["label"], color=color, marker=marker, capsize=3, zorder=z, **line_style(n))
                if "max" in pts:
                    ax.scatter([max(xs) * 1.15], [pts["max"][key]["median"] * scale], color=color, marker=marker,
                               facecolors="none", s=70)
            if key == "delivered_mbps" and paced:
                lim = max(offered_of(p) for p in paced) / 1e3
                ax.plot([0, lim], [0, lim], ls=":", color="black", lw=0.8, label="offered")
            else:
                ax.set_yscale("symlog", linthresh=0.1)
            ax.set_xlabel("offered load (Gbit/s); hollow marker at right: unpaced")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{t.upper() if t == 'tls' else 'plain'} DERP, {PEERS} peers / {PEERS // 2} pairs, {SIZE} B")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        save(fig, fname)

    lat = s["latency"]
    if lat:
        pts = points_of(ctx.records, "latency")
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
        for ax, pct in zip(axes, ("p50", "p99", "p999")):
            for n, q in lat.items():
                xs = [float(p.rstrip("%")) for p in pts if p in q]
                stats = [q[p][pct] for p in pts if p in q]
                med, e = err(stats)
                color, marker = STYLE[n]
                z, nudge = LAYER[n]
                ax.errorbar([x + 100 * nudge for x in xs], [m / 1e3 for m in med],
                            yerr=[[x / 1e3 for x in e[0]], [x / 1e3 for x in e[1]]],
                            label=SERVERS[n]["label"], color=color, marker=marker, capsize=3, zorder=z, **line_style(n))
            ax.set_yscale("log")
            ax.set_xlabel("background load (% of derper's saturation)")
            ax.set_ylabel(f"RTT {pct} (ms)")
            ax.set_title(f"round trip {pct}")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=8)
        save(fig, "latency_vs_load.png")

    pe = s["peers"]
    if pe:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for n, q in pe.items():
            xs = sorted(int(p) for p in q)
            med, e = err([q[str(x)]["delivered_mbps"] for x in xs])
            color, marker = STYLE[n]
            z, nudge = LAYER[n]
            ax.errorbar([x * (1 + 3 * nudge) for x in xs], [m / 1e3 for m in med],
                        yerr=[[x / 1e3 for x in e[0]], [x / 1e3 for x in e[1]]],
                        label=SERVERS[n]["label"], color=color, marker=marker, capsize=3, zorder=z, **line_style(n))
        ax.set_xscale("log")
        ax.set_xlabel("peers (half send, half receive)")
        ax.set_ylabel("delivered (Gbit/s)")
        ax.set_title(f"unpaced throughput vs peer count, plain, {SIZE} B")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        save(fig, "throughput_vs_peers.png")
    return made


# ---------------------------------------------------------------------------
# Sanity (quick mode: the tool works and the numbers make sense)


def insane(report):
    """Why a report's numbers do not make sense, or None."""
    res = report["result"]
    m = res["mode"]
    if m == "throughput":
        lat = res["latency_us"]
        if not (res["packets_delivered"] > 0 and 0.0 <= res["loss"] <= 1.0 and lat["count"] > 0):
            return f"nothing delivered or loss out of range ({res['loss']})"
        if not lat["min"] <= lat["p50"] <= lat["p99"] <= lat["max"]:
            return "percentiles out of order"
        gap = res.get("gap_us")
        if gap is not None and not (gap["count"] > 0 and gap["min"] <= gap["p99"] <= gap["max"] <= res["window_s"] * 1e6):
            return f"gaps not measured or out of range ({gap})"
        stuck, asked = res.get("stuck"), (report.get("config") or {}).get("stuck") or 0
        if asked and not stuck:
            return f"{asked} stuck receivers asked for, none reported"
        if stuck and not (stuck["peers"] == asked and stuck["cut_off"] + stuck["held"] == asked):
            return f"stuck receivers miscounted ({stuck})"
    elif m == "latency":
        q = res["rtt_us"]
        if not (res["pongs_received"] > 0 and q["min"] <= q["p50"] <= q["p99"] <= q["p999"] <= q["max"]):
            return "no pongs, or percentiles out of order"
    elif m == "idle":
        if res["established"] < res["requested"] * 0.9:
            return f"only {res['established']} of {res['requested']} connections held"
    elif m == "churn":
        if res["completed"] <= 0:
            return "no handshake completed"
    return None


def sanity(ctx):
    problems = []
    for r in ctx.records:
        name = f"{r['suite']}/{r['server']}-{r['transport']}-{r['point']}"
        if r["error"] or not r["report"]:
            problems.append(f"{name}: {r['error']}")
        elif insane(r["report"]):
            problems.append(f"{name}: {insane(r['report'])}")
    return problems


# ---------------------------------------------------------------------------


def machine_info(ctx):
    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout.strip()
        except OSError:
            return "?"

    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    digests = {}
    for k, path in (ctx.bins or {}).items():
        try:
            digests[k] = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
        except OSError:
            pass
    rev = sh(["git", "rev-parse", "--short", "HEAD"]) or "uncommitted"
    dirty = " (with uncommitted changes)" if sh(["git", "status", "--porcelain"]) else ""
    backend = "?"
    for r in ctx.records:
        for k in (r["report"] or {}).get("metrics_delta", {}):
            if k.startswith("ferry_io_backend") and r["server"] == "ferry":
                backend = k.split('backend="', 1)[1].split('"', 1)[0] if 'backend="' in k else backend
    return {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "mem_gib": mem,
        "kernel": platform.release(),
        "ferry_rev": (rev or "?") + dirty,
        "ferry_backend": backend,
        "go": sh(["go", "version"]).replace("go version ", ""),
        "rustc": sh(["rustc", "--version"]),
        "server_cpus": ctx.args.server_cpus,
        "client_cpus": ctx.args.client_cpus,
        "nice": ctx.nice,
        "workers": ctx.args.workers,
        "ferry_args": ctx.args.ferry_args,
        "baseline_args": ctx.args.baseline_args,
        "derper": DERPER_VERSION,
        "tuned_queue": TUNED_QUEUE,
        "binary_sha256": digests,
    } | ({"hyperderp": sh([str(ctx.bins["hyperderp"]), "--version"])} if "hyperderp" in (ctx.bins or {}) else {})


def extra_flags(machine):
    """The flags given to the ferries beside the bench's own, for the heading."""
    out = ""
    if machine.get("ferry_args"):
        out += f", ferry with `{machine['ferry_args']}`"
    if machine.get("baseline_args"):
        out += f", baseline with `{machine['baseline_args']}`"
    return out


def write_outputs(ctx, machine):
    out = ctx.out
    s = summarize(ctx)
    (out / "summary.json").write_text(json.dumps({"machine": machine, "plan": ctx.plan, "summary": s,
                                                  "latency_base_mbps": getattr(ctx, "latency_base", None),
                                                  "runs": [{k: v for k, v in r.items() if k != "report"} for r in ctx.records]},
                                                 indent=1, default=str) + "\n")
    (out / "results.md").write_text(markdown(ctx, s, machine) + "\n")
    servers = [n for n in SERVERS if any(r["server"] == n for r in ctx.records)]
    (out / "headline.md").write_text(headline_table(s, servers) + "\n")
    made = plots(ctx, s)
    log(f"wrote {out / 'results.md'}, {out / 'summary.json'}, {len(made)} plots, {len(ctx.records)} raw reports")


def load_records(out):
    """The runs recorded in an output directory: its raw reports, plus the
    failures its summary lists."""
    records = []
    for path in sorted((out / "raw").rglob("*.json")) if (out / "raw").exists() else []:
        report = json.loads(path.read_text())
        b = report.get("bench", {})
        records.append({**{k: b.get(k) for k in ("suite", "server", "transport", "point", "repeat", "attempts")},
                        "error": None, "raw": str(path.relative_to(out)), "report": report})
    summary = out / "summary.json"
    if summary.exists():
        present = {r["raw"] for r in records}
        for r in json.loads(summary.read_text()).get("runs", []):
            if r.get("error") and r.get("raw") not in present and (out / "raw" / r["suite"]).exists():
                records.append({**r, "report": None})
    return records


def rerender(args, plan):
    """Rebuilds the outputs of an earlier run from its raw reports."""
    out = args.out
    old = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    plan = old.get("plan", plan)
    ctx = Context(args, {}, out, None, None, plan)
    ctx.nice = old.get("machine", {}).get("nice", ctx.nice)
    ctx.records.extend(load_records(out))
    ctx.latency_base = old.get("latency_base_mbps") or peak_delivered(ctx, "derper", "plain")
    machine = old.get("machine") or machine_info(ctx)
    write_outputs(ctx, machine)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=sorted(PLANS), help="quick (smoke test) or full (measurement)")
    ap.add_argument("--out", type=Path, help="output directory (full: bench/results/<date>; quick: a temporary directory)")
    ap.add_argument("--suites", default=",".join(SUITES), help="comma-separated subset of " + ",".join(SUITES))
    ap.add_argument("--profile", choices=["release", "dev"], default="release", help="cargo profile to build and measure")
    ap.add_argument("--server-cpus", default="0", help="taskset CPU list for the servers")
    ap.add_argument("--client-cpus", default="1", help="taskset CPU list for ferry-bench")
    ap.add_argument("--workers", type=int, default=1, help="ferry --workers")
    ap.add_argument("--repeats", type=int, help="override the plan's repeat count")
    ap.add_argument("--no-nice", action="store_true", help="do not raise the priority of servers and generator")
    ap.add_argument("--no-build", action="store_true", help="use the binaries already built")
    ap.add_argument("--baseline", type=Path, metavar="FERRY_BIN",
                    help="also measure this ferry binary (an earlier build) as 'ferry-base', beside Ferry in every "
                         "suite Ferry runs in: the before/after comparison a data-path change carries")
    ap.add_argument("--transports", default="plain,tls",
                    help="rate and churn suites: which transports to run (plain, tls or both)")
    ap.add_argument("--keep", action="store_true",
                    help="keep --out's raw reports of suites not being run (run suites one at a time into one directory)")
    ap.add_argument("--peak-only", action="store_true",
                    help="rate suite: only the unpaced (peak) point of each transport, for a quick before/after")
    ap.add_argument("--ferry-args", default="", metavar="FLAGS",
                    help="extra flags for the ferry under test, shell-quoted (\"--busy-poll 50us\")")
    ap.add_argument("--baseline-args", default="", metavar="FLAGS",
                    help="extra flags for --baseline's ferry (the same binary with other flags is an A/B of a flag)")
    ap.add_argument("--latency-base", type=float, metavar="MBPS",
                    help="latency suite: load levels as shares of this rate instead of derper's measured saturation "
                         "(for runs whose rate suite has no paced points, e.g. --peak-only)")
    ap.add_argument("--hyperderp", type=Path, metavar="HYPER_DERP_BIN",
                    help="also measure this Hyper-DERP server binary (bench/hyperderp/build.sh builds it) as "
                         "'hyperderp' in the rate and latency suites, plain DERP only")
    ap.add_argument("--latency-levels", metavar="SHARES",
                    help="latency suite: comma-separated background loads as shares of the base (0 = pings alone) "
                         "instead of the plan's, e.g. 0,0.01,0.1 for idle and low rates")
    ap.add_argument("--rerender", action="store_true",
                    help="rebuild results.md, summary.json and the plots from --out's raw reports, running nothing")
    args = ap.parse_args()

    plan = json.loads(json.dumps(PLANS[args.mode]))
    if args.baseline:
        SERVERS["ferry-base"] = {"label": "Ferry (baseline)"}
        for spec in plan.values():
            if isinstance(spec, dict) and "ferry" in spec.get("servers", []):
                i = spec["servers"].index("ferry")
                spec["servers"].insert(i + 1, "ferry-base")
    if args.hyperderp:
        for x in HYPERDERP_SUITES:
            servers = plan[x]["servers"]
            servers.insert(servers.index("derper") + 1, "hyperderp")
    if args.repeats:
        plan["repeats"] = args.repeats
    if args.peak_only:
        for transport in ("plain", "tls"):
            plan["rate"][transport] = [None]
    if args.latency_base:
        plan["latency"]["fixed_base_mbps"] = args.latency_base
    if args.latency_levels:
        plan["latency"]["levels"] = [float(x) for x in args.latency_levels.split(",")]
    suites = [x for x in args.suites.split(",") if x]
    for x in suites:
        if x not in SUITES:
            ap.error(f"unknown suite {x!r}")
    for tool in ("cargo", "go", "openssl"):
        if not shutil.which(tool):
            sys.exit(f"bench: {tool} is required")
    if args.profile == "dev" and args.mode == "full":
        log("warning: measuring debug builds; numbers are not representative")

    if args.rerender:
        if not args.out:
            ap.error("--rerender needs --out DIR")
        rerender(args, plan)
        return

    started = time.time()
    if args.no_build:
        target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / ("release" if args.profile == "release" else "debug")
        bins = {"ferry": target / "ferry", "ferry-bench": target / "ferry-bench", "derper": BENCH / "bin" / "derper"}
    else:
        bins = build(args)
    if args.baseline:
        bins["ferry-base"] = args.baseline
    if args.hyperderp:
        bins["hyperderp"] = args.hyperderp
    for k, v in bins.items():
        if not Path(v).exists():
            sys.exit(f"bench: {k} not found at {v}")

    out = args.out or (BENCH / "results" / datetime.date.today().isoformat() if args.mode == "full"
                       else Path(tempfile.mkdtemp(prefix="ferry-bench-quick-")))
    out.mkdir(parents=True, exist_ok=True)
    earlier = []
    if args.keep:
        transports = [t for t in args.transports.split(",") if t]
        for x in suites:
            for f in (out / "raw" / x).glob("*.json") if (out / "raw" / x).exists() else []:
                if x in ("idle", "latency", "peers", "stuck", "mesh") or any(f"-{t}-" in f.name for t in transports):
                    f.unlink()
        earlier = load_records(out)
    elif (out / "raw").exists():
        shutil.rmtree(out / "raw")
    log(f"results go to {out}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="ferry-bench-") as tmpname:
        tmp = Path(tmpname)
        # Measure copies: the shared target directory may be rebuilt while
        # the suite runs, and every run of one suite must use the same build.
        (tmp / "bin").mkdir()
        for k in list(bins):
            shutil.copy2(bins[k], tmp / "bin" / k)
            bins[k] = tmp / "bin" / k
        ctx = Context(args, bins, out, tmp, make_cert(tmp), plan)
        ctx.records.extend(earlier)
        if earlier and (out / "summary.json").exists():
            prev = json.loads((out / "summary.json").read_text()).get("latency_base_mbps")
            ctx.latency_base = prev or peak_delivered(ctx, "derper", "plain")
        t_build = time.time() - started
        for x in suites:
            t0 = time.time()
            log(f"== suite {x}")
            SUITES[x](ctx)
            log(f"== suite {x} done in {time.time() - t0:.0f} s")
        machine = machine_info(ctx)
        machine["build_s"] = round(t_build)
        machine["run_s"] = round(time.time() - started - t_build)
        write_outputs(ctx, machine)
        problems = sanity(ctx)
        if problems:
            for p in problems:
                log(f"NOT SANE: {p}")
            if args.mode == "quick":
                sys.exit(1)
        log(f"total {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()

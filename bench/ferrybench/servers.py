"""The servers under test as processes: one server, pinned and niced like
every other, and a two-node region of one server (the mesh suite)."""

import contextlib
import http.client
import json
import os
import shlex
import signal
import ssl
import subprocess
import time

from .common import SERVERS, TUNED_QUEUE, free_port, log, wait_port

class Server:
    """One server process, pinned and niced like every other. A node of a
    region (the mesh suite) has its CA-signed certificate in `certdir`, the
    CA in `ca` and `mesh` = (mesh key file, --mesh-with list)."""

    def __init__(self, ctx, name, tls, certdir=None, rate=None, workers=None, cpus=None):
        """`rate`: (bytes per second, burst bytes) for --rate-config;
        `workers` and `cpus` override --workers and --server-cpus."""
        self.ctx, self.name, self.tls, self.rate = ctx, name, tls, rate
        self.workers = workers or ctx.args.workers
        self.cpus = cpus or ctx.args.server_cpus
        self.port = free_port()
        self.proc = None
        self.certdir = certdir or ctx.certdir
        self.ca = self.certdir / ("ca.pem" if certdir else "localhost.crt")
        self.mesh = None

    def command(self):
        c = self.ctx
        addr = f"127.0.0.1:{self.port}"
        state = c.tmp / f"{self.name}-{self.port}"
        state.mkdir(exist_ok=True)  # a restart keeps its key
        env = dict(os.environ)
        if self.name in ("ferry", "ferry-base"):
            cmd = [str(c.bins[self.name]), "-a", addr, "--stun=false", "-c", str(state / "ferry.key"),
                   "--workers", str(self.workers), "--log", "warn"]
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
            cmd = [str(c.bins["hyperderp"]), "--port", str(self.port), "--workers", str(self.workers),
                   "--log-level", "warn"]
        else:
            raise ValueError(self.name)
        if self.rate:
            assert self.name in ("ferry", "ferry-base", "derper", "derper-q"), "a server that takes --rate-config"
            f = state / "rate.json"
            f.write_text(json.dumps({"PerClientRateLimitBytesPerSec": self.rate[0],
                                     "PerClientRateBurstBytes": self.rate[1]}))
            cmd += ["--rate-config", str(f)]
        if self.mesh:
            psk, peers = self.mesh
            # The same flags for both servers (derper takes either dash).
            cmd += ["--mesh-psk-file", str(psk), "--mesh-with", peers]
            env["SSL_CERT_FILE"] = str(self.ca)
        return c.pin(self.cpus) + cmd, env

    def __enter__(self):
        cmd, env = self.command()
        logf = open(self.ctx.tmp / f"{self.name}-{self.port}.log", "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT)
        wait_port(self.port, self.proc)
        time.sleep(0.2)
        return self

    def restart(self):
        """A fresh process on the same port and settings: what a measurement
        of the server's own memory needs before each attempt."""
        self.__exit__(None, None, None)
        return self.__enter__()

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

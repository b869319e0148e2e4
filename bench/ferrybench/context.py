"""One run of the suite: its binaries, plan and output directory, and
ferry-bench run once per point (retried when disturbed or not sane), each
run recorded."""

import json
import os
import shutil
import subprocess
import time

from .certs import make_region_certs
from .common import log
from .sanity import insane

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

    def bench(self, server, suite, point, repeat, mode, extra, client_cpus=None):
        """Runs ferry-bench once (retrying disturbed runs) and records it;
        pinned to `client_cpus` (default --client-cpus)."""
        name = f"{suite}/{server.name}-{'tls' if server.tls else 'plain'}-{point}-r{repeat}"
        raw = self.out / "raw" / f"{name}.json"
        raw.parent.mkdir(parents=True, exist_ok=True)
        attempts = 0
        report, error = None, None
        tried = []  # (report, disturbed, insane) of every attempt that ran
        for attempts in range(1, self.plan["retries"] + 2):
            if attempts > 1 and mode in FRESH_SERVER_MODES:
                # A retry on the same process would start from the memory
                # the last attempt left behind (freed, not returned).
                server.restart()
            cmd = self.pin(client_cpus or self.args.client_cpus) + [str(self.bins["ferry-bench"]), mode, "-q", "-o",
                                                                   str(raw)]
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

    def derpload(self, server, suite, point, repeat, extra):
        """Runs the independent generator (derpload: Tailscale's DERP client
        over Go's crypto/tls) once against `server` and records it; a failed
        run is retried once."""
        name = f"{suite}/{server.name}-{'tls' if server.tls else 'plain'}-{point}-r{repeat}"
        raw = self.out / "raw" / f"{name}.json"
        raw.parent.mkdir(parents=True, exist_ok=True)
        dial = f"127.0.0.1:{server.port}"
        cmd = self.pin(self.args.client_cpus) + [str(self.bins["derpload"]), "-dial", dial,
                                                 "-server-pid", str(server.proc.pid)]
        cmd += ["-url", f"https://localhost:{server.port}/derp", "-ca", str(server.ca)] if server.tls else \
            ["-url", f"http://{dial}/derp"]
        report, error, attempts = None, None, 0
        for attempts in (1, 2):
            p = subprocess.run(cmd + extra, capture_output=True, text=True)
            if p.returncode == 0:
                result = json.loads(p.stdout)
                result["mode"] = "clients"
                report = {"result": result, "server": {"cpu_util": result.get("server_cores")}}
                why = insane(report)
                if why:
                    # Not recorded: a missing CPU figure is never read as 0.
                    report, error = None, f"not sane: {why}"
                    log(f"{name}: {error}")
                    continue
                error = None
                log(f"{name}: {result['delivered_mbps']:.0f} Mbit/s, server {result['server_cores']:.2f} cores, "
                    f"{result['server_core_s_per_gbit']:.3f} core-s/Gbit{', ' + result['cipher'] if result.get('cipher') else ''}")
                break
            error = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
            log(f"{name}: FAILED: {error}")
        rec = {"suite": suite, "server": server.name, "transport": "tls" if server.tls else "plain", "point": point,
               "repeat": repeat, "attempts": attempts, "error": error,
               "raw": str(raw.relative_to(self.out)) if report else None, "report": report}
        if report:
            report["bench"] = {k: rec[k] for k in ("suite", "server", "transport", "point", "repeat", "attempts")}
            raw.write_text(json.dumps(report, indent=1) + "\n")
        self.records.append(rec)
        return report


# Modes whose figure is the server's memory growth over the run.
FRESH_SERVER_MODES = ("idle",)


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

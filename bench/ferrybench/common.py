"""What every part of the suite shares: where things are, the servers it
knows, the traffic shape, logging and waiting for a port."""

import socket
import subprocess
import sys
import time
from pathlib import Path

# The repository: this package is bench/ferrybench/.
ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
DERPER_VERSION = "v1.104.7"
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

"""The two modes (quick, full): which suites run which servers at which
points, and a command line's changes to them."""

import json

from .common import HYPERDERP_SUITES, SERVERS

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

# A client held by --rate-config (the limited suite): one pair whose sender
# offers `offered` Mbit/s against a limit of `rate` bytes/s (burst `burst`),
# both servers given the same rate file. The sender's backlog fills its own
# socket buffer first, so the window starts once that is full.
LIMITED_PLAN = {"servers": ["ferry", "derper"], "rate": 2_000_000, "burst": 131072, "offered": 40}

# Ferry with one worker and with two (the scaling suite, run only when
# named): 16 peers in 8 one-way flows offering `rate` Mbit/s in all, which
# neither the server nor the generator saturates while they share `cpus`;
# the share of flows across shards swept over `shares` percent with two
# workers (one worker has share 0 only).
SCALING_PLAN = {"cpus": "0,1", "peers": 16, "rate": 2000, "shares": [0, 25, 50, 75, 100]}

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
        "clients": {"servers": ["ferry", "derper"]},
        # A higher limit: the sender's backlog (its socket buffer) drains in
        # well under a second after the window.
        "limited": LIMITED_PLAN | {"rate": 8_000_000, "offered": 160, "warmup": "500ms", "window": "1s"},
        "scaling": SCALING_PLAN | {"rate": 500, "shares": [0, 50, 100]},
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
        "clients": {"servers": ["ferry", "derper"]},
        "limited": LIMITED_PLAN | {"warmup": "3s", "window": "4s"},
        # Five interleaved repeats, as every per-packet cost needs.
        "scaling": SCALING_PLAN | {"repeats": 5},
    },
}


def plan_for(args):
    """The plan of args.mode with the command line's changes: --baseline's
    ferry beside Ferry (and among the known servers), --hyperderp after
    derper, repeats, peak-only rates, the latency base and levels."""
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
    return plan

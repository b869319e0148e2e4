"""The records of a run reduced to medians and spreads per suite, server,
transport and point (summary.json), and the headline rows with their bars."""

import statistics

from . import scaling
from .common import SERVERS

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


def points_of(records, suite):
    seen = []
    for r in records:
        if r["suite"] == suite and r["point"] not in seen:
            seen.append(r["point"])
    return seen


def summarize(ctx):
    rec = ctx.records
    s = {"rate": {}, "latency": {}, "peers": {}, "idle": {}, "churn": {}, "stuck": {}, "mesh": {}, "clients": {},
         "limited": {}}
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
            d = stat(values(rec, "clients", name, transport, "max", tp))
            if d:
                s["clients"].setdefault(transport, {})[name] = {
                    "delivered_mbps": d,
                    "server_cores": stat(values(rec, "clients", name, transport, "max", lambda r: r["result"]["server_cores"])),
                    "core_s_per_gbit": stat(values(rec, "clients", name, transport, "max",
                                                   lambda r: r["result"]["server_core_s_per_gbit"])),
                }
            h = stat(values(rec, "churn", name, transport, "max", lambda r: r["result"]["handshakes_per_s"]))
            if h:
                s["churn"].setdefault(transport, {})[name] = {
                    "handshakes_per_s": h,
                    "p99_ms": stat(values(rec, "churn", name, transport, "max", lambda r: r["result"]["handshake_ms"]["p99"])),
                    "failed": stat(values(rec, "churn", name, transport, "max", lambda r: r["result"]["failed"])),
                }
    for name in SERVERS:
        for point in points_of(rec, "limited"):
            lat = lambda r, pct: r["result"]["latency_us"][pct]  # noqa: E731
            p50 = stat(values(rec, "limited", name, "plain", point, lambda r: lat(r, "p50")))
            if p50:
                rq = lambda r, k: (r.get("server_recv_queue") or {}).get(k)  # noqa: E731
                s["limited"].setdefault(name, {})[point] = {
                    "latency_p50_us": p50,
                    "latency_p90_us": stat(values(rec, "limited", name, "plain", point, lambda r: lat(r, "p90"))),
                    "latency_p99_us": stat(values(rec, "limited", name, "plain", point, lambda r: lat(r, "p99"))),
                    "delivered_mbps": stat(values(rec, "limited", name, "plain", point, tp)),
                    "recv_queue_mean": stat(values(rec, "limited", name, "plain", point, lambda r: rq(r, "mean_bytes"))),
                    "recv_queue_max": stat(values(rec, "limited", name, "plain", point, lambda r: rq(r, "max_bytes"))),
                }
    s["scaling"] = scaling.summarize(rec)
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
    """The headline bar (what Ferry must meet against derper), row by row."""
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

"""Whether a report's numbers make sense (quick mode: the tool works), per
run and over a whole run."""

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
        lost = (report.get("machine") or {}).get("lost", 0.0)
        if res.get("cross_shard") and lost >= 0.5:
            # A per-packet cost needs the server's CPU over the window; a
            # machine that stood still for most of it (the VM paused) has
            # none to give.
            return f"the machine stood still for {lost * 100:.0f} % of the window"
        stuck, asked = res.get("stuck"), (report.get("config") or {}).get("stuck") or 0
        if asked and not stuck:
            return f"{asked} stuck receivers asked for, none reported"
        if stuck and not (stuck["peers"] == asked and stuck["cut_off"] + stuck["held"] == asked):
            return f"stuck receivers miscounted ({stuck})"
    elif m == "clients":
        if not (res["delivered_mbps"] > 0 and res["packets"] > 0):
            return "nothing delivered"
        if res.get("server_cores") is None or res.get("server_core_s_per_gbit") is None:
            return "the server's CPU not measured"
        if res["send_errors"]:
            return f"{res['send_errors']} senders failed"
    elif m == "latency":
        q = res["rtt_us"]
        if not (res["pongs_received"] > 0 and q["min"] <= q["p50"] <= q["p99"] <= q["p999"] <= q["max"]):
            return "no pongs, or percentiles out of order"
    elif m == "idle":
        if res["established"] < res["requested"] * 0.9:
            return f"only {res['established']} of {res['requested']} connections held"
        per_conn = res.get("server_bytes_per_conn")
        if per_conn is not None and per_conn < 64:
            # Every server keeps at least a socket and a key per connection:
            # less means the "before" sample already held the memory.
            return f"server memory grew {per_conn:.1f} bytes per held connection"
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

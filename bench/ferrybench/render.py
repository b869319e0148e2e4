"""results.md and headline.md from a summary."""

from . import scaling
from .common import DERPER_VERSION, PEERS, SERVERS, SIZE, TUNED_QUEUE
from .plans import LIMITED_PLAN, STUCK_PLAN
from .summary import offered_of, points_of

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
    cl = s.get("clients") or {}
    if cl:
        w(f"## Tailscale's own client as the load — {PEERS} peers / {PEERS // 2} pairs, {SIZE} B, unpaced\n")
        w(f"derpload: tailscale.com {DERPER_VERSION}'s derphttp client over Go's crypto/tls, one flush (one TLS "
          "record) per packet, as tailscaled sends. On these cores the generator, not the server, is the limit: "
          "the server's CPU per gigabit is the figure to compare.\n")
        w("| Transport | Server | Delivered Mbit/s | Server cores | Server core-s per Gbit |")
        w("|---|---|---|---|---|")
        for transport, by in cl.items():
            for n, v in by.items():
                w(f"| {transport} | {SERVERS[n]['label']} | {fmt(v['delivered_mbps'])} | {fmt(v['server_cores'], 2)} | "
                  f"{fmt(v['core_s_per_gbit'], 3)} |")
        w("")
    out += limited_section(ctx, s.get("limited") or {})
    out += scaling.section(s.get("scaling") or {})
    return "\n".join(out)


def limited_section(ctx, lim):
    """The limited suite's lines (none when it did not run)."""
    if not lim:
        return []
    p = ctx.plan.get("limited") or LIMITED_PLAN
    lines = [f"## A client held by --rate-config — 1 pair, {SIZE} B, {p['offered']} Mbit/s offered against "
             f"{p['rate'] / 1e6:g} MB/s (burst {p['burst']} B)\n",
             "One-way latency of the limited sender's packets: the time they wait in buffers on the way, its own "
             "socket's included (the same for both servers). Receive queue: the bytes the kernel holds unread on the "
             "server's side of its connection, sampled every 100 ms over the window (what the server read and did "
             "not handle yet is not in it).\n",
             "| Server | Point | Delivered Mbit/s | Latency p50 ms | p90 ms | p99 ms | "
             "Server receive queue, mean KiB | max KiB |",
             "|---|---|---|---|---|---|---|---|"]
    ms = lambda v, k: fmt(v[k], 0, 1e-3)  # noqa: E731
    lines += [f"| {SERVERS[n]['label']} | {point} | {fmt(v['delivered_mbps'], 1)} | {ms(v, 'latency_p50_us')} | "
              f"{ms(v, 'latency_p90_us')} | {ms(v, 'latency_p99_us')} | {cell(v['recv_queue_mean'], 'KiB')} | "
              f"{cell(v['recv_queue_max'], 'KiB')} |"
              for n, by in lim.items() for point, v in by.items()]
    return lines + [""]


def extra_flags(machine):
    """The flags given to the ferries beside the bench's own, for the heading."""
    out = ""
    if machine.get("ferry_args"):
        out += f", ferry with `{machine['ferry_args']}`"
    if machine.get("baseline_args"):
        out += f", baseline with `{machine['baseline_args']}`"
    return out

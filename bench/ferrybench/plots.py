"""PNG plots of a summary (matplotlib; skipped with a warning without it)."""

from .common import PEERS, SERVERS, SIZE, log
from .summary import offered_of, points_of

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

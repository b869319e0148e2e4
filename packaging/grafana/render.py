#!/usr/bin/env python3
"""Draws the panels of a Grafana dashboard from a Prometheus server, with
matplotlib, for places where Grafana itself is not available: each panel's
own PromQL queries are sent to Prometheus's query_range API (the dashboard's
variables replaced by the values given), and the series are drawn with the
panel's title, legend format and unit.

    render.py --prometheus http://127.0.0.1:9090 --start UNIX --end UNIX \\
        --out dashboard.png [--dashboard ferry.json] [--var derp=.* ...]

Only the standard library and matplotlib (python3-matplotlib on Debian).
"""

import argparse
import json
import math
import re
import urllib.parse
import urllib.request
from pathlib import Path

UNITS = {
    "bps": (1e6, "Mbit/s"),
    "pps": (1e3, "k packets/s"),
    "bytes": (1024, "KiB"),
    "percentunit": (0.01, "%"),
    "short": (1, ""),
}


def query_range(prom, expr, start, end, step):
    qs = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{qs}", timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise SystemExit(f"{expr}: {body}")
    return body["data"]["result"]


def substitute(expr, variables, rate_interval):
    expr = expr.replace("$__rate_interval", rate_interval)
    for name, value in variables.items():
        expr = expr.replace("${" + name + "}", value).replace("$" + name, value)
    if "$" in expr:
        raise SystemExit(f"a variable was not given a value: {expr}")
    return expr


def legend(fmt, labels):
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--dashboard", default=str(Path(__file__).with_name("ferry.json")))
    ap.add_argument("--start", type=float, required=True)
    ap.add_argument("--end", type=float, required=True)
    ap.add_argument("--step", default="1s")
    ap.add_argument("--rate-interval", default="5s", help="value of $__rate_interval")
    ap.add_argument("--var", action="append", default=[], help="NAME=VALUE for a dashboard variable")
    ap.add_argument("--title", default="")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dash = json.loads(Path(args.dashboard).read_text())
    variables = dict(v.split("=", 1) for v in args.var)
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.1 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    empty = []
    for ax, panel in zip(axes.flat, panels):
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        scale, suffix = UNITS.get(unit, (1, unit))
        drawn = 0
        for target in panel["targets"]:
            expr = substitute(target["expr"], variables, args.rate_interval)
            for series in query_range(args.prometheus, expr, args.start, args.end, args.step):
                points = [(float(t) - args.start, float(v)) for t, v in series["values"]]
                if not points:
                    continue
                xs, ys = zip(*points)
                ax.plot(xs, [y / scale for y in ys], linewidth=1,
                        label=legend(target.get("legendFormat", ""), series["metric"]) or expr)
                drawn += 1
        if not drawn:
            empty.append(panel["title"])
        ax.set_title(panel["title"], fontsize=10)
        ax.set_ylabel(suffix, fontsize=8)
        ax.set_xlabel("seconds", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=6, loc="upper left", ncol=2 if drawn > 4 else 1)
    if args.title:
        fig.suptitle(args.title, fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.98 if args.title else 1))
    fig.savefig(args.out, dpi=80)
    print(f"{args.out}: {len(panels)} panels" + (f"; no data for: {', '.join(empty)}" if empty else ""))


if __name__ == "__main__":
    main()

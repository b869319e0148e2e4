"""One layout for the results of every suite under bench/:

    bench/results/<date>-<suite>-<tag>/
      summary.json   suite, date, git commit, machine, pinning, and each
                     series' median and spread (min, max, n) over repeats
      results.md     the tables
      raw/           what each run wrote (ferry-bench reports, the shell
                     suites' JSON, plots)

The DERP suite writes its own tables and summary into this layout
(ferrybench.outputs). The soaks (bench/soak.py) and the shell suites
(bench/udp, bench/tunnel, bench/link, bench/sdk) write their JSON into raw/
and then `finish` (for the shell suites `python3 -m ferrybench.layout
finish DIR`) reads it, groups its rows by what names a series (relay,
case, path; the file for the soaks) and writes summary.json and
results.md:

    dir=$(python3 -m ferrybench.layout new udp my-tag)     # makes DIR/raw
    ... the suite writes DIR/raw/udp.json ...
    python3 -m ferrybench.layout finish "$dir" --pinning "relay on CPU 0"

(with PYTHONPATH=bench). Standard library only.
"""

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from .common import BENCH, ROOT
from .summary import stat

# Where run directories go: bench/results/, or FERRY_BENCH_RESULTS.
RESULTS = Path(os.environ.get("FERRY_BENCH_RESULTS") or BENCH / "results")

# Each suite: what it measures, how its raw JSON becomes rows, and which
# fields of a row name its series. Rows are dicts; every other numeric
# field of a row is a metric of its series.
SUITES = {
    "derp": {"what": "Ferry against derper: rate, latency, peers, idle, churn, stuck, mesh (bench/run.sh)"},
    "soak": {"what": "memory over time under a fixed load, DERP or UDP relay (bench/run.sh soak)",
             "rows": lambda d: [{"relay": d.get("config", {}).get("relay", "derp")} | d["summary"]],
             "keys": ["file", "relay"]},
    "udp": {"what": "UDP relay against socat and nftables (bench/udp/run.sh)",
            "rows": lambda d: d, "keys": ["relay"]},
    "pps": {"what": "UDP packet rate per relay core (bench/udp/pps.sh)",
            "rows": lambda d: d, "keys": ["relay", "case"]},
    "tunnel": {"what": "tunnel quality with real Tailscale nodes (bench/tunnel/run.sh)",
               "rows": lambda d: d, "keys": ["Relay"]},
    "link": {"what": "`ferry link` per path (bench/link/run.sh)",
             "rows": lambda d: d["results"], "keys": ["case", "path"]},
    "sdk": {"what": "SDK endpoints per path (bench/sdk/run.sh)",
            "rows": lambda d: d["runs"], "keys": ["path"]},
}

# Row fields that are bookkeeping, not measurements.
NOT_METRICS = {"repeat", "Repeat"}

NAME = re.compile(r"^(\d{4}-\d{2}-\d{2})-([a-z]+)-([A-Za-z0-9][A-Za-z0-9._-]*)$")
TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def today():
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def run_dir(suite, tag, date=None, root=RESULTS):
    """A new run's directory, `<root>/<date>-<suite>-<tag>/`, with raw/."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r} (known: {', '.join(SUITES)})")
    if not TAG.match(tag):
        raise ValueError(f"tag {tag!r}: letters, digits, '.', '_' and '-' only, not first")
    path = Path(root) / f"{date or today()}-{suite}-{tag}"
    (path / "raw").mkdir(parents=True, exist_ok=True)
    return path


def parse_name(name):
    """(date, suite, tag) of a directory named by the layout, or None."""
    m = NAME.match(name)
    if not m or m.group(2) not in SUITES:
        return None
    return m.group(1), m.group(2), m.group(3)


def git_commit():
    """The commit the tree is at, `-dirty` when tracked files changed; None
    outside a git checkout."""
    def git(*args):
        try:
            p = subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT)
        except OSError:
            return None
        return p.stdout.strip() if p.returncode == 0 else None

    rev = git("rev-parse", "--short", "HEAD")
    if not rev:
        return None
    return rev + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def host():
    """The machine: CPU model and count, memory, kernel."""
    cpu, mem = "?", 0
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
        with open("/proc/meminfo") as f:
            mem = next((int(line.split()[1]) / 1024 / 1024 for line in f if line.startswith("MemTotal")), 0)
    except OSError:
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "mem_gib": mem, "kernel": platform.release()}


def header(suite, date, tag, commit, machine, pinning):
    """The fields every summary.json starts with."""
    return {"suite": suite, "date": date, "tag": tag, "commit": commit, "machine": machine, "pinning": pinning}


def series(rows, keys):
    """Rows grouped by their `keys` fields: per group, the spread of every
    numeric field over the group's rows (the repeats), in first-seen order.
    Rows with an `error` count as failed runs of their series."""
    groups = {}
    for row in rows:
        name = tuple(row.get(k) for k in keys)
        g = groups.setdefault(name, {"series": dict(zip(keys, name)), "runs": 0, "failed": 0, "values": {}})
        g["runs"] += 1
        if row.get("error"):
            g["failed"] += 1
            continue
        for k, v in row.items():
            if k in keys or k in NOT_METRICS or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            g["values"].setdefault(k, []).append(v)
    out = []
    for g in groups.values():
        metrics = {k: stat(v) for k, v in g.pop("values").items()}
        out.append(g | {"metrics": metrics})
    return out


def fmt(x):
    if isinstance(x, int) or x.is_integer():
        return f"{int(x):,}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def markdown(doc, title):
    """results.md of a summary written by `finish`: the run's facts, then
    one table per series (metric, median, min–max, runs)."""
    m = doc.get("machine") or {}
    lines = [f"# {title}", "",
             f"- Suite: `{doc['suite']}` — {SUITES[doc['suite']]['what']}",
             f"- Date: {doc['date']}; tag `{doc['tag']}`; commit {doc['commit'] or 'not recorded'}",
             "- Machine: " + (", ".join(f"{k} {v}" for k, v in m.items()) if m else "not recorded"),
             f"- Pinning: {doc['pinning'] or 'not recorded'}",
             "- Raw: " + ", ".join(f"[{r}](raw/{r})" for r in doc["raw"]),
             "", "Median (min–max) over the runs of each series.", ""]
    for s in doc["series"]:
        name = ", ".join(f"{k} {v}" for k, v in s["series"].items())
        failed = f", {s['failed']} failed" if s["failed"] else ""
        runs = f"{s['runs']} run" + ("s" if s["runs"] != 1 else "")
        lines += [f"## {name}", "", f"{runs}{failed}.", "",
                  "| Metric | Median | Min–max | n |", "|---|---:|---:|---:|"]
        for k, v in s["metrics"].items():
            if v:
                spread = f"{fmt(v['min'])}–{fmt(v['max'])}" if v["n"] > 1 else "—"
                lines.append(f"| {k} | {fmt(v['median'])} | {spread} | {v['n']} |")
        lines.append("")
    return "\n".join(lines)


def finish(path, suite=None, pinning=None, commit=None, machine=None, date=None, tag=None, tables=True):
    """summary.json and results.md (unless `tables` is false) of a run
    directory from the JSON files in its raw/; returns the summary."""
    path = Path(path)
    named = parse_name(path.name) or (None, None, None)
    suite = suite or named[1]
    if suite not in SUITES or "rows" not in SUITES[suite]:
        raise ValueError(f"{path}: give a shell suite ({', '.join(k for k, v in SUITES.items() if 'rows' in v)})")
    raw = sorted(p for p in (path / "raw").glob("*.json"))
    if not raw:
        raise ValueError(f"{path}/raw: no JSON results")
    rows = []
    for p in raw:
        for row in SUITES[suite]["rows"](json.loads(p.read_text())):
            rows.append({"file": p.name} | row if "file" in SUITES[suite]["keys"] else row)
    doc = header(suite, date or named[0] or today(), tag or named[2] or path.name, commit, machine, pinning)
    doc |= {"raw": [p.name for p in raw], "series": series(rows, SUITES[suite]["keys"])}
    (path / "summary.json").write_text(json.dumps(doc, indent=1) + "\n")
    if tables:
        (path / "results.md").write_text(markdown(doc, f"{suite} {doc['date']} {doc['tag']}") + "\n")
    return doc


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m ferrybench.layout", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    new = sub.add_parser("new", help="make bench/results/<date>-<suite>-<tag>/raw and print its path")
    new.add_argument("suite", choices=sorted(SUITES))
    new.add_argument("tag")
    new.add_argument("--root", type=Path, default=RESULTS,
                     help="where the run directories are (bench/results, or FERRY_BENCH_RESULTS)")
    fin = sub.add_parser("finish", help="write DIR/summary.json and DIR/results.md from DIR/raw/*.json")
    fin.add_argument("dir", type=Path)
    fin.add_argument("--suite", help="the suite, when DIR's name does not say")
    fin.add_argument("--pinning", help="which CPUs ran what")
    fin.add_argument("--historical", action="store_true",
                     help="a run from before this layout: no commit or machine recorded")
    fin.add_argument("--keep-results-md", action="store_true", help="leave an existing results.md as it is")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "new":
            print(run_dir(a.suite, a.tag, root=a.root))
        else:
            commit, machine = (None, None) if a.historical else (git_commit(), host())
            tables = not (a.keep_results_md and (a.dir / "results.md").exists())
            finish(a.dir, a.suite, a.pinning, commit, machine, tables=tables)
    except ValueError as e:
        sys.exit(f"layout: {e}")


if __name__ == "__main__":
    main()

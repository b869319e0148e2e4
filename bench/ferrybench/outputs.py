"""What a run leaves in its output directory (summary.json, results.md,
headline.md, plots, raw/), the machine it ran on, and the same outputs
built again from an earlier run's raw reports."""

import hashlib
import json
import subprocess
from pathlib import Path

from .common import DERPER_VERSION, ROOT, SERVERS, TUNED_QUEUE, log
from .context import Context
from .layout import git_commit, header, host, parse_name, today
from .plots import plots
from .render import headline_table, markdown
from .suites import peak_delivered
from .summary import summarize

def machine_info(ctx):
    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout.strip()
        except OSError:
            return "?"

    digests = {}
    for k, path in (ctx.bins or {}).items():
        try:
            digests[k] = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
        except OSError:
            pass
    commit = git_commit()
    backend = "?"
    for r in ctx.records:
        for k in (r["report"] or {}).get("metrics_delta", {}):
            if k.startswith("ferry_io_backend") and r["server"] == "ferry":
                backend = k.split('backend="', 1)[1].split('"', 1)[0] if 'backend="' in k else backend
    return {
        "date": today(),
        **host(),
        "ferry_rev": commit or "?",
        "ferry_backend": backend,
        # The Go that built the derper under test (not the machine's go).
        "go": sh(["go", "version", str((ctx.bins or {}).get("derper", ""))]).rsplit(" ", 1)[-1],
        "rustc": sh(["rustc", "--version"]),
        "server_cpus": ctx.args.server_cpus,
        "client_cpus": ctx.args.client_cpus,
        "nice": ctx.nice,
        "workers": ctx.args.workers,
        "ferry_args": ctx.args.ferry_args,
        "baseline_args": ctx.args.baseline_args,
        "derper": DERPER_VERSION,
        "tuned_queue": TUNED_QUEUE,
        "binary_sha256": digests,
    } | ({"hyperderp": sh([str(ctx.bins["hyperderp"]), "--version"])} if "hyperderp" in (ctx.bins or {}) else {})


def pinning(machine):
    """Which CPUs ran what, from a run's machine record."""
    nice = ", both at nice -20" if machine.get("nice") else ""
    return f"servers on CPU {machine.get('server_cpus')}, ferry-bench on CPU {machine.get('client_cpus')}{nice}"


def write_outputs(ctx, machine):
    """summary.json (the layout's header, then the medians and spreads per
    suite, server, transport and point under "summary"), results.md,
    headline.md and the plots."""
    out = ctx.out
    s = summarize(ctx)
    _, _, tag = parse_name(out.name) or (None, None, out.name)
    commit = machine.get("ferry_rev")
    head = header("derp", machine.get("date"), tag, None if commit in (None, "?") else commit, machine,
                  pinning(machine))
    (out / "summary.json").write_text(json.dumps(head | {"plan": ctx.plan, "summary": s,
                                                  "latency_base_mbps": getattr(ctx, "latency_base", None),
                                                  "runs": [{k: v for k, v in r.items() if k != "report"} for r in ctx.records]},
                                                 indent=1, default=str) + "\n")
    (out / "results.md").write_text(markdown(ctx, s, machine) + "\n")
    servers = [n for n in SERVERS if any(r["server"] == n for r in ctx.records)]
    (out / "headline.md").write_text(headline_table(s, servers) + "\n")
    made = plots(ctx, s)
    log(f"wrote {out / 'results.md'}, {out / 'summary.json'}, {len(made)} plots, {len(ctx.records)} raw reports")


def load_records(out):
    """The runs recorded in an output directory: its raw reports, plus the
    failures its summary lists."""
    records = []
    for path in sorted((out / "raw").rglob("*.json")) if (out / "raw").exists() else []:
        report = json.loads(path.read_text())
        b = report.get("bench", {})
        records.append({**{k: b.get(k) for k in ("suite", "server", "transport", "point", "repeat", "attempts")},
                        "error": None, "raw": str(path.relative_to(out)), "report": report})
    summary = out / "summary.json"
    if summary.exists():
        present = {r["raw"] for r in records}
        for r in json.loads(summary.read_text()).get("runs", []):
            if r.get("error") and r.get("raw") not in present and (out / "raw" / r["suite"]).exists():
                records.append({**r, "report": None})
    return records


def rerender(args, plan):
    """Rebuilds the outputs of an earlier run from its raw reports."""
    out = args.out
    old = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    plan = old.get("plan", plan)
    ctx = Context(args, {}, out, None, None, plan)
    ctx.nice = old.get("machine", {}).get("nice", ctx.nice)
    ctx.records.extend(load_records(out))
    ctx.latency_base = old.get("latency_base_mbps") or peak_delivered(ctx, "derper", "plain")
    machine = old.get("machine") or machine_info(ctx)
    write_outputs(ctx, machine)

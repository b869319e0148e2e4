"""Ferry against derper, side by side: build, run the suites, report.

    bench/run.sh quick            # smoke test (CI): seconds per point, one repeat
    bench/run.sh full             # the real measurement (~29 min on 2 cores)

Every server under test runs pinned to the same cores (--server-cpus,
default 0) with the same settings; ferry-bench runs on the others
(--client-cpus, default 1). Results go to bench/results/<date>-derp-<tag>/
(full; the tag is --tag, default "full") or the same name in a temporary
directory (quick): one raw JSON per run under raw/, summary.json, results.md
(medians, min-max spread, ratios) and PNG plots. bench/README.md explains the
method and how to read the output.

Only the Python standard library is needed to run; plots need matplotlib
(python3-matplotlib on Debian) and are skipped with a warning without it.
"""

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from .build import binaries
from .certs import make_cert
from .common import log
from .context import Context
from .layout import RESULTS, run_dir
from .outputs import load_records, machine_info, rerender, write_outputs
from .plans import PLANS, plan_for
from .sanity import sanity
from .suites import OPT_IN, SUITES, peak_delivered


def parse_args():
    ap = argparse.ArgumentParser(prog="bench/run.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=sorted(PLANS), help="quick (smoke test) or full (measurement)")
    ap.add_argument("--out", type=Path,
                    help="output directory (full: bench/results/<date>-derp-<tag>; quick: that name in a temporary directory)")
    ap.add_argument("--tag", help="the last part of the output directory's name (default: the mode, quick or full)")
    ap.add_argument("--suites", default=",".join(x for x in SUITES if x not in OPT_IN),
                    help="comma-separated subset of " + ",".join(SUITES) + " (default: all but "
                         + ",".join(OPT_IN) + ", which run only when named)")
    ap.add_argument("--profile", choices=["release", "dev"], default="release", help="cargo profile to build and measure")
    ap.add_argument("--server-cpus", default="0", help="taskset CPU list for the servers")
    ap.add_argument("--client-cpus", default="1", help="taskset CPU list for ferry-bench")
    ap.add_argument("--workers", type=int, default=1, help="ferry --workers")
    ap.add_argument("--repeats", type=int, help="override the plan's repeat count")
    ap.add_argument("--no-nice", action="store_true", help="do not raise the priority of servers and generator")
    ap.add_argument("--no-build", action="store_true", help="use the binaries already built")
    ap.add_argument("--baseline", type=Path, metavar="FERRY_BIN",
                    help="also measure this ferry binary (an earlier build) as 'ferry-base', beside Ferry in every "
                         "suite Ferry runs in: the before/after comparison a data-path change carries")
    ap.add_argument("--transports", default="plain,tls",
                    help="rate and churn suites: which transports to run (plain, tls or both)")
    ap.add_argument("--keep", action="store_true",
                    help="keep --out's raw reports of suites not being run (run suites one at a time into one directory)")
    ap.add_argument("--peak-only", action="store_true",
                    help="rate suite: only the unpaced (peak) point of each transport, for a quick before/after")
    ap.add_argument("--ferry-args", default="", metavar="FLAGS",
                    help="extra flags for the ferry under test, shell-quoted (\"--busy-poll 50us\")")
    ap.add_argument("--baseline-args", default="", metavar="FLAGS",
                    help="extra flags for --baseline's ferry (the same binary with other flags is an A/B of a flag)")
    ap.add_argument("--latency-base", type=float, metavar="MBPS",
                    help="latency suite: load levels as shares of this rate instead of derper's measured saturation "
                         "(for runs whose rate suite has no paced points, e.g. --peak-only)")
    ap.add_argument("--hyperderp", type=Path, metavar="HYPER_DERP_BIN",
                    help="also measure this Hyper-DERP server binary (bench/hyperderp/build.sh builds it) as "
                         "'hyperderp' in the rate and latency suites, plain DERP only")
    ap.add_argument("--latency-levels", metavar="SHARES",
                    help="latency suite: comma-separated background loads as shares of the base (0 = pings alone) "
                         "instead of the plan's, e.g. 0,0.01,0.1 for idle and low rates")
    ap.add_argument("--rerender", action="store_true",
                    help="rebuild results.md, summary.json and the plots from --out's raw reports, running nothing")
    return ap, ap.parse_args()


def main():
    ap, args = parse_args()
    plan = plan_for(args)
    suites = [x for x in args.suites.split(",") if x]
    for x in suites:
        if x not in SUITES:
            ap.error(f"unknown suite {x!r}")
    for tool in ("cargo", "go", "openssl"):
        if not shutil.which(tool):
            sys.exit(f"bench: {tool} is required")
    if args.profile == "dev" and args.mode == "full":
        log("warning: measuring debug builds; numbers are not representative")

    if args.rerender:
        if not args.out:
            ap.error("--rerender needs --out DIR")
        rerender(args, plan)
        return
    run_suites(args, plan, suites)


def run_suites(args, plan, suites):
    """Builds, runs the suites into --out, writes the outputs; a quick run
    whose numbers are not sane fails."""
    started = time.time()
    bins = binaries(args)
    if args.baseline:
        bins["ferry-base"] = args.baseline
    if args.hyperderp:
        bins["hyperderp"] = args.hyperderp
    for k, v in bins.items():
        if not Path(v).exists():
            sys.exit(f"bench: {k} not found at {v}")

    out = args.out or run_dir("derp", args.tag or args.mode,
                              root=RESULTS if args.mode == "full" else tempfile.mkdtemp(prefix="ferry-bench-quick-"))
    out.mkdir(parents=True, exist_ok=True)
    earlier = []
    if args.keep:
        transports = [t for t in args.transports.split(",") if t]
        for x in suites:
            for f in (out / "raw" / x).glob("*.json") if (out / "raw" / x).exists() else []:
                if x in ("idle", "latency", "peers", "stuck", "mesh") or any(f"-{t}-" in f.name for t in transports):
                    f.unlink()
        earlier = load_records(out)
    elif (out / "raw").exists():
        shutil.rmtree(out / "raw")
    log(f"results go to {out}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="ferry-bench-") as tmpname:
        tmp = Path(tmpname)
        # Measure copies: the shared target directory may be rebuilt while
        # the suite runs, and every run of one suite must use the same build.
        (tmp / "bin").mkdir()
        for k in list(bins):
            shutil.copy2(bins[k], tmp / "bin" / k)
            bins[k] = tmp / "bin" / k
        ctx = Context(args, bins, out, tmp, make_cert(tmp), plan)
        ctx.records.extend(earlier)
        if earlier and (out / "summary.json").exists():
            prev = json.loads((out / "summary.json").read_text()).get("latency_base_mbps")
            ctx.latency_base = prev or peak_delivered(ctx, "derper", "plain")
        t_build = time.time() - started
        for x in suites:
            t0 = time.time()
            log(f"== suite {x}")
            SUITES[x](ctx)
            log(f"== suite {x} done in {time.time() - t0:.0f} s")
        machine = machine_info(ctx)
        machine["build_s"] = round(t_build)
        machine["run_s"] = round(time.time() - started - t_build)
        write_outputs(ctx, machine)
        problems = sanity(ctx)
        if problems:
            for p in problems:
                log(f"NOT SANE: {p}")
            if args.mode == "quick":
                sys.exit(1)
        log(f"total {time.time() - started:.0f} s")

"""The binaries under test: Ferry and ferry-bench from cargo, and derper
where every derper test of the repository finds it (interop/bin/derper,
tailscale.com pinned by interop/go.mod, built by .ci/setup.d/10-derper.sh)."""

import os
import subprocess
from pathlib import Path

from .common import DERPER_VERSION, ROOT, run

# FERRY_DERPER_BIN names another build, as for the Rust tests.
DERPER = Path(os.environ.get("FERRY_DERPER_BIN") or ROOT / "interop" / "bin" / "derper")


def target_dir(profile):
    """Where cargo puts the binaries of a profile (release or dev)."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / ("release" if profile == "release" else "debug")


def binaries(args):
    """Ferry, ferry-bench and derper, built first unless --no-build. derper
    must be tailscale.com DERPER_VERSION: the version the results name."""
    if not args.no_build:
        flag = ["--release"] if args.profile == "release" else []
        run(["cargo", "build", "--locked", *flag, "-p", "ferry", "-p", "ferry-bench"], cwd=ROOT)
        if "FERRY_DERPER_BIN" not in os.environ:
            run(["bash", ".ci/setup.d/10-derper.sh"], cwd=ROOT)
    if DERPER.exists() and not derper_is_current(DERPER):
        raise SystemExit(f"bench: {DERPER} is not derper {DERPER_VERSION}")
    if not args.no_build or not DERPLOAD.exists():
        build_derpload()
    out = target_dir(args.profile)
    return {"ferry": out / "ferry", "ferry-bench": out / "ferry-bench", "derper": DERPER, "derpload": DERPLOAD}


# The independent load generator (the clients suite): Tailscale's derphttp
# client, from the same pinned module as derper.
DERPLOAD = ROOT / "interop" / "bin" / "derpload"


def build_derpload():
    mod = ROOT / "interop" / "reference"
    go_line = next(l.split()[1] for l in (mod / "go.mod").read_text().splitlines() if l.startswith("go "))
    env = dict(os.environ, GOTOOLCHAIN=f"go{go_line}")
    run(["go", "build", "-o", str(DERPLOAD), "./cmd/derpload"], cwd=mod, env=env)


def derper_is_current(path):
    """Whether the binary was built from tailscale.com DERPER_VERSION."""
    try:
        out = subprocess.run(["go", "version", "-m", str(path)], capture_output=True, text=True).stdout
    except OSError:
        return False
    return f"tailscale.com\t{DERPER_VERSION}" in out

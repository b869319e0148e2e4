"""The binaries under test: Ferry and ferry-bench from cargo, derper from
`go install` at the pinned version."""

import os
import subprocess
from pathlib import Path

from .common import BENCH, DERPER_VERSION, ROOT, run

# derper as `go install` leaves it (bench/.gitignore).
DERPER = BENCH / "bin" / "derper"


def target_dir(profile):
    """Where cargo puts the binaries of a profile (release or dev)."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / ("release" if profile == "release" else "debug")


def binaries(args):
    """Ferry, ferry-bench and derper, built first unless --no-build."""
    if not args.no_build:
        flag = ["--release"] if args.profile == "release" else []
        run(["cargo", "build", "--locked", *flag, "-p", "ferry", "-p", "ferry-bench"], cwd=ROOT)
        if not derper_is_current(DERPER):
            DERPER.parent.mkdir(parents=True, exist_ok=True)
            env = dict(os.environ, GOBIN=str(DERPER.parent), GOFLAGS="-mod=mod")
            run(["go", "install", f"tailscale.com/cmd/derper@{DERPER_VERSION}"], env=env, cwd=BENCH)
    out = target_dir(args.profile)
    return {"ferry": out / "ferry", "ferry-bench": out / "ferry-bench", "derper": DERPER}


def derper_is_current(path):
    if not path.exists():
        return False
    try:
        out = subprocess.run(["go", "version", "-m", str(path)], capture_output=True, text=True).stdout
    except OSError:
        return False
    return f"tailscale.com\t{DERPER_VERSION}" in out

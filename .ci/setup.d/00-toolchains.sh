# serves: all
# Rust (stable, with clippy and rustfmt) and Go 1.26 come with the machine;
# fail early and clearly if they do not. Go 1.27 (the version the go line
# of interop/reference/go.mod names: derper and Tailscale's clients at
# v1.104.7 need it) comes from the Go module proxy through GOTOOLCHAIN,
# fetched here once per machine (about 76 MB) into the module cache; the
# scripts that build that module set GOTOOLCHAIN to it, and everything
# else keeps the machine's Go. jq: the suite's scripts read JSON with it
# (scripts/lib/expect.sh reads go test's events).
set -euo pipefail
. "$(dirname "$0")/../apt.sh"
command -v cargo >/dev/null || { echo "cargo not found: Rust (rustup, stable) is required" >&2; exit 1; }
command -v go >/dev/null || { echo "go not found: Go 1.26 is required" >&2; exit 1; }
rustup component add clippy rustfmt >/dev/null 2>&1 || true
apt_need "the steps that read JSON" jq:jq
cargo --version
go version
go127=go$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$(dirname "$0")/../../interop/reference/go.mod")
GOTOOLCHAIN=$go127 go version

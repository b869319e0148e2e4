# serves: all
# Rust (stable, with clippy and rustfmt) and Go 1.26 come with the machine;
# fail early and clearly if they do not. jq: the suite's scripts read JSON
# with it (scripts/lib/expect.sh reads go test's events).
set -euo pipefail
. "$(dirname "$0")/../apt.sh"
command -v cargo >/dev/null || { echo "cargo not found: Rust (rustup, stable) is required" >&2; exit 1; }
command -v go >/dev/null || { echo "go not found: Go 1.26 is required" >&2; exit 1; }
rustup component add clippy rustfmt >/dev/null 2>&1 || true
apt_need "the steps that read JSON" jq:jq
cargo --version
go version

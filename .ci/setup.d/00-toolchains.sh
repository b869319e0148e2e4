# Rust (stable, with clippy and rustfmt) and Go 1.26 come with the machine;
# fail early and clearly if they do not.
set -euo pipefail
command -v cargo >/dev/null || { echo "cargo not found: Rust (rustup, stable) is required" >&2; exit 1; }
command -v go >/dev/null || { echo "go not found: Go 1.26 is required" >&2; exit 1; }
rustup component add clippy rustfmt >/dev/null 2>&1 || true
cargo --version
go version

# serves: 12
# The oldest Rust the workspace declares (rust-version in Cargo.toml), for
# scripts/test.d/12-msrv.sh: a minimal toolchain, no components.
set -euo pipefail
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
[ -n "$msrv" ] || { echo "no rust-version in Cargo.toml" >&2; exit 1; }
rustup toolchain install "$msrv" --profile minimal --no-self-update >/dev/null
echo "MSRV toolchain: $(rustup run "$msrv" rustc --version)"

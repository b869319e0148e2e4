# Every crate inherits rust-version from the workspace; the libraries and
# binaries must build with exactly that Rust (with the locked
# dependencies), so the number in Cargo.toml and the README stays true.
# Its own target directory: a different compiler rebuilds everything.
set -euo pipefail
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
if ! rustup run "$msrv" rustc --version >/dev/null 2>&1; then
  if [ "${CI:-}" = true ]; then
    echo "CI=true: the Rust $msrv toolchain is missing (.ci/setup.d/11-msrv.sh installs it)" >&2
    exit 1
  fi
  echo "SKIP: Rust $msrv (rust-version) is not installed: rustup toolchain install $msrv --profile minimal"
  exit 0
fi
for toml in crates/*/Cargo.toml; do
  grep -q '^rust-version.workspace = true' "$toml" || { echo "$toml does not inherit rust-version" >&2; exit 1; }
done
cargo "+$msrv" check --workspace --locked --target-dir target/msrv
echo "builds with Rust $msrv (rust-version)"

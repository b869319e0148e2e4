# Every crate inherits rust-version from the workspace; the libraries and
# binaries must build with exactly that Rust (with the locked
# dependencies), so the number in Cargo.toml and the README stays true.
# Its own target directory: a different compiler rebuilds everything.
set -euo pipefail
. scripts/lib/expect.sh
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
if ! rustup run "$msrv" rustc --version >/dev/null 2>&1; then
  expect_skip "MSRV build (step 12)" "Rust $msrv (rust-version) is not installed: rustup toolchain install $msrv --profile minimal" \
    ".ci/setup.d/12-msrv.sh installs it"
fi
for toml in crates/*/Cargo.toml; do
  grep -q '^rust-version.workspace = true' "$toml" || { echo "$toml does not inherit rust-version" >&2; exit 1; }
done
cargo "+$msrv" check --workspace --locked --target-dir target/msrv
echo "builds with Rust $msrv (rust-version)"

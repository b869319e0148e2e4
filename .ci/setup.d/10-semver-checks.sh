# serves: 10
# cargo-semver-checks, pinned, for the SDK's API check in
# scripts/test.d/10-rust.sh: the public API of ferry-client against its
# last release tag (ferry-client-v*). Until a first release is tagged there
# is nothing to compare with, so nothing is installed and the check skips
# with that reason.
set -euo pipefail
version=0.51.0
if [ -z "$(git tag -l 'ferry-client-v*')" ]; then
  echo "cargo-semver-checks: not installed: no ferry-client release tag yet"
  exit 0
fi
if cargo semver-checks --version 2>/dev/null | grep -qx "cargo-semver-checks $version"; then
  exit 0
fi
cargo install --locked --quiet cargo-semver-checks --version "$version"
cargo semver-checks --version

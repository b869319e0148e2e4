# The Go interop suite: Tailscale's own client code (derphttp, derpprobe,
# stun) against ferry and derper side by side.
set -euo pipefail
cargo build --locked -p ferry
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
cd interop
FERRY_BIN="$target_dir/debug/ferry" go test ./... -count=1 -timeout 10m

# The Go interop suite: Tailscale's own client code (derphttp, derpprobe,
# stun) against ferry and derper side by side.
set -euo pipefail
cargo build --locked -p ferry
cd interop
FERRY_BIN="$PWD/../target/debug/ferry" go test ./... -count=1 -timeout 10m

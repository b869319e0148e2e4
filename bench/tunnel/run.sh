#!/usr/bin/env bash
# Tunnel quality through a DERP relay: real tailscaled nodes talking through
# ferry and derper (iperf3 TCP and UDP, ping under load), see README.md.
# Needs root. Extra arguments go to tunnelbench, e.g.
#   bash bench/tunnel/run.sh -repeats 5 -duration 15s
#   bash bench/tunnel/run.sh -tls=false -relays ferry
# Results: a Markdown table on standard output, every sample in
# bench/tunnel/results/<date>.json.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
cargo build --release --locked -p ferry
target_dir=${CARGO_TARGET_DIR:-$root/target}
mkdir -p bench/tunnel/results
out="$root/bench/tunnel/results/$(date -u +%Y-%m-%dT%H%M%SZ).json"
cd interop
go run ./e2e/tunnelbench -ferry "$target_dir/release/ferry" -out "$out" "$@"

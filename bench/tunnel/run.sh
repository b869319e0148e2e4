#!/usr/bin/env bash
# Tunnel quality through a DERP relay: real tailscaled nodes talking through
# ferry and derper (iperf3 TCP and UDP, ping under load), see README.md.
# Needs root. Extra arguments go to tunnelbench, e.g.
#   bash bench/tunnel/run.sh -repeats 5 -duration 15s
#   bash bench/tunnel/run.sh -tls=false -relays ferry
#   bash bench/tunnel/run.sh -peer-relay                  # peer relays
#   bash bench/tunnel/run.sh -longhaul -loss 2            # long lossy path
# FERRY_BIN=path uses that ferry instead of building the release one.
# Results: a Markdown table on standard output, every sample in
# bench/results/<date>-tunnel-[longhaul-]<time>/raw/tunnel.json with summary.json and
# results.md beside it (bench/README.md, "Results").
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
ferry=${FERRY_BIN:-}
if [ -z "$ferry" ]; then
  cargo build --release --locked -p ferry
  ferry=${CARGO_TARGET_DIR:-$root/target}/release/ferry
fi
. bench/lib/results.sh
tag=$(date -u +%H%M%SZ)
for a in "$@"; do [ "$a" = -longhaul ] && tag=longhaul-$tag; done
dir=$(bench_results_dir tunnel "$tag")
out="$dir/raw/tunnel.json"
(cd interop && go run ./e2e/tunnelbench -ferry "$ferry" -out "$out" "$@")
bench_results_finish "$dir" "as tunnelbench's -relay-cpus and -node-cpus (default: relay on CPU 0; tailscaleds, iperf3 and ping on CPU 1), nice -20 with -nice"

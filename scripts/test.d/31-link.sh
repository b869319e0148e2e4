# `ferry link` beside stock WireGuard: two wireguard-go peers in network
# namespaces, UDP between them blocked by nftables, the tunnel carried over
# DERP through Ferry (with a relay restart during a transfer) and then
# through derper; ping and iperf3 TCP (crates/ferry/tests/netns/link.sh,
# about 30 s). Without root or the tools it prints why and skips, except
# under CI=true.
set -euo pipefail
cargo build --locked -q -p ferry
FERRY_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/ferry" timeout 240 bash crates/ferry/tests/netns/link.sh

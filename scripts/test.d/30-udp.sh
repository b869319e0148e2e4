# The UDP relay against real WireGuard: wireguard-go peers configured with
# `wg`, ping and iperf3 through a bounce and a hub, in network namespaces
# the script creates (crates/udp/tests/netns/run.sh). Without root or
# namespaces it prints why and skips.
set -euo pipefail
cargo build --locked -q -p ferry
FERRY_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/ferry" timeout 360 bash crates/udp/tests/netns/run.sh

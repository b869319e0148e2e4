# The UDP relay against real WireGuard: wireguard-go peers configured with
# `wg`, ping and iperf3 through a bounce and a hub, in network namespaces
# the script creates (crates/udp/tests/netns/run.sh). Without root or
# namespaces it prints why and skips. (Relay sessions in namespaces, with
# an attacker forging sources, are a cargo test run by 10-rust.sh as root:
# crates/ferry/tests/relay_sessions_netns.rs, about 7 s.)
set -euo pipefail
cargo build --locked -q -p ferry
FERRY_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/ferry" timeout 360 bash crates/udp/tests/netns/run.sh

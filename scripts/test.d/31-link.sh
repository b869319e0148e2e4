# `ferry link` beside stock WireGuard: two wireguard-go peers (kernel
# WireGuard with FU_WG=kernel) in network namespaces, nftables deciding
# which paths exist (DERP only, direct; a switch down during an iperf3
# transfer, an upgrade), through Ferry and through derper; ping and iperf3
# TCP, the path read from `ferry link status --json`
# (crates/ferry/tests/netns/link.sh, about 2 minutes; LINK_CASES picks the
# cases of issue 16). Without root or the tools
# it prints why and skips, except under CI=true.
set -euo pipefail
cargo build --locked -q -p ferry
FERRY_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/ferry" timeout 420 bash crates/ferry/tests/netns/link.sh

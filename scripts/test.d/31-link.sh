# `ferry link` beside stock WireGuard: two wireguard-go peers (kernel
# WireGuard with FU_WG=kernel) in network namespaces, nftables deciding
# which paths exist, the tunnel carried through Ferry (with a relay restart
# during a transfer) and through derper; ping and iperf3 TCP, the path read
# from `ferry link status --json` (crates/ferry/tests/netns/link.sh, about
# 30 s; LINK_CASES picks the cases of issue 16). Without root or the tools
# it prints why and skips, except under CI=true.
set -euo pipefail
cargo build --locked -q -p ferry
FERRY_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/ferry" timeout 240 bash crates/ferry/tests/netns/link.sh

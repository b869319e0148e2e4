# `ferry link` beside stock WireGuard: two wireguard-go peers (kernel
# WireGuard with FU_WG=kernel) in network namespaces, nftables deciding
# which paths exist (DERP only, direct; a switch down during an iperf3
# transfer, an upgrade), through Ferry and through derper; ping and iperf3
# TCP, the path read from `ferry link status --json`
# (crates/ferry/tests/netns/link.sh, about 2 minutes; LINK_CASES picks
# some of the cases, by hand: CI runs them all). Without root or the
# tools it prints why and skips, except under CI=true.
set -euo pipefail
if { [ -n "${LINK_CASES:-}" ] || [ -n "${FLEET_CASES:-}" ]; } && [ "${CI:-}" = true ]; then
  echo "LINK_CASES and FLEET_CASES are for runs by hand; CI runs every case" >&2
  exit 1
fi
cargo build --locked -q -p ferry
FERRY_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/ferry" timeout 420 bash crates/ferry/tests/netns/link.sh
# The same over a region of two meshed nodes, one link on each
# (crates/ferry/tests/netns/fleet.sh, about 30 s): the cross-node relay
# session, counted at the hosting node's relay port with nftables; the
# hosting node killed during a transfer, then the other drained
# (SIGTERM); a region of Ferry and derper.
FERRY_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/ferry" timeout 180 bash crates/ferry/tests/netns/fleet.sh

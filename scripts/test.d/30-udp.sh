# The UDP relay against real WireGuard: wireguard-go peers configured with
# `wg`, ping and iperf3 through a bounce and a hub, in network namespaces
# the script creates (crates/udp/tests/netns/run.sh). Without root or
# namespaces it prints why and skips. (Relay sessions in namespaces, with
# an attacker forging sources, are a cargo test run by 10-rust.sh as root:
# crates/ferry/tests/relay_sessions_netns.rs, about 7 s.)
set -euo pipefail
# Everything this step runs is built first, outside the time limits below,
# which bound the tests (a cold build of the load generators takes minutes on a
# busy 2-core machine).
cargo build --locked -q -p ferry
cargo build --locked -q -p ferry-bench --bin udp_gen --bin session_pps
FERRY_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/ferry" timeout 360 bash crates/udp/tests/netns/run.sh

# The packet-rate benchmark (bench/udp/pps.sh), as a smoke check of about
# 20 s: one short sample of Ferry and nftables for the bounce, the hub and
# relay sessions, debug build. It checks that every sample delivered
# packets (for Ferry's sessions that means they were allocated, bound and
# forwarded: nothing else sends to that sink) and that the hub's handshakes
# went through, not how many packets.
. scripts/lib/netns.sh
fu_skip_or_fail "UDP packet-rate smoke check" "$(fu_why_not nft socat jq taskset)"
smoke=$(mktemp)
timeout 180 bash bench/udp/pps.sh -profile debug -r 1 -d 1 -relays "ferry nft" -cases "bounce hub session" -flows 2 -out "$smoke" >/dev/null
if ! jq -e 'length == 6 and all(.[]; .pps > 0 and .sink.packets > 0)
    and all(.[] | select(.case == "hub"); .sink.handshakes_answered == 2)' "$smoke" >/dev/null; then
  echo "UDP packet-rate smoke check: unexpected samples" >&2
  cat "$smoke" >&2
  exit 1
fi
rm -f "$smoke"
echo "UDP packet-rate smoke check: ok"

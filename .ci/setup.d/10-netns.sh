# serves: 10 30 31 40 50 55
# The tools of every network-namespace test: ip and nft (step 10's root
# tests, crates/ferry/tests/relay_sessions_netns.rs), wg, iperf3, socat
# and ping (the UDP relay's and ferry link's namespace tests, 30 and 31,
# and again in the kernel test VM, 55; the UDP soak smoke, 40; the
# end-to-end test, 50); openssl for the certificates of ferry link's
# two-node region (31).
set -euo pipefail
. "$(dirname "$0")/../apt.sh"
apt_need "the namespace tests (they need root anyway)" \
  ip:iproute2 nft:nftables wg:wireguard-tools iperf3:iperf3 socat:socat ping:iputils-ping openssl:openssl

# The end-to-end test (scripts/test.d/50-e2e.sh): network tools from Debian,
# and Headscale's Go modules (its source is built by the test, from the
# module proxy; tailscaled and tailscale come with the interop module).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq iproute2 nftables iperf3 iputils-ping jq >/dev/null
headscale=github.com/juanfont/headscale@v0.29.3   # = testbed.HeadscaleVersion
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dir=$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "$headscale" | jq -r .Dir)
(cd "$dir" && go mod download)

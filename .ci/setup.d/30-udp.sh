# Tools for the UDP relay's namespace tests and benchmark: wg
# (wireguard-tools), wireguard-go (from the Go module proxy; the binary is
# named `wireguard`), iperf3, socat, nftables, ip, ping.
set -euo pipefail
if [ "$(id -u)" = 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq wireguard-tools iperf3 socat nftables iproute2 iputils-ping >/dev/null
else
  echo "not root: skipping apt-get (the UDP namespace tests need root anyway)"
fi
go install golang.zx2c4.com/wireguard@latest
echo "wireguard-go: $("$(go env GOPATH)/bin/wireguard" --version 2>&1 | sed -n 1p)"

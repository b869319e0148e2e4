# serves: 30 31
# wireguard-go, the userspace WireGuard of the UDP relay's and ferry link's
# namespace tests (30, 31; the kernel test VM uses the kernel's), from the
# Go module proxy at a pinned version (the binary is named `wireguard`,
# in $(go env GOPATH)/bin). The other tools: 10-netns.sh.
set -euo pipefail
# What @latest resolved to on 2026-11-28 (a commit of 2026-05-22: the
# module's releases are pseudo-versions). Change it on purpose.
version=v0.0.0-20260522210424-ecfc5a8d5446
bin="$(go env GOPATH)/bin/wireguard"
if [ -x "$bin" ] && [[ "$(go version -m "$bin")" == *"mod	golang.zx2c4.com/wireguard	$version"* ]]; then
  echo "wireguard-go: $version, installed"
  exit 0
fi
go install "golang.zx2c4.com/wireguard@$version"
echo "wireguard-go: $version ($("$bin" --version 2>&1 | sed -n 1p))"

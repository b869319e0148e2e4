# The container image step (scripts/test.d/47-container.sh): podman to build
# and run the image (FROM scratch, nothing from a registry), runc as its
# runtime (Debian 12's crun refuses this kernel's hybrid cgroup layout),
# setcap for the binary's file capability, docker-compose (v1, Python) to
# validate packaging/container/compose.yaml without a daemon, curl and jq.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
  echo "not root: cannot install podman (scripts/test.d/47-container.sh will say so)"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
need=()
for tool in podman:podman runc:runc setcap:libcap2-bin docker-compose:docker-compose curl:curl jq:jq; do
  command -v "${tool%%:*}" >/dev/null || need+=("${tool#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
echo "$(podman --version), runc $(runc --version | sed -n '1s/runc version //p')"

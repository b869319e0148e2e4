# serves: 47
# The container image step (scripts/test.d/47-container.sh): podman to build
# and run the image (FROM scratch, nothing from a registry), runc as its
# runtime (Debian 12's crun refuses this kernel's hybrid cgroup layout),
# setcap for the binary's file capability, docker-compose (v1, Python) to
# validate packaging/container/compose.yaml without a daemon, curl and jq.
set -euo pipefail
. "$(dirname "$0")/../apt.sh"
apt_need scripts/test.d/47-container.sh podman:podman runc:runc setcap:libcap2-bin docker-compose:docker-compose curl:curl jq:jq
if command -v podman >/dev/null && command -v runc >/dev/null; then
  echo "$(podman --version), runc $(runc --version | sed -n '1s/runc version //p')"
fi

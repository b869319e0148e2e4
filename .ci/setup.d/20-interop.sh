# serves: 20 47
# The interop suite's Go modules (tailscale.com v1.102.5 and its tools) and
# Tailscale's derpprobe, built where the suite (20) and the container step
# (47) look for it (interop/bin/derpprobe), unless it is there and newer
# than go.sum. derper: 10-derper.sh.
set -euo pipefail
cd "$(dirname "$0")/../../interop"
go mod download
if [ -x bin/derpprobe ] && [ bin/derpprobe -nt go.sum ]; then
  echo "derpprobe: up to date"
  exit 0
fi
go build -o bin/derpprobe tailscale.com/cmd/derpprobe
echo "derpprobe: built"

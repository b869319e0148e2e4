# serves: 10 20 31 40 55
# Tailscale's derper (tailscale.com v1.102.5, pinned by interop/go.mod): the
# reference server of the client SDK's, `ferry link`'s and the relay
# sessions' tests in step 10, of the interop suite (20) and of the ferry
# link namespace tests (31, and 55 in the VM), and the baseline of the DERP
# benchmark suite (40, bench/run.sh). Built where they all look for it,
# interop/bin/derper, unless it is there and newer than go.sum. About 1 min
# cold. scripts/test.d/10-rust.sh and bench/run.sh run this script
# themselves when derper is missing and Go is there.
set -euo pipefail
cd "$(dirname "$0")/../../interop"
if [ -x bin/derper ] && [ bin/derper -nt go.sum ]; then
  echo "derper: up to date"
  exit 0
fi
go build -o bin/derper tailscale.com/cmd/derper
echo "derper: $(bin/derper --version 2>&1 | sed -n 1p)"

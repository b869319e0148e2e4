# Tailscale's derper (tailscale.com v1.102.5, pinned by interop/go.mod) for
# the client SDK's tests, which run in step 10 before the interop suite
# would build it. Built where the interop suite looks for it
# (interop/bin/derper), so that suite reuses it. About 1 min cold.
set -euo pipefail
(cd interop && go build -o bin/derper tailscale.com/cmd/derper)
echo "derper: $(interop/bin/derper --version 2>&1 | sed -n 1p)"

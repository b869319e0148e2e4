# Go modules for the interop suite (tailscale.com v1.102.5 and its tools).
set -euo pipefail
(cd interop && go mod download)

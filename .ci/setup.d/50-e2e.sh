# serves: 50
# The end-to-end test's programs (scripts/test.d/50-e2e.sh): tailscaled,
# tailscale and derper (the release interop/reference pins, with the Go
# toolchain its go line names) and Headscale (testbed.HeadscaleVersion,
# built from its module source), into
# interop/bin with the version in each name, by the test bed's own code
# (interop/e2e/cmd/e2e-binaries); what is there already is kept. About
# 6 minutes on 2 cores the first time. The network tools: 10-netns.sh.
set -euo pipefail
cd "$(dirname "$0")/../../interop"
go run ./e2e/cmd/e2e-binaries

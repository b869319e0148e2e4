// Package reference pins the Tailscale release Ferry is checked against
// (tailscale.com v1.104.7, which needs Go 1.27): .ci/setup.d/10-derper.sh
// builds its derper into interop/bin/derper, the end-to-end test bed
// builds its tailscaled and tailscale, and this package's tests run that
// release's own DERP client against ferry and that derper side by side.
// It is a module of its own because the interop module keeps the older
// release's clients. See ../README.md.
package reference

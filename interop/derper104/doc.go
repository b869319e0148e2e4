// Package derper104 builds the reference derper from tailscale.com
// v1.104.7 (interop/bin/derper, by .ci/setup.d/10-derper.sh) and tests
// that release's own DERP client against ferry and that derper side by
// side. It is a module of its own because that release needs Go 1.27,
// while the interop module keeps the older release's clients. See
// ../README.md.
package derper104

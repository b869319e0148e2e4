// Package interop holds Ferry's interoperability tests. They drive a
// running DERP server (the reference derper and ferry) with Tailscale's own
// client code. See README.md.
package interop

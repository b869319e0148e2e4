// Package e2e is Ferry's end-to-end test: real tailscaled nodes, logged in
// to a real Headscale, talking through the relay under test (ferry, and
// Tailscale's derper for comparison) in network namespaces where direct
// UDP between them is blocked. See README.md; the network itself is built
// by package testbed.
package e2e

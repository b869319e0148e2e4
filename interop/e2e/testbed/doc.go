// Package testbed runs a whole Tailscale network on one Linux machine: a
// Headscale control server, two tailscaled nodes and a DERP relay (ferry or
// Tailscale's derper), each in network namespaces of its own, with direct
// UDP between the nodes blocked so that every packet between them crosses
// the relay.
//
// Topology (all names start with "fe-", all addresses are in 10.78.0.0/16):
//
//	fe-<id>-r   relay namespace: bridge br0 10.78.0.1/24, the relay
//	            (DERP on :443 or :3340, STUN on :3478) and Headscale (:8080)
//	fe-<id>-a   node A: eth0 10.78.0.2/24 (veth into br0), tailscaled
//	fe-<id>-b   node B: eth0 10.78.0.3/24, tailscaled
//
// Node namespaces drop UDP to and from the other node on eth0 (nftables);
// no namespace has a default route, so nothing leaves the machine. <id> is
// the test process's pid, which lets a later run delete what a killed run
// left behind (Reap).
//
// A Bed is brought up by Up and torn down by Close, which kills every
// process it started and deletes every namespace, also after a failure
// half-way. The e2e test (package e2e) and the tunnel benchmark
// (tunnelbench) are both built on it.
//
// Linux only, and it must run as root.
package testbed

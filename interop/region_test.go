package interop

// Regional mesh with --mesh-with: regions of two and three nodes over TLS
// on loopback, every mix of ferry and derper nodes, with Tailscale's own
// derphttp clients on different nodes. The all-derper region runs in the
// same test run as the reference; every case asserts the same behaviour
// of every mix.

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"ferry.invalid/interop/testcert"
	"tailscale.com/derp"
	"tailscale.com/types/key"
)

// newTestCA is a throw-away certificate authority: the region's nodes get
// certificates it signs, and find it through SSL_CERT_FILE (derper through
// Go's crypto/x509, ferry through rustls-native-certs), the way a real
// region's nodes trust each other's certificates through the system roots.
func newTestCA(t *testing.T) *testcert.CA {
	t.Helper()
	ca, err := testcert.NewCA(t.TempDir(), "ferry interop test CA")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// meshSetup is what a region's nodes share: a CA that signs their
// certificates (and that they trust through SSL_CERT_FILE) and a mesh key.
type meshSetup struct {
	ca      *testcert.CA
	meshHex string
}

func newMeshSetup(t *testing.T) meshSetup {
	t.Helper()
	var raw [32]byte
	rand.Read(raw[:])
	return meshSetup{ca: newTestCA(t), meshHex: hex.EncodeToString(raw[:])}
}

// opts is a node on port dialing peers (a --mesh-with list).
func (m meshSetup) opts(port int, peers string) serverOpts {
	return serverOpts{
		tls: true, mesh: true, meshHex: m.meshHex, port: port, ca: m.ca,
		env:  []string{"SSL_CERT_FILE=" + m.ca.File},
		args: []string{"--mesh-with", peers},
	}
}

// eachFerryDialer runs fn as parallel subtests in which a ferry node dials
// a far node that is ferry, then derper.
func eachFerryDialer(t *testing.T, fn func(t *testing.T, far string)) {
	for _, far := range []string{kindFerry, kindDerper} {
		t.Run("ferry+"+far, func(t *testing.T) {
			for _, k := range []string{kindFerry, far} {
				if !contains(selectedServers, k) {
					t.Skipf("INTEROP_SERVERS excludes %s", k)
				}
			}
			t.Parallel()
			fn(t, far)
		})
	}
}

// region is a set of meshed nodes.
type region struct {
	nodes []*server
	opts  []serverOpts
}

// startRegion starts one node per kind, each with --mesh-with listing
// every node of the region (itself included, as operators do: a node
// must recognise itself by its key).
func startRegion(t *testing.T, kinds []string) *region {
	t.Helper()
	m := newMeshSetup(t)
	var peers []string
	ports := make([]int, len(kinds))
	for i := range kinds {
		ports[i] = freePort(t, "tcp")
		// The certificate is for "localhost"; dial the IPv4 loopback.
		peers = append(peers, fmt.Sprintf("localhost:%d/127.0.0.1", ports[i]))
	}
	r := &region{}
	for i, kind := range kinds {
		opts := m.opts(ports[i], strings.Join(peers, ","))
		r.opts = append(r.opts, opts)
		r.nodes = append(r.nodes, startServer(t, kind, opts))
	}
	return r
}

// restart stops node i and starts it again on the same port, with the
// same key and flags.
func (r *region) restart(t *testing.T, i int) {
	t.Helper()
	old := r.nodes[i]
	old.stop()
	s, err := tryStartServer(t, old.kind, r.opts[i], old.dir, 1)
	if err != nil {
		t.Fatalf("restarting node %d (%s): %v", i, old.kind, err)
	}
	r.nodes[i] = s
}

// meshDeliver sends fresh packets from a to b until one arrives (the
// links between the nodes may still be coming up), within limit.
func meshDeliver(t *testing.T, a, b *dclient, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for attempt := 0; time.Since(start) < limit; attempt++ {
		pkt := nonDisco(120)
		a.send(t, b.pub, pkt)
		wait := time.Now().Add(250 * time.Millisecond)
		for time.Now().Before(wait) {
			m, err := b.recv(time.Until(wait))
			if err != nil {
				break
			}
			if p, ok := m.(derp.ReceivedPacket); ok && string(p.Data) == string(pkt) {
				if p.Source != a.pub {
					t.Fatalf("%s: packet from %s arrived with source %s", b.name, a.pub.ShortString(), p.Source.ShortString())
				}
				return time.Since(start)
			}
		}
	}
	t.Fatalf("no packet from %s reached %s through the mesh within %v", a.name, b.name, limit)
	return 0
}

// meshRegions are the mixes every mesh case runs on; the all-derper one is
// the reference.
var meshRegions = [][]string{
	{kindDerper, kindDerper},
	{kindFerry, kindFerry},
	{kindFerry, kindDerper},
	{kindDerper, kindFerry},
}

func eachRegion(t *testing.T, regions [][]string, fn func(t *testing.T, r *region)) {
	for _, kinds := range regions {
		name := strings.Join(kinds, "+")
		t.Run(name, func(t *testing.T) {
			for _, k := range kinds {
				if !contains(selectedServers, k) {
					t.Skipf("INTEROP_SERVERS excludes %s", k)
				}
				if k == kindFerry && ferryBinErr != nil {
					t.Fatal(ferryBinErr)
				}
			}
			t.Parallel()
			fn(t, startRegion(t, kinds))
		})
	}
}

// Clients on different nodes reach each other both ways with their true
// source key; a client that leaves its node is peerGone for the clients
// that received from it; a key connected to two nodes is delivered locally
// first and through the mesh when its local connection leaves.
func TestMeshRegion(t *testing.T) {
	eachRegion(t, meshRegions, func(t *testing.T, r *region) {
		a := r.nodes[0].newClient(t, "a@0")
		bKey := key.NewNode()
		b := r.nodes[1].newClientWithKey(t, "b@1", bKey)

		took := meshDeliver(t, a, b, 20*time.Second)
		t.Logf("first packet through the mesh after %v", took)
		relayOK(t, b, a)
		for range 3 {
			relayOK(t, a, b)
			relayOK(t, b, a)
		}
		for i, n := range r.nodes {
			if n.kind != kindFerry {
				continue
			}
			peer := r.nodes[1-i]
			if v, ok := n.metric(t, "ferry_mesh_link_up", fmt.Sprintf("peer=localhost:%d", peer.port)); !ok || v != 1 {
				t.Errorf("node %d: ferry_mesh_link_up for node %d = %v (present %v), want 1", i, 1-i, v, ok)
			}
			// A Ferry peer answers the mesh extension the link asked
			// for; derper ignores the key.
			wantFerry := map[bool]float64{true: 1, false: 0}[peer.kind == kindFerry]
			if v, ok := n.metric(t, "ferry_mesh_link_ferry", fmt.Sprintf("peer=localhost:%d", peer.port)); !ok || v != wantFerry {
				t.Errorf("node %d: ferry_mesh_link_ferry for node %d (%s) = %v (present %v), want %v", i, 1-i, peer.kind, v, ok, wantFerry)
			}
			if v, _ := n.metric(t, "derp_packets_forwarded_out"); v < 4 {
				t.Errorf("node %d: derp_packets_forwarded_out = %v, want >= 4", i, v)
			}
			// The other node's clients: the peer's client, and this
			// node's own mesh connection there (a client like any
			// other, as derper counts it).
			if v, _ := n.metric(t, "derp_clients_remote"); v != 2 {
				t.Errorf("node %d: derp_clients_remote = %v, want 2", i, v)
			}
		}

		// b also connects to node 0: a's packets go to the local one.
		b0 := r.nodes[0].newClientWithKey(t, "b@0", bKey)
		pkt := nonDisco(90)
		a.send(t, bKey.Public(), pkt)
		b0.expectPacket(t, a.pub, pkt)
		b.expectNone(t, 300*time.Millisecond, "packet at the remote b while a local b exists", isPacket)
		// The local one leaves: the key is still in the region, so a gets
		// no peerGone and reaches b on node 1 again.
		b0.c.Close()
		a.expectNone(t, 500*time.Millisecond, "peerGone(b) while b is on node 1", func(m derp.ReceivedMessage) bool {
			g, ok := m.(derp.PeerGoneMessage)
			return ok && g.Peer == bKey.Public()
		})
		meshDeliver(t, a, b, 5*time.Second)

		// b leaves the region: a, which received from b, gets peerGone.
		b.c.Close()
		m := a.waitFor(t, 10*time.Second, "peerGone(b)", isPeerGone)
		if g := m.(derp.PeerGoneMessage); g.Peer != bKey.Public() || g.Reason != derp.PeerGoneReasonDisconnected {
			t.Fatalf("a got %s, want peerGone(b, disconnected)", describe(m))
		}
	})
}

// A node restart is survived: the links to it come back by themselves and
// clients on it are reachable again through the mesh. The time from the
// restarted node being ready to the first packet through is logged for
// each mix.
func TestMeshNodeRestart(t *testing.T) {
	eachRegion(t, meshRegions, func(t *testing.T, r *region) {
		a := r.nodes[0].newClient(t, "a@0")
		bKey := key.NewNode()
		b := r.nodes[1].newClientWithKey(t, "b@1", bKey)
		meshDeliver(t, a, b, 20*time.Second)

		r.restart(t, 1)
		ready := time.Now()
		b2 := r.nodes[1].newClientWithKey(t, "b@1'", bKey)
		took := meshDeliver(t, a, b2, 30*time.Second)
		t.Logf("%s restarted: first packet through the mesh %v after it was ready (%v after b reconnected)",
			r.nodes[1].kind, time.Since(ready).Round(time.Millisecond), took.Round(time.Millisecond))
		relayOK(t, b2, a)
	})
}

// Three nodes, two of them ferry: every pair of nodes carries packets both
// ways (each node dials both others; one hop only).
func TestMeshThreeNodes(t *testing.T) {
	regions := [][]string{
		{kindDerper, kindDerper, kindDerper},
		{kindFerry, kindDerper, kindFerry},
	}
	eachRegion(t, regions, func(t *testing.T, r *region) {
		clients := make([]*dclient, len(r.nodes))
		for i, n := range r.nodes {
			clients[i] = n.newClient(t, fmt.Sprintf("c@%d", i))
		}
		for i := range clients {
			for j := range clients {
				if i != j {
					meshDeliver(t, clients[i], clients[j], 20*time.Second)
				}
			}
		}
	})
}

// A peer with the wrong mesh key is refused by the node it dials; the
// failing link is logged and nothing else is affected: clients of the
// refusing node keep relaying.
func TestMeshWrongKey(t *testing.T) {
	for _, kinds := range [][]string{{kindDerper, kindDerper}, {kindFerry, kindDerper}, {kindDerper, kindFerry}, {kindFerry, kindFerry}} {
		t.Run(strings.Join(kinds, "+"), func(t *testing.T) {
			for _, k := range kinds {
				if !contains(selectedServers, k) {
					t.Skipf("INTEROP_SERVERS excludes %s", k)
				}
			}
			t.Parallel()
			m := newMeshSetup(t)
			p0, p1 := freePort(t, "tcp"), freePort(t, "tcp")
			peers := fmt.Sprintf("localhost:%d/127.0.0.1,localhost:%d/127.0.0.1", p0, p1)
			var nodes []*server
			for i, port := range []int{p0, p1} {
				m.meshHex = newMeshSetup(t).meshHex // a different key per node
				nodes = append(nodes, startServer(t, kinds[i], m.opts(port, peers)))
			}
			a := nodes[0].newClient(t, "a@0")
			b := nodes[1].newClient(t, "b@1")
			a2 := nodes[0].newClient(t, "a2@0")
			// Local relaying is unaffected.
			relayOK(t, a, a2)
			// Nothing crosses: send for a while, nothing arrives.
			for range 5 {
				a.send(t, b.pub, nonDisco(64))
				time.Sleep(100 * time.Millisecond)
			}
			b.expectNone(t, 300*time.Millisecond, "packet across nodes with different mesh keys", isPacket)
			relayOK(t, a2, a)
			for i, n := range nodes {
				if n.kind == kindFerry {
					waitLog(t, n, "mesh: could not connect")
					if v, _ := n.metric(t, "ferry_mesh_link_up", fmt.Sprintf("peer=localhost:%d", nodes[1-i].port)); v != 0 {
						t.Errorf("node %d: link up with a wrong mesh key", i)
					}
				}
			}
		})
	}
}

// blackhole is a TCP forwarder that can be cut: while cut it drops every
// byte in both directions and keeps the connections open, as a firewall
// rule that drops packets does.
type blackhole struct {
	ln     net.Listener
	target string
	cut    atomic.Bool
}

func startBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: target}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.DialTimeout("tcp4", target, 5*time.Second)
			if err != nil {
				c.Close()
				continue
			}
			t.Cleanup(func() { c.Close(); up.Close() })
			go b.pipe(c, up)
			go b.pipe(up, c)
		}
	}()
	return b
}

func (b *blackhole) pipe(from, to net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if err != nil {
			to.Close()
			return
		}
		if b.cut.Load() {
			continue
		}
		if _, err := to.Write(buf[:n]); err != nil {
			from.Close()
			return
		}
	}
}

func (b *blackhole) port() int { return b.ln.Addr().(*net.TCPAddr).Port }

// A link whose path goes silent (a firewall drops everything, the TCP
// connection stays open) is found dead by its pings within seconds, its
// keys are withdrawn, the link the other way is unaffected, and it comes
// back once the path does. ferry dials through the cut path; derper's
// mesh client would wait for its two-minute read deadline, so it is not
// the dialer here (it is the far node in the second mix).
func TestMeshLinkCut(t *testing.T) {
	eachFerryDialer(t, func(t *testing.T, far string) {
		m := newMeshSetup(t)
		p0, p1 := freePort(t, "tcp"), freePort(t, "tcp")
		hole := startBlackhole(t, fmt.Sprintf("127.0.0.1:%d", p1))
		opts := m.opts
		n0 := startServer(t, kindFerry, opts(p0, fmt.Sprintf("localhost:%d/127.0.0.1", hole.port())))
		n1 := startServer(t, far, opts(p1, fmt.Sprintf("localhost:%d/127.0.0.1", p0)))
		a := n0.newClient(t, "a@0")
		b := n1.newClient(t, "b@1")
		meshDeliver(t, a, b, 20*time.Second)
		meshDeliver(t, b, a, 20*time.Second)

		hole.cut.Store(true)
		cutAt := time.Now()
		deadline := cutAt.Add(30 * time.Second)
		for !strings.Contains(n0.logs.String(), "mesh: link down") {
			if time.Now().After(deadline) {
				t.Fatalf("the cut link was not found dead within 30s")
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("cut link found dead after %v", time.Since(cutAt).Round(100*time.Millisecond))
		if v, _ := n0.metric(t, "ferry_mesh_link_up", fmt.Sprintf("peer=localhost:%d", hole.port())); v != 0 {
			t.Errorf("ferry_mesh_link_up = %v after the link died", v)
		}
		// The other direction has its own link, untouched.
		relayOK(t, b, a)

		hole.cut.Store(false)
		healed := time.Now()
		meshDeliver(t, a, b, 40*time.Second)
		t.Logf("link back %v after the path healed", time.Since(healed).Round(100*time.Millisecond))
	})
}

// A peer whose certificate the system roots do not vouch for is never
// meshed with (TLS to mesh peers is always verified): ferry logs why and
// keeps retrying, its clients relay locally as before, and nothing is
// forwarded to the peer.
func TestMeshBadCertificate(t *testing.T) {
	eachFerryDialer(t, func(t *testing.T, far string) {
		m := newMeshSetup(t)
		p0, p1 := freePort(t, "tcp"), freePort(t, "tcp")
		n0 := startServer(t, kindFerry, m.opts(p0, fmt.Sprintf("localhost:%d/127.0.0.1", p1)))
		// Self-signed: not from the CA node 0 trusts.
		n1 := startServer(t, far, serverOpts{tls: true, mesh: true, meshHex: m.meshHex, port: p1})
		a := n0.newClient(t, "a@0")
		a2 := n0.newClient(t, "a2@0")
		b := n1.newClient(t, "b@1")
		// (Its first dial may be refused: node 1 starts after it.)
		waitLog(t, n0, "invalid peer certificate")
		relayOK(t, a, a2)
		a.send(t, b.pub, nonDisco(64))
		b.expectNone(t, 300*time.Millisecond, "packet through a link with an unverified peer", isPacket)
		if v, _ := n0.metric(t, "derp_packets_forwarded_out"); v != 0 {
			t.Errorf("derp_packets_forwarded_out = %v towards an unverified peer", v)
		}
	})
}

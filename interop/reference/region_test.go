package reference

// A region of two nodes, ferry and derper v1.104.7, meshed over TLS
// (--mesh-with naming both, one mesh key), with v1.104.7's clients
// carrying app names on each node: each node learns the other's clients
// from peerPresent frames that carry those names (packets cross the mesh
// only for keys a node learned that way), and peerGone crosses both ways.

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"ferry.invalid/interop/testcert"
	"tailscale.com/derp"
)

// clientConfig trusts ca's certificates for localhost.
func clientConfig(ca *testcert.CA) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return &tls.Config{RootCAs: pool, ServerName: "localhost"}
}

// meshDeliver sends fresh packets from a to b until one arrives (the
// links between the nodes may still be coming up), within limit.
func meshDeliver(t *testing.T, a, b *client, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for attempt := 0; time.Since(start) < limit; attempt++ {
		pkt := []byte(fmt.Sprintf("ferry interop: %s to %s, attempt %d", a.name, b.name, attempt))
		if err := a.c.Send(b.pub, pkt); err != nil {
			t.Fatalf("%s: send: %v", a.name, err)
		}
		wait := time.Now().Add(250 * time.Millisecond)
		for {
			m, err := b.next(wait)
			if err != nil {
				break
			}
			if p, ok := m.(derp.ReceivedPacket); ok && bytes.Equal(p.Data, pkt) {
				if p.Source != a.pub {
					t.Fatalf("%s: packet from %s has source %s", b.name, a.name, p.Source.ShortString())
				}
				return time.Since(start)
			}
		}
	}
	t.Fatalf("no packet from %s reached %s through the mesh within %v", a.name, b.name, limit)
	return 0
}

// gone waits for peerGone(peer, disconnected) at d.
func (d *client) gone(t *testing.T, peer *client) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; i < 100; i++ {
		m, err := d.next(deadline)
		if err != nil {
			t.Fatalf("%s: waiting for peerGone(%s): %v", d.name, peer.name, err)
		}
		if g, ok := m.(derp.PeerGoneMessage); ok && g.Peer == peer.pub {
			if g.Reason != derp.PeerGoneReasonDisconnected {
				t.Fatalf("%s: peerGone(%s) reason %v, want disconnected", d.name, peer.name, g.Reason)
			}
			return
		}
	}
	t.Fatalf("%s: 100 messages without peerGone(%s)", d.name, peer.name)
}

func TestMixedRegionAppNames(t *testing.T) {
	for _, kind := range []string{kindDerper, kindFerry} {
		if err := binaries[kind].err; err != nil {
			t.Fatal(err)
		}
	}
	ca, err := testcert.NewCA(t.TempDir(), "ferry interop v1.104 test CA")
	if err != nil {
		t.Fatal(err)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		t.Fatal(err)
	}
	meshHex := hex.EncodeToString(raw[:])
	ports := []int{freePort(t, "tcp"), freePort(t, "tcp")}
	peers := fmt.Sprintf("localhost:%d/127.0.0.1,localhost:%d/127.0.0.1", ports[0], ports[1])
	var nodes []*server
	for i, kind := range []string{kindFerry, kindDerper} {
		nodes = append(nodes, startServer(t, kind, serverOpts{
			ca: ca, port: ports[i], meshHex: meshHex,
			env:   []string{"SSL_CERT_FILE=" + ca.File},
			extra: []string{"--mesh-with", peers},
		}))
	}
	ferry, derper := nodes[0], nodes[1]

	a := ferry.dial(t, "a@ferry", "app-on-ferry", false)
	a.accepted(t)
	b := derper.dial(t, "b@derper", "app-on-derper", false)
	b.accepted(t)
	c := derper.dial(t, "c@derper", "another app", false)
	c.accepted(t)
	// Each node's own watcher sees its client's name.
	for i, cl := range []*client{a, b} {
		w := nodes[i].dial(t, "watcher@"+nodes[i].kind, "", true)
		w.accepted(t)
		if pp := w.present(t, cl.pub); pp.AppName != cl.appName {
			t.Errorf("%s's watcher: %s with app %q, want %q", nodes[i].kind, cl.name, pp.AppName, cl.appName)
		}
	}

	t.Logf("ferry to derper: first packet after %v", meshDeliver(t, a, b, 20*time.Second))
	t.Logf("derper to ferry: first packet after %v", meshDeliver(t, b, a, 20*time.Second))
	meshDeliver(t, a, c, 5*time.Second)

	// peerGone crosses both ways: b leaves derper, a (on ferry, which
	// received from b) is told; a leaves ferry, c (on derper) is told.
	b.c.Close()
	a.gone(t, b)
	a.c.Close()
	c.gone(t, a)
}

package interop

import (
	"testing"
	"time"

	"tailscale.com/derp"
	"tailscale.com/types/key"
)

// TestMeshFramesWithoutKey: watchConns, closePeer and forwardPacket from a
// client without the mesh key get that client disconnected; other clients
// are unaffected.
func TestMeshFramesWithoutKey(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		s := startServer(t, kind, serverOpts{mesh: true})
		b := s.newClient(t, "b")
		c := s.newClient(t, "c")
		relayOK(t, b, c)

		t.Run("watchConns", func(t *testing.T) {
			x := s.newClient(t, "x", withWatch())
			x.expectClosed(t, 5*time.Second)
			relayOK(t, b, c)
			relayOK(t, c, b)
		})
		t.Run("closePeer", func(t *testing.T) {
			x := s.newClient(t, "x")
			if err := x.c.ClosePeer(b.pub); err != nil {
				t.Fatal(err)
			}
			x.expectClosed(t, 5*time.Second)
			relayOK(t, b, c) // B was not closed
			relayOK(t, c, b)
		})
		t.Run("forwardPacket", func(t *testing.T) {
			x := s.newClient(t, "x")
			src := key.NewNode().Public()
			if err := x.c.ForwardPacket(src, b.pub, nonDisco(64)); err != nil {
				t.Fatal(err)
			}
			x.expectClosed(t, 5*time.Second)
			relayOK(t, c, b) // and B did not get the forwarded packet first
			relayOK(t, b, c)
		})
	})
}

// TestMeshFramesWithKey: with the mesh key, watchConns yields peerPresent for
// every connected client (and later arrivals/departures), forwardPacket is
// delivered with the given source, and closePeer closes the target.
func TestMeshFramesWithKey(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		s := startServer(t, kind, serverOpts{mesh: true})
		b := s.newClient(t, "b")
		c := s.newClient(t, "c")
		bAddr, err := b.c.LocalAddr()
		if err != nil {
			t.Fatal(err)
		}

		m := s.newClient(t, "mesh", withMeshKey(s.meshKey), withWatch())
		// The initial flood: one peerPresent per connected client, including
		// the watcher's own connection (flagged as a mesh peer).
		seen := map[key.NodePublic]derp.PeerPresentMessage{}
		floodDeadline := time.Now().Add(5 * time.Second)
		for i := 0; !(hasKey(seen, b.pub) && hasKey(seen, c.pub) && hasKey(seen, m.pub)); i++ {
			if i >= 20 || time.Now().After(floodDeadline) {
				t.Fatalf("watcher saw %d peerPresent messages in 5s without all of B, C and itself", i)
			}
			msg := m.waitFor(t, time.Until(floodDeadline), "peerPresent for B, C and the watcher itself", isPeerPresent)
			pp := msg.(derp.PeerPresentMessage)
			t.Logf("watcher: %s", describe(msg))
			seen[pp.Key] = pp
		}
		if pp := seen[m.pub]; pp.Flags != derp.PeerPresentIsMeshPeer {
			t.Errorf("peerPresent for the watcher itself has flags %#x; want IsMeshPeer (%#x)", pp.Flags, derp.PeerPresentIsMeshPeer)
		}
		if pp := seen[b.pub]; pp.IPPort != bAddr {
			t.Errorf("peerPresent for B has address %v; B's local address is %v", pp.IPPort, bAddr)
		}
		if pp := seen[b.pub]; pp.Flags != derp.PeerPresentIsRegular {
			t.Errorf("peerPresent for B has flags %#x; want IsRegular (%#x)", pp.Flags, derp.PeerPresentIsRegular)
		}
		s.waitMetricEq(t, 1, "derp_watchers")

		// A new client is announced; its departure is reported.
		d := s.newClient(t, "d")
		msg := m.waitFor(t, 5*time.Second, "peerPresent for D", func(x derp.ReceivedMessage) bool {
			pp, ok := x.(derp.PeerPresentMessage)
			return ok && pp.Key == d.pub
		})
		t.Logf("watcher: %s", describe(msg))
		d.c.Close()
		msg = m.waitFor(t, 5*time.Second, "peerGone for D", func(x derp.ReceivedMessage) bool {
			pg, ok := x.(derp.PeerGoneMessage)
			return ok && pg.Peer == d.pub
		})
		if pg := msg.(derp.PeerGoneMessage); pg.Reason != derp.PeerGoneReasonDisconnected {
			t.Fatalf("watcher got %s; want reason Disconnected", describe(msg))
		}

		// forwardPacket from the mesh client reaches B with the given source.
		src := key.NewNode().Public()
		pkt := nonDisco(300)
		if err := m.c.ForwardPacket(src, b.pub, pkt); err != nil {
			t.Fatal(err)
		}
		b.expectPacket(t, src, pkt)

		// closePeer(B) closes B's connection; C is unaffected.
		if err := m.c.ClosePeer(b.pub); err != nil {
			t.Fatal(err)
		}
		b.expectClosed(t, 5*time.Second)
		m.waitFor(t, 5*time.Second, "peerGone for B", func(x derp.ReceivedMessage) bool {
			pg, ok := x.(derp.PeerGoneMessage)
			return ok && pg.Peer == b.pub
		})
		e := s.newClient(t, "e")
		relayOK(t, c, e)
		m.ping(t) // the mesh connection itself is still up
	})
}

func isPeerPresent(m derp.ReceivedMessage) bool {
	_, ok := m.(derp.PeerPresentMessage)
	return ok
}

func hasKey[V any](m map[key.NodePublic]V, k key.NodePublic) bool {
	_, ok := m[k]
	return ok
}

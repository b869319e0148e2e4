package interop

import (
	"fmt"
	"testing"
	"time"

	"tailscale.com/derp"
	"tailscale.com/types/key"
)

// TestPacketRelay: packets of 0, 1, 1400 and 65536 (max) bytes both ways,
// payload and source key exact, over plain HTTP and TLS; packet/byte
// counters match.
func TestPacketRelay(t *testing.T) {
	sizes := []int{0, 1, 1400, derp.MaxPacketSize}
	eachServer(t, func(t *testing.T, kind string) {
		for _, mode := range []string{"plain", "tls"} {
			t.Run(mode, func(t *testing.T) {
				s := startServer(t, kind, serverOpts{tls: mode == "tls"})
				a := s.newClient(t, "a")
				b := s.newClient(t, "b")
				var pkts, bytes int
				for _, n := range sizes {
					t.Run(fmt.Sprint(n), func(t *testing.T) {
						p1 := nonDisco(n)
						a.send(t, b.pub, p1)
						b.expectPacket(t, a.pub, p1)
						p2 := nonDisco(n)
						b.send(t, a.pub, p2)
						a.expectPacket(t, b.pub, p2)
					})
					pkts += 2
					bytes += 2 * n
				}
				if t.Failed() {
					return
				}
				s.waitMetricEq(t, float64(pkts), "derp_packets_received")
				s.waitMetricEq(t, float64(pkts), "derp_packets_sent")
				s.waitMetricEq(t, float64(bytes), "derp_bytes_received")
				s.waitMetricEq(t, float64(bytes), "derp_bytes_sent")
				s.waitMetricEq(t, 2, "derp_accepts")
				s.waitMetricEq(t, 2, "derp_current_connections")
			})
		}
	})
}

// TestPingPong: a client ping with 8 bytes gets a pong echoing them, and the
// ping/pong counters move.
func TestPingPong(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		s := startServer(t, kind, serverOpts{})
		a := s.newClient(t, "a")
		gotPing := s.mustMetric(t, "derp_got_ping")
		sentPong := s.mustMetric(t, "derp_sent_pong")
		for i := range 3 {
			var data [8]byte
			copy(data[:], randBytes(8))
			if err := a.c.SendPing(data); err != nil {
				t.Fatal(err)
			}
			m := a.waitFor(t, 5*time.Second, "pong", func(m derp.ReceivedMessage) bool {
				_, ok := m.(derp.PongMessage)
				return ok
			})
			if got := m.(derp.PongMessage); got != derp.PongMessage(data) {
				t.Fatalf("ping %d: pong %x; want %x", i, got, data)
			}
		}
		s.waitMetricEq(t, gotPing+3, "derp_got_ping")
		s.waitMetricEq(t, sentPong+3, "derp_sent_pong")
	})
}

// TestPeerGoneDisconnected: after A sends to B and A disconnects, B gets
// peerGone(A, Disconnected).
func TestPeerGoneDisconnected(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		s := startServer(t, kind, serverOpts{})
		a := s.newClient(t, "a")
		b := s.newClient(t, "b")
		c := s.newClient(t, "c") // never received from A: must get no peerGone
		relayOK(t, a, b)
		relayOK(t, c, b)
		a.c.Close()
		m := b.waitFor(t, 5*time.Second, "peerGone for A", isPeerGone)
		pg := m.(derp.PeerGoneMessage)
		if pg.Peer != a.pub || pg.Reason != derp.PeerGoneReasonDisconnected {
			t.Fatalf("got %s; want PeerGone{%s, Disconnected}", describe(m), a.pub.ShortString())
		}
		s.waitMetricEq(t, 1, "derp_peer_gone_disconnected_frames")
		c.expectNone(t, 300*time.Millisecond, "peerGone", isPeerGone)
		relayOK(t, b, c)
	})
}

// TestPeerGoneNotHere: a disco packet to an unknown key yields
// peerGone(NotHere); a non-disco packet yields none; the notices are rate
// limited per connection (burst 3).
func TestPeerGoneNotHere(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		s := startServer(t, kind, serverOpts{})

		t.Run("disco", func(t *testing.T) {
			a := s.newClient(t, "a")
			unknown := key.NewNode().Public()
			a.send(t, unknown, discoPacket(62)) // shortest disco packet
			m := a.waitFor(t, 5*time.Second, "peerGone NotHere", isPeerGone)
			pg := m.(derp.PeerGoneMessage)
			if pg.Peer != unknown || pg.Reason != derp.PeerGoneReasonNotHere {
				t.Fatalf("got %s; want PeerGone{%s, NotHere}", describe(m), unknown.ShortString())
			}
			s.waitMetricEq(t, 1, "derp_peer_gone_not_here_frames")
			s.waitMetricEq(t, 1, "derp_packets_dropped", "reason=unknown_dest", "kind=disco")
			s.waitMetricEq(t, 0, "derp_packets_dropped", "reason=unknown_dest", "kind=other")
		})

		t.Run("non-disco", func(t *testing.T) {
			a := s.newClient(t, "a")
			a.send(t, key.NewNode().Public(), nonDisco(100))
			a.send(t, key.NewNode().Public(), discoPacket(61)) // magic but too short to be disco
			a.send(t, key.NewNode().Public(), nonDisco(1200))
			a.ping(t) // the server has processed the sends
			// The notice is queued asynchronously; allow it time to show up.
			a.expectNone(t, 300*time.Millisecond, "peerGone for a non-disco packet", isPeerGone)
			s.waitMetricEq(t, 3, "derp_packets_dropped", "reason=unknown_dest", "kind=other")
			s.waitMetricEq(t, 1, "derp_packets_dropped", "reason=unknown_dest", "kind=disco")
			s.waitMetricEq(t, 1, "derp_peer_gone_not_here_frames")
		})

		t.Run("rate-limit", func(t *testing.T) {
			a := s.newClient(t, "a")
			unknown := map[key.NodePublic]bool{}
			start := time.Now()
			for range 10 {
				k := key.NewNode().Public()
				unknown[k] = true
				a.send(t, k, discoPacket(100))
			}
			if d := time.Since(start); d > 200*time.Millisecond {
				t.Logf("warning: 10 sends took %v", d)
			}
			n := 0
			window := time.Until(start.Add(500 * time.Millisecond))
			deadline := time.Now().Add(window)
			for {
				left := time.Until(deadline)
				if left <= 0 {
					break
				}
				m, err := a.recv(left)
				if err == errRecvTimeout {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if pg, ok := m.(derp.PeerGoneMessage); ok {
					if !unknown[pg.Peer] || pg.Reason != derp.PeerGoneReasonNotHere {
						t.Fatalf("unexpected %s", describe(m))
					}
					n++
				}
			}
			t.Logf("%d NotHere notices for 10 disco sends within 500ms", n)
			if n < 3 || n > 4 {
				t.Fatalf("got %d NotHere notices for 10 quick disco sends; want 3 (burst 3, +1 tolerance)", n)
			}
			s.waitMetricEq(t, 11, "derp_packets_dropped", "reason=unknown_dest", "kind=disco")
			s.waitMetric(t, 5*time.Second, ">= 4", func(v float64) bool { return v >= 4 }, "derp_peer_gone_not_here_frames")
		})
	})
}

// TestDuplicateKeys: two connections with the same key. The newest is
// active; any frame from the other makes it active; closing one leaves the
// other working, with no peerGone to senders.
func TestDuplicateKeys(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		s := startServer(t, kind, serverOpts{})
		b := s.newClient(t, "b")
		priv := key.NewNode()
		a1 := s.newClientWithKey(t, "a1", priv)
		s.waitMetricEq(t, 0, "derp_current_dup_client_keys")
		a2 := s.newClientWithKey(t, "a2", priv)
		aPub := priv.Public()
		s.waitMetricEq(t, 1, "derp_current_dup_client_keys")
		s.waitMetricEq(t, 3, "derp_current_connections")

		// The last connection to register is active.
		p1 := nonDisco(100)
		b.send(t, aPub, p1)
		a2.expectPacket(t, b.pub, p1)

		// A1 sends a frame (a packet to B): it becomes the active one. B
		// receiving it proves the server has processed it.
		q := nonDisco(50)
		a1.send(t, b.pub, q)
		b.expectPacket(t, aPub, q)
		p2 := nonDisco(100)
		b.send(t, aPub, p2)
		a1.expectPacket(t, b.pub, p2)
		// A2 got nothing more than p1.
		a2.expectNone(t, 200*time.Millisecond, "packet while not active", isPacket)

		// Close A1: A2 survives and gets B's packets. B got packets from A,
		// but A is still connected, so B gets no peerGone.
		a1.c.Close()
		s.waitMetricEq(t, 0, "derp_current_dup_client_keys")
		s.waitMetricEq(t, 2, "derp_current_connections")
		p3 := nonDisco(100)
		b.send(t, aPub, p3)
		a2.expectPacket(t, b.pub, p3)
		b.expectNone(t, 300*time.Millisecond, "peerGone while a duplicate is still connected", isPeerGone)
		relayOK(t, a2, b)

		// When the last connection of the key goes, B gets peerGone.
		a2.c.Close()
		m := b.waitFor(t, 5*time.Second, "peerGone for A", isPeerGone)
		if pg := m.(derp.PeerGoneMessage); pg.Peer != aPub || pg.Reason != derp.PeerGoneReasonDisconnected {
			t.Fatalf("got %s; want PeerGone{%s, Disconnected}", describe(m), aPub.ShortString())
		}
	})
}

// TestNotePreferred: notePreferred(true) moves derp_current_home_connections
// to 1; closing the connection moves it back to 0.
func TestNotePreferred(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		s := startServer(t, kind, serverOpts{})
		a := s.newClient(t, "a")
		b := s.newClient(t, "b")
		s.waitMetricEq(t, 2, "derp_current_connections")
		s.waitMetricEq(t, 0, "derp_current_home_connections")
		a.c.NotePreferred(true)
		s.waitMetricEq(t, 1, "derp_current_home_connections")
		a.c.NotePreferred(false)
		s.waitMetricEq(t, 0, "derp_current_home_connections")
		a.c.NotePreferred(true)
		s.waitMetricEq(t, 1, "derp_current_home_connections")
		relayOK(t, a, b) // routing unaffected
		a.c.Close()
		s.waitMetricEq(t, 0, "derp_current_home_connections")
		s.waitMetricEq(t, 1, "derp_current_connections")
	})
}

package interop

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"tailscale.com/derp"
)

// TestStuckReceivers: one Tailscale client streams numbered packets to a
// healthy peer while sending 60 KB packets to three peers that finished
// their handshake and never read again. Neither server may stall the
// healthy stream for long: derper drops the stuck peers' packets from its
// 32-packet queues; Ferry pauses the sender for at most its backpressure
// budget (50 ms) and then drops them. The bound here, 1 s, is far below the
// 2 s write timeout that held the sender before the budget existed, and
// loose enough for a busy machine. Both cut the stuck peers off at the
// write timeout, and the sender stays connected.
func TestStuckReceivers(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		s := startServer(t, kind, serverOpts{})
		sender := s.newClient(t, "sender")
		healthy := s.newClient(t, "healthy")
		var stuck []*rawConn
		for range 3 {
			r := s.rawUpgrade(t)
			if tc, ok := r.nc.(*net.TCPConn); ok {
				tc.SetReadBuffer(4096)
			}
			r.handshake()
			defer r.nc.Close()
			stuck = append(stuck, r)
		}

		const run = 4500 * time.Millisecond
		big := nonDisco(60_000)
		sent := uint32(0)
		errc := make(chan error, 1)
		go func() {
			start := time.Now()
			for time.Since(start) < run {
				pkt := nonDisco(16)
				binary.BigEndian.PutUint32(pkt[4:], sent)
				if err := sender.c.Send(healthy.pub, pkt); err != nil {
					errc <- err
					return
				}
				sent++
				if sent%10 == 0 {
					for _, r := range stuck {
						if err := sender.c.Send(r.priv.Public(), big); err != nil {
							errc <- err
							return
						}
					}
				}
				time.Sleep(time.Millisecond)
			}
			errc <- nil
		}()

		var got uint32
		last := time.Now()
		var worst time.Duration
		deadline := time.Now().Add(run + 10*time.Second)
		done := false
		for !done && time.Now().Before(deadline) {
			select {
			case err := <-errc:
				if err != nil {
					t.Fatalf("sender: %v", err)
				}
				done = true
				continue
			default:
			}
			m, err := healthy.recv(100 * time.Millisecond)
			if err == errRecvTimeout {
				continue
			}
			if err != nil {
				t.Fatalf("healthy reader: %v", err)
			}
			if p, ok := m.(derp.ReceivedPacket); ok && len(p.Data) == 16 {
				now := time.Now()
				worst = max(worst, now.Sub(last))
				last = now
				got++
			}
		}
		// What the server still holds for the healthy peer arrives after.
		for {
			m, err := healthy.recv(300 * time.Millisecond)
			if err != nil {
				break
			}
			if p, ok := m.(derp.ReceivedPacket); ok && len(p.Data) == 16 {
				got++
			}
		}
		t.Logf("%s: %d of %d healthy packets, longest gap %v", kind, got, sent, worst)
		if worst >= time.Second {
			t.Errorf("%s: the healthy peer waited %v between packets", kind, worst)
		}
		// Ferry loses none of the healthy stream; derper's queue may drop a
		// few under load.
		if kind == kindDerper {
			if got*100 < sent*99 {
				t.Errorf("derper delivered %d of %d healthy packets", got, sent)
			}
		} else if got != sent {
			t.Errorf("ferry delivered %d of %d healthy packets", got, sent)
		}
		s.waitMetric(t, 10*time.Second, "stuck peers cut off", func(v float64) bool { return v >= 3 }, "derp_sclient_write_timeouts")
		sender.ping(t)
	})
}

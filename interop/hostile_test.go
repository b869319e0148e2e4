package interop

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"tailscale.com/derp"
	"tailscale.com/types/key"
)

// TestHostileInput: malformed or stalled connections are closed (or
// tolerated) without disturbing a healthy pair of clients.
func TestHostileInput(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		s := startServer(t, kind, serverOpts{})
		a := s.newClient(t, "a")
		b := s.newClient(t, "b")
		relayOK(t, a, b)
		healthy := func(t *testing.T) {
			t.Helper()
			relayOK(t, a, b)
			relayOK(t, b, a)
		}

		t.Run("wrong-first-frame", func(t *testing.T) {
			r := s.rawUpgrade(t)
			// A sendPacket instead of clientInfo.
			r.writeFrame(frameSendPacket, append(b.pub.AppendTo(nil), nonDisco(40)...))
			healthy(t)
			r.expectClosed(5 * time.Second)
			healthy(t)
		})

		t.Run("clientInfo-box-does-not-open", func(t *testing.T) {
			r := s.rawUpgrade(t)
			payload := r.priv.Public().AppendTo(nil)
			payload = append(payload, randBytes(24+16+32)...) // nonce, tag, "ciphertext"
			r.writeFrame(frameClientInfo, payload)
			healthy(t)
			r.expectClosed(5 * time.Second)
			healthy(t)
		})

		t.Run("clientInfo-sealed-to-wrong-key", func(t *testing.T) {
			r := s.rawUpgrade(t)
			box := r.priv.SealTo(key.NewNode().Public(), []byte(`{"version":2,"CanAckPings":false}`))
			r.writeFrame(frameClientInfo, append(r.priv.Public().AppendTo(nil), box...))
			r.expectClosed(5 * time.Second)
			healthy(t)
		})

		t.Run("sendPacket-too-long", func(t *testing.T) {
			r := s.rawUpgrade(t)
			r.handshake()
			r.pingPong()
			// 32-byte key + 65537 bytes: one more than the maximum packet.
			n := derp.KeyLen + derp.MaxPacketSize + 1
			hdr := make([]byte, 5)
			hdr[0] = frameSendPacket
			binary.BigEndian.PutUint32(hdr[1:], uint32(n))
			frame := append(hdr, b.pub.AppendTo(nil)...)
			frame = append(frame, nonDisco(derp.MaxPacketSize+1)...)
			// The server may hang up before reading it all; ignore errors.
			go r.writeRaw(frame)
			r.expectClosed(5 * time.Second)
			b.expectNone(t, 100*time.Millisecond, "the oversized packet", isPacket)
			healthy(t)
		})

		t.Run("unknown-frame-too-long", func(t *testing.T) {
			// An unknown frame announcing nearly 4 GiB: longer than any
			// frame may be (64 KiB + 32 bytes), so derper (since v1.104)
			// and Ferry close at once instead of skipping it.
			r := s.rawUpgrade(t)
			r.handshake()
			r.pingPong()
			hdr := make([]byte, 5)
			hdr[0] = 0x20
			binary.BigEndian.PutUint32(hdr[1:], 0xffff_fff0)
			if err := r.writeRaw(append(hdr, randBytes(1000)...)); err != nil {
				t.Fatal(err)
			}
			r.expectClosed(5 * time.Second)
			healthy(t)
		})

		t.Run("ping-too-short", func(t *testing.T) {
			r := s.rawUpgrade(t)
			r.handshake()
			r.writeFrame(framePing, randBytes(7))
			r.expectClosed(5 * time.Second)
			healthy(t)
		})

		t.Run("notePreferred-wrong-length", func(t *testing.T) {
			r := s.rawUpgrade(t)
			r.handshake()
			r.writeFrame(frameNotePreferred, []byte{1, 1})
			r.expectClosed(5 * time.Second)
			healthy(t)
		})

		t.Run("silent-sockets-do-not-block", func(t *testing.T) {
			// 1: TCP connected, never sends a byte.
			silent, err := net.Dial("tcp4", s.addr())
			if err != nil {
				t.Fatal(err)
			}
			defer silent.Close()
			// 2: half an HTTP request.
			half, err := net.Dial("tcp4", s.addr())
			if err != nil {
				t.Fatal(err)
			}
			defer half.Close()
			if _, err := io.WriteString(half, "GET /derp HTTP/1.1\r\nHost: "+s.addr()+"\r\nUpgr"); err != nil {
				t.Fatal(err)
			}
			// 3: upgraded, then silent instead of sending clientInfo.
			stalled := s.rawUpgrade(t)
			defer stalled.nc.Close()

			start := time.Now()
			c := s.newClient(t, "c")
			d := s.newClient(t, "d")
			relayOK(t, c, d)
			if el := time.Since(start); el > 2*time.Second {
				t.Fatalf("connecting and relaying took %v with silent sockets open; want < 2s", el)
			} else {
				t.Logf("fresh clients connected and relayed in %v with 3 stalled sockets open", el)
			}
			healthy(t)
		})

		t.Run("unknown-frame-skipped", func(t *testing.T) {
			r := s.rawUpgrade(t)
			r.handshake()
			r.writeFrame(0x20, randBytes(100))
			r.pingPong()
			// Also unknown types in the unassigned gap and a zero-length one.
			r.writeFrame(0x0b, randBytes(3))
			r.writeFrame(0xff, nil)
			// Ferry's version-2 relay-session frames and its mesh
			// extension's meshSession: a derper node of a mixed region
			// skips them like any unknown frame.
			r.writeFrame(0xf3, randBytes(150))
			r.writeFrame(0xf4, randBytes(73))
			r.writeFrame(0xf8, randBytes(98))
			r.pingPong()
			// The raw client still relays.
			pkt := nonDisco(77)
			r.writeFrame(frameSendPacket, append(b.pub.AppendTo(nil), pkt...))
			b.expectPacket(t, r.priv.Public(), pkt)
			healthy(t)
		})
	})
}

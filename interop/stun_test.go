package interop

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"tailscale.com/net/stun"
)

// TestSTUN: a Tailscale binding request gets the client's address back; a
// request that is not from a Tailscale client gets no answer.
func TestSTUN(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		s := startServer(t, kind, serverOpts{})
		pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		dst := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: s.stunPort}
		local := pc.LocalAddr().(*net.UDPAddr)

		// exchange sends req and returns the response for txid, if any.
		exchange := func(req []byte, txid stun.TxID, wait time.Duration) ([]byte, bool) {
			t.Helper()
			if _, err := pc.WriteToUDP(req, dst); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 2048)
			deadline := time.Now().Add(wait)
			for {
				pc.SetReadDeadline(deadline)
				n, from, err := pc.ReadFromUDP(buf)
				if errors.Is(err, os.ErrDeadlineExceeded) {
					return nil, false
				}
				if err != nil {
					t.Fatal(err)
				}
				if from.Port != s.stunPort {
					continue
				}
				b := buf[:n]
				if len(b) >= 20 && string(b[8:20]) == string(txid[:]) {
					return append([]byte(nil), b...), true
				}
				t.Logf("ignoring unrelated datagram %x", b)
			}
		}

		valid := func(t *testing.T) {
			t.Helper()
			// UDP on loopback doesn't drop, but allow a retry or two.
			for attempt := range 3 {
				txid := stun.NewTxID()
				resp, ok := exchange(stun.Request(txid), txid, time.Second)
				if !ok {
					t.Logf("attempt %d: no STUN response", attempt)
					continue
				}
				gotTx, addr, err := stun.ParseResponse(resp)
				if err != nil {
					t.Fatalf("ParseResponse(%x): %v", resp, err)
				}
				if gotTx != txid {
					t.Fatalf("response txid %x; want %x", gotTx, txid)
				}
				want := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(local.Port))
				if got := netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port()); got != want {
					t.Fatalf("STUN says we are %v; want %v", addr, want)
				}
				t.Logf("STUN response (%d bytes): %x", len(resp), resp)
				return
			}
			t.Fatalf("no STUN response from %v after 3 attempts", dst)
		}

		t.Run("tailnode", valid)

		t.Run("not-tailscale", func(t *testing.T) {
			// Plain RFC 5389 binding request: header only, no attributes.
			txid := stun.NewTxID()
			plain := make([]byte, 20)
			binary.BigEndian.PutUint16(plain[0:], 0x0001)
			binary.BigEndian.PutUint32(plain[4:], 0x2112A442)
			copy(plain[8:], txid[:])
			if resp, ok := exchange(plain, txid, 500*time.Millisecond); ok {
				t.Errorf("answered a binding request without SOFTWARE=tailnode: %x", resp)
			}

			// Same shape as Tailscale's, but SOFTWARE "notanode" (valid
			// FINGERPRINT).
			txid = stun.NewTxID()
			req := stun.Request(txid)
			copy(req[24:32], "notanode")
			binary.BigEndian.PutUint32(req[36:], crc32.ChecksumIEEE(req[:32])^0x5354554e)
			if resp, ok := exchange(req, txid, 500*time.Millisecond); ok {
				t.Errorf("answered a binding request with SOFTWARE=notanode: %x", resp)
			}

			// Tailscale's request with a broken FINGERPRINT.
			txid = stun.NewTxID()
			req = stun.Request(txid)
			req[39] ^= 0xff
			if resp, ok := exchange(req, txid, 500*time.Millisecond); ok {
				t.Errorf("answered a binding request with a bad FINGERPRINT: %x", resp)
			}

			// Garbage.
			txid = stun.NewTxID()
			if resp, ok := exchange(append(randBytes(8), txid[:]...), txid, 300*time.Millisecond); ok {
				t.Errorf("answered garbage: %x", resp)
			}

			valid(t) // still serving
		})
	})
}

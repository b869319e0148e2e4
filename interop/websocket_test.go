//go:build ts_debug_websockets

package interop

// DERP over WebSocket with Tailscale's own client (derphttp built with
// ts_debug_websockets, TS_DEBUG_DERP_WS_CLIENT=1 while a WebSocket client
// connects), against ferry and derper: relaying between WebSocket and raw
// clients both ways, a hundred WebSocket clients at once, a text message
// and a bad frame refused. scripts/test.d/20-interop.sh runs it.

import (
	"bufio"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// wsEnv serialises connecting, since the client reads the switch from the
// environment when it dials.
var wsEnv sync.Mutex

func (s *server) newWSClient(t *testing.T, name string) *dclient {
	t.Helper()
	wsEnv.Lock()
	defer wsEnv.Unlock()
	os.Setenv("TS_DEBUG_DERP_WS_CLIENT", "1")
	defer os.Unsetenv("TS_DEBUG_DERP_WS_CLIENT")
	return s.newClient(t, name)
}

func (s *server) newRawClient(t *testing.T, name string) *dclient {
	t.Helper()
	wsEnv.Lock()
	defer wsEnv.Unlock()
	return s.newClient(t, name)
}

func TestWebSocket(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		s := startServer(t, kind, serverOpts{})
		before := s.mustMetric(t, "derp_websocket_accepts")
		w := s.newWSClient(t, "ws")
		r := s.newRawClient(t, "raw")
		relayOK(t, w, r)
		relayOK(t, r, w)
		w.ping(t)

		var many []*dclient
		for i := range 100 {
			many = append(many, s.newWSClient(t, fmt.Sprintf("ws%d", i)))
		}
		for _, c := range many {
			relayOK(t, r, c)
		}
		relayOK(t, many[99], many[0])
		if got := s.mustMetric(t, "derp_websocket_accepts") - before; got != 101 {
			t.Errorf("derp_websocket_accepts rose by %v; want 101", got)
		}

		// A text message, and a frame the client forgot to mask, end the
		// connection; the others go on.
		for _, bad := range [][]byte{
			maskedFrame(0x1, []byte("hello")),
			{0x82, 0x02, 'h', 'i'},
		} {
			c, br := wsHandshake(t, s)
			c.Write(bad)
			// derper's library waits up to 5 s for the client's answer to
			// its close frame before closing the socket.
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			// Whatever the server sent before (serverKey), the stream
			// must end.
			if _, err := io.Copy(io.Discard, br); err != nil && !strings.Contains(err.Error(), "reset") {
				t.Errorf("%s: after %x: %v; want the connection closed", kind, bad[:2], err)
			}
			c.Close()
		}
		relayOK(t, w, r)

		// A 60,000-byte packet: ferry carries it in messages of at most
		// 16 KiB each way. derper writes it as one message, which
		// Tailscale's own WebSocket client refuses (its library reads at
		// most 32 KiB per message): that client is cut off.
		big := nonDisco(60_000)
		r.send(t, w.pub, big)
		if kind == kindDerper {
			w.expectClosed(t, 5*time.Second)
			return
		}
		w.expectPacket(t, r.pub, big)
		w.send(t, r.pub, big)
		r.expectPacket(t, w.pub, big)
	})
}

// wsHandshake opens a raw WebSocket to /derp with the derp subprotocol and
// checks the 101.
func wsHandshake(t *testing.T, s *server) (interface {
	Write([]byte) (int, error)
	Close() error
	SetReadDeadline(time.Time) error
}, *bufio.Reader) {
	t.Helper()
	c := s.dial(t)
	var nonce [16]byte
	rand.Read(nonce[:])
	key := base64.StdEncoding.EncodeToString(nonce[:])
	fmt.Fprintf(c, "GET /derp HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Protocol: derp\r\n\r\n", key)
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 101 {
		t.Fatalf("WebSocket upgrade: %s", res.Status)
	}
	h := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	if got, want := res.Header.Get("Sec-WebSocket-Accept"), base64.StdEncoding.EncodeToString(h[:]); got != want {
		t.Errorf("Sec-WebSocket-Accept %q; want %q", got, want)
	}
	if p := res.Header.Get("Sec-WebSocket-Protocol"); p != "derp" {
		t.Errorf("Sec-WebSocket-Protocol %q; want derp", p)
	}
	return c, br
}

func maskedFrame(opcode byte, payload []byte) []byte {
	mask := []byte{1, 2, 3, 4}
	out := []byte{0x80 | opcode, 0x80 | byte(len(payload))}
	out = append(out, mask...)
	for i, b := range payload {
		out = append(out, b^mask[i%4])
	}
	return out
}

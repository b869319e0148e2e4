package interop

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go4.org/mem"
	"tailscale.com/types/key"
)

// Frame types (protocol reference §6).
const (
	frameServerKey     = 0x01
	frameClientInfo    = 0x02
	frameServerInfo    = 0x03
	frameSendPacket    = 0x04
	frameRecvPacket    = 0x05
	frameKeepAlive     = 0x06
	frameNotePreferred = 0x07
	framePing          = 0x12
	framePong          = 0x13
)

const serverKeyMagic = "DERP\xf0\x9f\x94\x91"

// rawConn is a hand-driven DERP connection, for tests that need to send
// what derphttp never would.
type rawConn struct {
	t  testing.TB
	nc net.Conn
	br *bufio.Reader

	resp      *http.Response // the 101 response (classic upgrade only)
	hdrKey    key.NodePublic // from the Derp-Public-Key response header
	serverKey key.NodePublic // from the serverKey frame
	priv      key.NodePrivate
}

// upgradeRequest is the HTTP request a Go client sends for /derp (§4.2).
func upgradeRequest(host string, fastStart bool) string {
	var b strings.Builder
	b.WriteString("GET /derp HTTP/1.1\r\n")
	fmt.Fprintf(&b, "Host: %s\r\n", host)
	b.WriteString("User-Agent: Go-http-client/1.1\r\n")
	b.WriteString("Connection: Upgrade\r\n")
	if fastStart {
		b.WriteString("Derp-Fast-Start: 1\r\n")
	}
	b.WriteString("Upgrade: DERP\r\n\r\n")
	return b.String()
}

func (s *server) hostHeader() string {
	if s.tls {
		return fmt.Sprintf("localhost:%d", s.port)
	}
	return s.addr()
}

// rawUpgrade dials the server, performs the classic HTTP upgrade, checks the
// 101 response and reads the serverKey frame.
func (s *server) rawUpgrade(t testing.TB) *rawConn {
	t.Helper()
	nc := s.dial(t)
	r := &rawConn{t: t, nc: nc, br: bufio.NewReader(nc), priv: key.NewNode()}
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(nc, upgradeRequest(s.hostHeader(), false)); err != nil {
		t.Fatalf("writing upgrade request: %v", err)
	}
	resp, err := http.ReadResponse(r.br, nil)
	if err != nil {
		t.Fatalf("reading upgrade response: %v", err)
	}
	r.resp = resp
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade response status = %s; want 101", resp.Status)
	}
	hk := resp.Header.Get("Derp-Public-Key")
	if len(hk) != 64 || strings.ToLower(hk) != hk {
		t.Fatalf("Derp-Public-Key header = %q; want 64 lowercase hex digits", hk)
	}
	r.hdrKey, err = key.ParseNodePublicUntyped(mem.S(hk))
	if err != nil {
		t.Fatalf("parsing Derp-Public-Key %q: %v", hk, err)
	}
	r.readServerKey()
	nc.SetDeadline(time.Time{})
	return r
}

// readServerKey reads the first DERP frame, which must be serverKey.
func (r *rawConn) readServerKey() {
	r.t.Helper()
	typ, payload, err := r.readFrame(5 * time.Second)
	if err != nil {
		r.t.Fatalf("reading serverKey frame: %v", err)
	}
	if typ != frameServerKey {
		r.t.Fatalf("first frame type = %#x; want serverKey (0x01)", typ)
	}
	if len(payload) < 40 || string(payload[:8]) != serverKeyMagic {
		r.t.Fatalf("bad serverKey frame payload %x", payload)
	}
	r.serverKey = key.NodePublicFromRaw32(mem.B(payload[8:40]))
}

// writeFrame writes one frame; errors are returned, not fatal, since hostile
// tests expect the server to hang up mid-write.
func (r *rawConn) writeFrame(typ byte, payload []byte) error {
	buf := make([]byte, 5, 5+len(payload))
	buf[0] = typ
	binary.BigEndian.PutUint32(buf[1:], uint32(len(payload)))
	buf = append(buf, payload...)
	r.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := r.nc.Write(buf)
	return err
}

// writeRaw writes bytes as they are.
func (r *rawConn) writeRaw(b []byte) error {
	r.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := r.nc.Write(b)
	return err
}

// readFrame reads one frame (payload capped at 1 MiB, like Go's client).
func (r *rawConn) readFrame(timeout time.Duration) (byte, []byte, error) {
	r.nc.SetReadDeadline(time.Now().Add(timeout))
	defer r.nc.SetReadDeadline(time.Time{})
	var hdr [5]byte
	if _, err := io.ReadFull(r.br, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > 1<<20 {
		return 0, nil, fmt.Errorf("frame type %#x length %d exceeds 1 MiB (bytes %x)", hdr[0], n, hdr)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r.br, payload); err != nil {
		return 0, nil, err
	}
	return hdr[0], payload, nil
}

// clientInfoFrame builds a clientInfo payload sealed to the server key.
func (r *rawConn) clientInfoPayload(info string) []byte {
	box := r.priv.SealTo(r.serverKey, []byte(info))
	return append(r.priv.Public().AppendTo(nil), box...)
}

// handshake sends a valid clientInfo and checks the serverInfo reply.
func (r *rawConn) handshake() {
	r.t.Helper()
	if err := r.writeFrame(frameClientInfo, r.clientInfoPayload(`{"version":2,"CanAckPings":false}`)); err != nil {
		r.t.Fatalf("writing clientInfo: %v", err)
	}
	r.expectServerInfo()
}

// expectServerInfo reads a frame that must be a serverInfo we can open.
func (r *rawConn) expectServerInfo() {
	r.t.Helper()
	typ, payload, err := r.readFrame(5 * time.Second)
	if err != nil {
		r.t.Fatalf("reading serverInfo: %v", err)
	}
	if typ != frameServerInfo {
		r.t.Fatalf("frame after clientInfo has type %#x; want serverInfo (0x03)", typ)
	}
	msg, ok := r.priv.OpenFrom(r.serverKey, payload)
	if !ok {
		r.t.Fatalf("cannot open serverInfo box (%d bytes)", len(payload))
	}
	var info struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(msg, &info); err != nil {
		r.t.Fatalf("serverInfo JSON %q: %v", msg, err)
	}
	if info.Version != 2 {
		r.t.Fatalf("serverInfo %s: version %d; want 2", msg, info.Version)
	}
}

// expectFrame reads frames until one of type want arrives (skipping
// keepAlives) and returns its payload.
func (r *rawConn) expectFrame(want byte, timeout time.Duration) []byte {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			r.t.Fatalf("timed out waiting for frame type %#x", want)
		}
		typ, payload, err := r.readFrame(left)
		if err != nil {
			r.t.Fatalf("waiting for frame type %#x: %v", want, err)
		}
		if typ == want {
			return payload
		}
		if typ != frameKeepAlive {
			r.t.Fatalf("got frame type %#x (%d bytes) while waiting for %#x", typ, len(payload), want)
		}
	}
}

// expectClosed reads until the server closes the connection (EOF or reset)
// and fails if it is still open after timeout.
func (r *rawConn) expectClosed(timeout time.Duration) {
	r.t.Helper()
	expectConnClosed(r.t, r.nc, r.br, timeout)
}

func expectConnClosed(t testing.TB, nc net.Conn, rd io.Reader, timeout time.Duration) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(timeout))
	n, err := io.Copy(io.Discard, rd)
	if err == nil {
		t.Logf("server closed the connection (EOF after %d more bytes)", n)
		return
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection still open %v later (read %d bytes); want the server to close it", timeout, n)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open %v later (read %d bytes); want the server to close it", timeout, n)
	}
	t.Logf("server closed the connection (%v after %d more bytes)", err, n)
}

// pingPong sends a raw ping and expects the matching pong.
func (r *rawConn) pingPong() {
	r.t.Helper()
	data := randBytes(8)
	if err := r.writeFrame(framePing, data); err != nil {
		r.t.Fatalf("writing ping: %v", err)
	}
	got := r.expectFrame(framePong, 5*time.Second)
	if !bytes.Equal(got, data) {
		r.t.Fatalf("pong payload %x; want %x", got, data)
	}
}

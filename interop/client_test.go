package interop

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"tailscale.com/derp"
	"tailscale.com/derp/derphttp"
	"tailscale.com/net/netmon"
	"tailscale.com/types/key"
)

// dclient is a Tailscale derphttp.Client plus a goroutine that reads every
// message it receives into a channel. The reader stops at the first receive
// error, so the client never silently reconnects behind a test's back.
type dclient struct {
	name string
	priv key.NodePrivate
	pub  key.NodePublic
	c    *derphttp.Client
	logs *lockedBuffer

	msgs chan derp.ReceivedMessage
	done chan struct{} // closed when the reader has stopped
	stop chan struct{} // closed at test cleanup

	mu  sync.Mutex
	err error // the receive error that stopped the reader
}

// connectTimeout bounds a client's Connect (TestKernelTLS raises it for
// the emulated kernel test VM).
var connectTimeout = 10 * time.Second

type clientOption func(*derphttp.Client)

// withMeshKey makes the client present the server's mesh key.
func withMeshKey(k key.DERPMesh) clientOption {
	return func(c *derphttp.Client) { c.MeshKey = k }
}

// withWatch makes the client send watchConns right after the handshake.
func withWatch() clientOption {
	return func(c *derphttp.Client) { c.WatchConnectionChanges = true }
}

// newClient connects a client with a fresh key and waits for serverInfo.
func (s *server) newClient(t testing.TB, name string, opts ...clientOption) *dclient {
	t.Helper()
	return s.newClientWithKey(t, name, key.NewNode(), opts...)
}

// newClientWithKey connects a client with the given key, waits for
// serverInfo, and checks that serverInfo is the first message received.
func (s *server) newClientWithKey(t testing.TB, name string, priv key.NodePrivate, opts ...clientOption) *dclient {
	t.Helper()
	d := s.dialClient(t, name, priv, opts...)
	m, err := d.recv(5 * time.Second)
	if err != nil {
		t.Fatalf("%s: waiting for serverInfo: %v", name, err)
	}
	if _, ok := m.(derp.ServerInfoMessage); !ok {
		t.Fatalf("%s: first message is %T, want derp.ServerInfoMessage", name, m)
	}
	return d
}

// dialClient connects a client (Connect returns once clientInfo is written;
// it does not wait for serverInfo) and starts its reader.
func (s *server) dialClient(t testing.TB, name string, priv key.NodePrivate, opts ...clientOption) *dclient {
	t.Helper()
	d := &dclient{
		name: name,
		priv: priv,
		pub:  priv.Public(),
		logs: new(lockedBuffer),
		msgs: make(chan derp.ReceivedMessage, 4096),
		done: make(chan struct{}),
		stop: make(chan struct{}),
	}
	c, err := derphttp.NewClient(priv, s.derpURL(), d.logs.Logf, netmon.NewStatic())
	if err != nil {
		t.Fatal(err)
	}
	if s.tls {
		c.TLSConfig = &tls.Config{RootCAs: s.certPool}
	}
	for _, o := range opts {
		o(c)
	}
	d.c = c
	t.Cleanup(func() {
		close(d.stop)
		c.Close()
		if t.Failed() {
			if l := d.logs.String(); l != "" {
				t.Logf("client %s log:\n%s", name, l)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	if err := c.Connect(ctx); err != nil {
		t.Fatalf("%s: Connect to %s: %v", name, s.derpURL(), err)
	}
	go d.readLoop()
	return d
}

func (d *dclient) readLoop() {
	defer close(d.done)
	for {
		m, err := d.c.Recv()
		if err != nil {
			d.mu.Lock()
			d.err = err
			d.mu.Unlock()
			d.logs.Logf("reader stopped: %v", err)
			return
		}
		if p, ok := m.(derp.ReceivedPacket); ok {
			// Data aliases the client's buffer; copy it.
			p.Data = bytes.Clone(p.Data)
			m = p
		}
		select {
		case d.msgs <- m:
		case <-d.stop:
			return
		}
	}
}

func (d *dclient) recvErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

var errRecvTimeout = errors.New("timeout waiting for a message")

// recv returns the next message, or an error if none arrives within timeout
// or the connection failed.
func (d *dclient) recv(timeout time.Duration) (derp.ReceivedMessage, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case m := <-d.msgs:
		return m, nil
	default:
	}
	select {
	case m := <-d.msgs:
		return m, nil
	case <-d.done:
		// Drain anything read before the error.
		select {
		case m := <-d.msgs:
			return m, nil
		default:
		}
		return nil, fmt.Errorf("connection closed: %w", d.recvErr())
	case <-timer.C:
		return nil, errRecvTimeout
	}
}

// waitFor returns the first message matching pred within timeout, skipping
// (and logging) others. It fails the test on timeout or connection error.
func (d *dclient) waitFor(t testing.TB, timeout time.Duration, desc string, pred func(derp.ReceivedMessage) bool) derp.ReceivedMessage {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("%s: timed out after %v waiting for %s", d.name, timeout, desc)
		}
		m, err := d.recv(left)
		if err != nil {
			t.Fatalf("%s: waiting for %s: %v", d.name, desc, err)
		}
		if pred(m) {
			return m
		}
		if _, ok := m.(derp.KeepAliveMessage); !ok {
			t.Logf("%s: (while waiting for %s) skipping %s", d.name, desc, describe(m))
		}
	}
}

// expectNone fails if a message matching pred arrives within window, or if
// the connection fails. Non-matching messages are consumed and logged.
func (d *dclient) expectNone(t testing.TB, window time.Duration, desc string, pred func(derp.ReceivedMessage) bool) {
	t.Helper()
	deadline := time.Now().Add(window)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		m, err := d.recv(left)
		if errors.Is(err, errRecvTimeout) {
			return
		}
		if err != nil {
			t.Fatalf("%s: while checking for absence of %s: %v", d.name, desc, err)
		}
		if pred(m) {
			t.Fatalf("%s: got unexpected %s: %s", d.name, desc, describe(m))
		}
		if _, ok := m.(derp.KeepAliveMessage); !ok {
			t.Logf("%s: (while checking for absence of %s) skipping %s", d.name, desc, describe(m))
		}
	}
}

// expectClosed waits until the server closes the connection, failing if it
// is still open after timeout. Messages received meanwhile are discarded.
func (d *dclient) expectClosed(t testing.TB, timeout time.Duration) {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case <-d.done:
			t.Logf("%s: connection closed as expected: %v", d.name, d.recvErr())
			return
		case m := <-d.msgs:
			if _, ok := m.(derp.KeepAliveMessage); !ok {
				t.Logf("%s: (while waiting for close) skipping %s", d.name, describe(m))
			}
		case <-timer.C:
			t.Fatalf("%s: connection still open %v later; want the server to close it", d.name, timeout)
		}
	}
}

// send sends pkt to dst, failing the test on a local error.
func (d *dclient) send(t testing.TB, dst key.NodePublic, pkt []byte) {
	t.Helper()
	if err := d.c.Send(dst, pkt); err != nil {
		t.Fatalf("%s: Send: %v", d.name, err)
	}
}

// expectPacket waits for a packet from src with exactly the given payload.
func (d *dclient) expectPacket(t testing.TB, src key.NodePublic, want []byte) {
	t.Helper()
	m := d.waitFor(t, 5*time.Second, fmt.Sprintf("%d-byte packet", len(want)), isPacket)
	p := m.(derp.ReceivedPacket)
	if p.Source != src {
		t.Fatalf("%s: packet source = %v; want %v", d.name, p.Source.ShortString(), src.ShortString())
	}
	if !bytes.Equal(p.Data, want) {
		t.Fatalf("%s: packet payload mismatch: got %d bytes (%s), want %d bytes (%s)",
			d.name, len(p.Data), head(p.Data), len(want), head(want))
	}
}

// ping does a full ping/pong round trip (a barrier: the server has read
// everything this client sent before it).
func (d *dclient) ping(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := d.c.Ping(ctx); err != nil {
		t.Fatalf("%s: ping: %v", d.name, err)
	}
}

func isPacket(m derp.ReceivedMessage) bool {
	_, ok := m.(derp.ReceivedPacket)
	return ok
}

func isPeerGone(m derp.ReceivedMessage) bool {
	_, ok := m.(derp.PeerGoneMessage)
	return ok
}

func describe(m derp.ReceivedMessage) string {
	switch m := m.(type) {
	case derp.ReceivedPacket:
		return fmt.Sprintf("ReceivedPacket{from %s, %d bytes}", m.Source.ShortString(), len(m.Data))
	case derp.PeerGoneMessage:
		return fmt.Sprintf("PeerGone{%s, reason %d}", m.Peer.ShortString(), m.Reason)
	case derp.PeerPresentMessage:
		return fmt.Sprintf("PeerPresent{%s, %v, flags %#x}", m.Key.ShortString(), m.IPPort, m.Flags)
	default:
		return fmt.Sprintf("%T %+v", m, m)
	}
}

func head(b []byte) string {
	if len(b) > 16 {
		return fmt.Sprintf("%x…", b[:16])
	}
	return fmt.Sprintf("%x", b)
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// nonDisco returns n random bytes that do not start with the disco magic.
func nonDisco(n int) []byte {
	b := randBytes(n)
	if n > 0 {
		b[0] = 0x00
	}
	return b
}

// discoMagic is "TS💬", the 6-byte prefix of disco messages.
const discoMagic = "TS\xf0\x9f\x92\xac"

// discoPacket returns an n-byte packet (n >= 6) that starts with the disco
// magic; servers treat it as disco iff n >= 62.
func discoPacket(n int) []byte {
	b := randBytes(n)
	copy(b, discoMagic)
	return b
}

// relayOK checks that a sends a fresh packet to b within a few seconds.
func relayOK(t testing.TB, a, b *dclient) {
	t.Helper()
	pkt := nonDisco(100)
	a.send(t, b.pub, pkt)
	b.expectPacket(t, a.pub, pkt)
}

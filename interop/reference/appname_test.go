package reference

// Application names (clientInfo AppName) as tailscale.com v1.104.7's own
// derphttp client sends them, against ferry and derper v1.104.7 in the
// same run: a valid name is accepted, a name --disallow-app-names lists is
// refused before serverInfo (mesh peers exempt), and a watcher's
// peerPresent carries each client's name, in its first dump and live.

import (
	"bytes"
	"context"
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

// client is a derphttp client whose received messages a goroutine reads
// into a channel until the first receive error (no silent reconnect).
type client struct {
	name    string
	appName string
	pub     key.NodePublic
	c       *derphttp.Client
	msgs    chan derp.ReceivedMessage
	done    chan struct{}
	logs    *syncBuffer

	mu  sync.Mutex
	err error
}

// dial connects a client with the given app name; mesh presents the
// server's mesh key and subscribes to its connection changes.
func (s *server) dial(t *testing.T, name, appName string, mesh bool) *client {
	t.Helper()
	priv := key.NewNode()
	d := &client{name: name, appName: appName, pub: priv.Public(), msgs: make(chan derp.ReceivedMessage, 1024), done: make(chan struct{}), logs: new(syncBuffer)}
	logf := func(format string, args ...any) { fmt.Fprintf(d.logs, format+"\n", args...) }
	c, err := derphttp.NewClient(priv, s.url, logf, netmon.NewStatic())
	if err != nil {
		t.Fatal(err)
	}
	if s.ca != nil {
		c.TLSConfig = clientConfig(s.ca)
	}
	c.AppName = appName
	if mesh {
		c.MeshKey = s.meshKey
		c.WatchConnectionChanges = true
	}
	d.c = c
	stop := make(chan struct{})
	t.Cleanup(func() {
		close(stop)
		c.Close()
		if t.Failed() {
			t.Logf("client %s log:\n%s", name, d.logs.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Connect returns once clientInfo is written; a refusal shows as the
	// first receive failing.
	if err := c.Connect(ctx); err != nil {
		t.Fatalf("%s: Connect to %s: %v", name, s.url, err)
	}
	go func() {
		defer close(d.done)
		for {
			m, err := c.Recv()
			if err != nil {
				d.mu.Lock()
				d.err = err
				d.mu.Unlock()
				return
			}
			if p, ok := m.(derp.ReceivedPacket); ok {
				p.Data = bytes.Clone(p.Data) // aliases the client's buffer
				m = p
			}
			select {
			case d.msgs <- m:
			case <-stop:
				return
			}
		}
	}()
	return d
}

var errClosed = errors.New("connection closed")

// next is the next message other than a keepAlive, or an error when none
// comes within the deadline or the connection ended.
func (d *client) next(deadline time.Time) (derp.ReceivedMessage, error) {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		select {
		case m := <-d.msgs:
			if _, ok := m.(derp.KeepAliveMessage); ok {
				continue
			}
			return m, nil
		case <-d.done:
			select {
			case m := <-d.msgs:
				return m, nil
			default:
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			return nil, fmt.Errorf("%w: %v", errClosed, d.err)
		case <-timer.C:
			return nil, fmt.Errorf("nothing within the deadline")
		}
	}
}

// accepted: the first message is serverInfo.
func (d *client) accepted(t *testing.T) {
	t.Helper()
	m, err := d.next(time.Now().Add(5 * time.Second))
	if err != nil {
		t.Fatalf("%s: want serverInfo, got %v", d.name, err)
	}
	if _, ok := m.(derp.ServerInfoMessage); !ok {
		t.Fatalf("%s: first message %T, want serverInfo", d.name, m)
	}
}

// refused: the server closes the connection without sending serverInfo
// (or anything else).
func (d *client) refused(t *testing.T) {
	t.Helper()
	m, err := d.next(time.Now().Add(5 * time.Second))
	if err == nil {
		t.Fatalf("%s: got %T; want the connection closed before serverInfo", d.name, m)
	}
	if !errors.Is(err, errClosed) {
		t.Fatalf("%s: %v; want the connection closed", d.name, err)
	}
}

// present waits for the peerPresent of key k, failing on any peerPresent
// of a key in never first.
func (d *client) present(t *testing.T, k key.NodePublic, never ...key.NodePublic) derp.PeerPresentMessage {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; i < 100; i++ {
		m, err := d.next(deadline)
		if err != nil {
			t.Fatalf("%s: waiting for peerPresent(%s): %v", d.name, k.ShortString(), err)
		}
		pp, ok := m.(derp.PeerPresentMessage)
		if !ok {
			continue
		}
		for _, n := range never {
			if pp.Key == n {
				t.Fatalf("%s: peerPresent(%s, app %q) for a refused client", d.name, n.ShortString(), pp.AppName)
			}
		}
		if pp.Key == k {
			return pp
		}
	}
	t.Fatalf("%s: 100 messages without peerPresent(%s)", d.name, k.ShortString())
	return derp.PeerPresentMessage{}
}

// relayed: a packet from a reaches b with a's key.
func relayed(t *testing.T, a, b *client) {
	t.Helper()
	pkt := []byte("ferry interop: app names " + a.name)
	if err := a.c.Send(b.pub, pkt); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; i < 100; i++ {
		m, err := b.next(deadline)
		if err != nil {
			t.Fatalf("%s: waiting for a packet from %s: %v", b.name, a.name, err)
		}
		if p, ok := m.(derp.ReceivedPacket); ok && bytes.Equal(p.Data, pkt) {
			if p.Source != a.pub {
				t.Fatalf("%s: packet from %s has source %s", b.name, a.name, p.Source.ShortString())
			}
			return
		}
	}
	t.Fatalf("%s: 100 messages without the packet from %s", b.name, a.name)
}

func TestAppNames(t *testing.T) {
	const (
		named    = "ferry-interop/1.0 (test)" // every printable kind: letters, digits, space, punctuation
		refused  = "refused-app"
		longest  = "0123456789abcdef0123456789ABCDEF" // derp.MaxAppNameLen bytes
		listFlag = refused + ",other-app"
	)
	if len(longest) != derp.MaxAppNameLen || !derp.ValidAppName(longest) || !derp.ValidAppName(named) {
		t.Fatalf("test names: %q must be the longest valid name (%d bytes), %q valid", longest, derp.MaxAppNameLen, named)
	}
	eachServer(t, func(t *testing.T, kind string) {
		s := startServer(t, kind, serverOpts{extra: []string{"--disallow-app-names", listFlag}})

		a := s.dial(t, "a", named, false)
		a.accepted(t)
		// The first dump of a new watcher names a client that was there.
		w := s.dial(t, "watcher", "", true)
		w.accepted(t)
		if pp := w.present(t, a.pub); pp.AppName != named || pp.Flags != derp.PeerPresentIsRegular {
			t.Errorf("watcher's first dump: a with app %q flags %#x; want %q, regular", pp.AppName, pp.Flags, named)
		}

		// A listed name is refused, and never announced.
		r := s.dial(t, "refused", refused, false)
		r.refused(t)
		// Live announcements: the longest name, and no name at all.
		b := s.dial(t, "b", longest, false)
		b.accepted(t)
		if pp := w.present(t, b.pub, r.pub); pp.AppName != longest {
			t.Errorf("watcher: b announced with app %q; want %q", pp.AppName, longest)
		}
		c := s.dial(t, "c", "", false)
		c.accepted(t)
		if pp := w.present(t, c.pub, r.pub); pp.AppName != "" {
			t.Errorf("watcher: c (no name) announced with app %q", pp.AppName)
		}
		relayed(t, a, b)
		relayed(t, b, c)

		// Mesh peers are exempt from the list, and their name is carried.
		m := s.dial(t, "mesh", refused, true)
		m.accepted(t)
		if pp := w.present(t, m.pub, r.pub); pp.AppName != refused || pp.Flags != derp.PeerPresentIsMeshPeer {
			t.Errorf("watcher: mesh peer announced with app %q flags %#x; want %q, mesh peer", pp.AppName, pp.Flags, refused)
		}
	})
}

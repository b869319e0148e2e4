package interop

// Client admission (--verify-client-url, --verify-client-url-fail-open)
// against an admission controller run by the test: both servers admit and
// refuse the same clients for every kind of answer, and a slow controller
// delays only the clients waiting for it.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tailscale.com/derp"
	"tailscale.com/types/key"
)

// controller is an admission controller: it allows the keys in allow, or
// answers as mode says.
type controller struct {
	srv   *httptest.Server
	mu    sync.Mutex
	allow map[key.NodePublic]bool
	mode  string // "list", "all", "500", "garbage", "slow", "cut", "stall", "whole-cut"
	seen  []map[string]string
	hits  atomic.Int64
}

func newController(t *testing.T) *controller {
	c := &controller{allow: map[key.NodePublic]bool{}, mode: "list"}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.hits.Add(1)
		var req map[string]string
		if r.Method != "POST" || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, "bad request", 400)
			return
		}
		c.mu.Lock()
		c.seen = append(c.seen, req)
		mode := c.mode
		var k key.NodePublic
		allowed := k.UnmarshalText([]byte(req["NodePublic"])) == nil && c.allow[k]
		c.mu.Unlock()
		switch mode {
		case "500":
			http.Error(w, "controller broken", 500)
		case "all":
			fmt.Fprintf(w, `{"Allow": true}`)
		case "garbage":
			w.Write([]byte("<html>not json</html>"))
		case "slow":
			// Longer than the servers' 5 s limit, unless the caller gives up.
			select {
			case <-r.Context().Done():
			case <-time.After(8 * time.Second):
			}
			fmt.Fprintf(w, `{"Allow": true}`)
		case "cut", "stall", "whole-cut":
			// A 200 promising more body than it sends.
			part := `{"Allow": tr`
			if mode == "whole-cut" {
				part = `{"Allow": true}`
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(200)
			w.Write([]byte(part))
			w.(http.Flusher).Flush()
			if mode == "stall" {
				// Past the servers' 5 s limit, unless the caller gives up.
				select {
				case <-r.Context().Done():
				case <-time.After(8 * time.Second):
				}
			}
			// Close the connection with the body unfinished.
			panic(http.ErrAbortHandler)
		default:
			fmt.Fprintf(w, `{"Allow": %v}`, allowed)
		}
	}))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *controller) set(mode string) {
	c.mu.Lock()
	c.mode = mode
	c.mu.Unlock()
}

func (c *controller) permit(k key.NodePublic) {
	c.mu.Lock()
	c.allow[k] = true
	c.mu.Unlock()
}

// sourceOf returns the Source the controller was sent for key k.
func (c *controller) sourceOf(k key.NodePublic) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, req := range c.seen {
		if req["NodePublic"] == k.String() {
			return req["Source"]
		}
	}
	return ""
}

// refusedClient connects and expects the server to close the connection
// without sending serverInfo. Connect (in dialClient) has by then read the
// HTTP 101 and the serverKey frame — derphttp fails Connect without them —
// so a refusal is pinned, for Ferry and derper alike, to come after 101 and
// serverKey, as a close instead of serverInfo.
func (s *server) refusedClient(t *testing.T, name string, within time.Duration) {
	t.Helper()
	d := s.dialClient(t, name, key.NewNode())
	m, err := d.recv(within)
	if err == nil {
		t.Fatalf("%s: got %s; want the connection closed without serverInfo", name, describe(m))
	}
	if errors.Is(err, errRecvTimeout) {
		t.Fatalf("%s: still waiting after %v; want it refused", name, within)
	}
}

func TestAdmissionController(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		c := newController(t)
		s := startServer(t, kind, serverOpts{mesh: true, args: []string{"--verify-client-url", c.srv.URL}})

		alice, bob := key.NewNode(), key.NewNode()
		c.permit(alice.Public())
		c.permit(bob.Public())
		a := s.newClientWithKey(t, "alice", alice)
		b := s.newClientWithKey(t, "bob", bob)
		relayOK(t, a, b)
		relayOK(t, b, a)
		s.refusedClient(t, "stranger", 5*time.Second)
		c.mu.Lock()
		if got := c.seen[0]["Source"]; got != "127.0.0.1" {
			t.Errorf("controller saw Source %q; want 127.0.0.1", got)
		}
		c.mu.Unlock()

		for _, mode := range []string{"500", "garbage"} {
			c.set(mode)
			s.refusedClient(t, "answer-"+mode, 5*time.Second)
		}

		// A slow controller: the client waiting for it is admitted once
		// the 5 s limit passes (fail-open, the default); meanwhile alice and
		// bob relay without a gap and a mesh peer (which skips admission)
		// connects at once.
		c.set("slow")
		stop := make(chan struct{})
		gaps := make(chan time.Duration, 1)
		go func() { gaps <- relayGaps(t, a, b, stop) }()
		slowDone := make(chan time.Duration, 1)
		asked := c.hits.Load()
		go func() {
			start := time.Now()
			d := s.dialClient(t, "slow-admit", key.NewNode())
			if _, err := d.recv(10 * time.Second); err != nil {
				t.Errorf("slow-admit: %v; want admitted (fail-open) after the controller's timeout", err)
			}
			slowDone <- time.Since(start)
		}()
		waitHitsAbove(t, c, asked) // the slow client's question has arrived
		meshStart := time.Now()
		s.newClient(t, "mesh", withMeshKey(s.meshKey))
		if d := time.Since(meshStart); d > 2*time.Second {
			t.Errorf("mesh peer took %v to connect while the controller was slow", d)
		}
		took := <-slowDone
		close(stop)
		if gap := <-gaps; gap > time.Second {
			t.Errorf("alice to bob: a %v gap while a client waited for admission", gap)
		}
		if took < 4*time.Second {
			t.Errorf("slow-admit admitted after %v; want it to have waited for the controller's 5 s limit", took)
		}
	})
}

// A 200 whose body breaks off or stalls before its JSON verdict is whole
// is an answer, not an unreachable controller: both servers refuse the
// client although fail-open is on (the default). A verdict that is whole
// counts however the body ends: both admit.
func TestAdmissionBrokenAnswer(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		c := newController(t)
		s := startServer(t, kind, serverOpts{args: []string{"--verify-client-url", c.srv.URL}})
		c.set("cut")
		s.refusedClient(t, "answer-cut", 5*time.Second)
		c.set("whole-cut")
		s.newClient(t, "whole-answer-cut")
		c.set("stall")
		start := time.Now()
		s.refusedClient(t, "answer-stalled", 10*time.Second)
		if took := time.Since(start); took < 4*time.Second {
			t.Errorf("answer-stalled refused after %v; want it to have waited for the 5 s limit", took)
		}
	})
}

func TestAdmissionFailClosed(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		dead := func() string {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			return "http://" + l.Addr().String() + "/verify"
		}()
		open := startServer(t, kind, serverOpts{args: []string{"--verify-client-url", dead}})
		open.newClient(t, "fail-open")
		closed := startServer(t, kind, serverOpts{args: []string{"--verify-client-url", dead, "--verify-client-url-fail-open=false"}})
		closed.refusedClient(t, "fail-closed", 5*time.Second)
	})
}

// waitHitsAbove waits (bounded) until the controller has been asked more
// than n times.
func waitHitsAbove(t *testing.T, c *controller, n int64) {
	t.Helper()
	want := n + 1
	deadline := time.Now().Add(5 * time.Second)
	for c.hits.Load() < want {
		if time.Now().After(deadline) {
			t.Fatal("the controller was not asked within 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// relayGaps sends a packet from a to b every 10 ms until stop, and returns
// the longest time b went without one.
func relayGaps(t *testing.T, a, b *dclient, stop chan struct{}) time.Duration {
	done := make(chan time.Duration, 1)
	go func() {
		last, worst := time.Now(), time.Duration(0)
		for {
			m, err := b.recv(3 * time.Second)
			now := time.Now()
			if err != nil {
				select {
				case <-stop:
				default:
					t.Errorf("bob: %v", err)
				}
				done <- worst
				return
			}
			if _, ok := m.(derp.ReceivedPacket); ok {
				worst = max(worst, now.Sub(last))
				last = now
			}
			select {
			case <-stop:
				done <- worst
				return
			default:
			}
		}
	}()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return <-done
		case <-tick.C:
			if err := a.c.Send(b.pub, nonDisco(64)); err != nil {
				t.Errorf("alice: %v", err)
				return <-done
			}
		}
	}
}

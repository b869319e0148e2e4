package interop

// The real client address behind a proxy: haproxy (Debian's package) in
// front of the server, in TCP mode with the PROXY protocol (v1 and v2) and
// in HTTP mode with X-Forwarded-For. Clients dial the proxy from 127.0.0.2;
// the proxy reaches the server from 127.0.0.4; a mesh watcher connects
// directly from 127.0.0.3 and reads the address peerPresent reports.
//
// Ferry, given --proxy-protocol and --trusted-proxies 127.0.0.4, reports the
// client's own address. derper has neither feature: behind the same proxy
// (without a PROXY header, which it cannot read) it reports the proxy's
// address. Both are pinned here.

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tailscale.com/derp"
	"tailscale.com/derp/derphttp"
	"tailscale.com/net/netx"
	"tailscale.com/types/key"
)

const (
	clientIP  = "127.0.0.2" // where clients dial the proxy from
	watcherIP = "127.0.0.3" // where the mesh watcher dials the server from
	proxyIP   = "127.0.0.4" // where the proxy dials the server from
)

// haproxy is one running haproxy in front of a server.
type haproxy struct {
	ports map[string]int // frontend name -> port on 127.0.0.1
}

// startHaproxy runs haproxy with one frontend per entry of backends (name ->
// the `server` line's options after the address, and the frontend's mode).
func startHaproxy(t *testing.T, target int, frontends []haFrontend) *haproxy {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("haproxy is not installed (.ci/setup.d installs it): %v", err)
		}
		t.Skipf("SKIP: haproxy is not installed (apt-get install haproxy): %v", err)
	}
	h := &haproxy{ports: map[string]int{}}
	var cfg strings.Builder
	// One log line per connection on stderr (shown when a test fails): its
	// termination state says which side ended it and when.
	cfg.WriteString("global\n  maxconn 1000\n  log stderr format raw local0 info\n" +
		"defaults\n  log global\n  option tcplog\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n")
	for _, f := range frontends {
		port := freePort(t, "tcp")
		h.ports[f.name] = port
		fmt.Fprintf(&cfg, "frontend fe_%s\n  mode %s\n  bind 127.0.0.1:%d\n", f.name, f.mode, port)
		if f.mode == "http" {
			cfg.WriteString("  option forwardfor\n")
		}
		fmt.Fprintf(&cfg, "  default_backend be_%s\nbackend be_%s\n  mode %s\n  server s1 127.0.0.1:%d source %s %s\n",
			f.name, f.name, f.mode, target, proxyIP, f.server)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	logs := new(lockedBuffer)
	cmd := exec.Command(bin, "-db", "-f", path)
	cmd.Stdout, cmd.Stderr = logs, logs
	setProcAttrs(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("haproxy config:\n%s\nhaproxy output:\n%s", cfg.String(), logs.String())
		}
	})
	for _, port := range h.ports {
		deadline := time.Now().Add(10 * time.Second)
		for {
			c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
			if err == nil {
				c.Close()
				break
			}
			select {
			case <-exited:
				t.Fatalf("haproxy exited: %s", logs.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("haproxy frontend on port %d not listening after 10s: %v\n%s", port, err, logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return h
}

type haFrontend struct {
	name   string
	mode   string // "tcp" or "http"
	server string // options of the backend's server line
}

// viaProxy makes a client dial the proxy's frontend `port` from clientIP,
// whatever address its DERP URL names.
func viaProxy(port int) clientOption {
	return withDialer(func(ctx context.Context, network, _ string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(clientIP)}}
		return d.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", port))
	})
}

// fromIP makes a client dial the server itself from the given source address.
func fromIP(ip string) clientOption {
	return withDialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return d.DialContext(ctx, network, addr)
	})
}

func withDialer(f netx.DialFunc) clientOption {
	return func(c *derphttp.Client) { c.SetURLDialer(f) }
}

// presentAddr waits for the watcher's peerPresent about k and returns the
// address it reports.
func presentAddr(t *testing.T, w *dclient, k key.NodePublic) netip.AddrPort {
	t.Helper()
	m := w.waitFor(t, 5*time.Second, "peerPresent for "+k.ShortString(), func(m derp.ReceivedMessage) bool {
		pp, ok := m.(derp.PeerPresentMessage)
		return ok && pp.Key == k
	})
	return m.(derp.PeerPresentMessage).IPPort
}

func TestClientAddressBehindProxy(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		// An admission controller that admits everyone and records the
		// Source each server tells it.
		ctl := newController(t)
		ctl.set("all")
		opts := serverOpts{mesh: true, args: []string{"--verify-client-url", ctl.srv.URL}}
		if kind == kindFerry {
			opts.ferryArgs = []string{"--proxy-protocol", "--trusted-proxies", proxyIP}
		}
		s := startServer(t, kind, opts)
		fronts := []haFrontend{{name: "plain", mode: "tcp"}}
		if kind == kindFerry {
			fronts = append(fronts,
				haFrontend{name: "v1", mode: "tcp", server: "send-proxy"},
				haFrontend{name: "v2", mode: "tcp", server: "send-proxy-v2"})
		}
		h := startHaproxy(t, s.port, fronts)
		w := s.newClient(t, "watcher", withMeshKey(s.meshKey), withWatch(), fromIP(watcherIP))

		if kind == kindDerper {
			// derper reads no PROXY header: through a TCP proxy it sees the
			// proxy's address.
			b := s.newClient(t, "b", viaProxy(h.ports["plain"]))
			got := presentAddr(t, w, b.pub)
			if got.Addr().String() != proxyIP {
				t.Errorf("derper behind a TCP proxy reports %v; want the proxy's %s", got, proxyIP)
			}
			if src := ctl.sourceOf(b.pub); src != proxyIP {
				t.Errorf("derper told the admission controller Source %q; want the proxy's %s", src, proxyIP)
			}
			return
		}

		for _, v := range []string{"v1", "v2"} {
			b := s.newClient(t, "b-"+v, viaProxy(h.ports[v]))
			local, err := b.c.LocalAddr()
			if err != nil {
				t.Fatal(err)
			}
			if got := presentAddr(t, w, b.pub); got != local {
				t.Errorf("PROXY %s: peerPresent reports %v; want the client's own %v", v, got, local)
			}
			if src := ctl.sourceOf(b.pub); src != clientIP {
				t.Errorf("PROXY %s: admission controller was sent Source %q; want the client's %s", v, src, clientIP)
			}
			c := s.newClient(t, "c-"+v, viaProxy(h.ports[v]))
			relayOK(t, b, c)
			relayOK(t, c, b)
		}

		// A trusted proxy that sends no header is refused: its connection
		// cannot say whose it is.
		refused(t, s, fmt.Sprintf("127.0.0.1:%d", h.ports["plain"]), "", nil)
		// An untrusted peer that sends a header is refused.
		hdr := []byte("PROXY TCP4 198.51.100.1 127.0.0.1 1234 443\r\n")
		refused(t, s, s.addr(), watcherIP, hdr)
		// The refusals are logged with their reasons.
		waitLog(t, s, "no PROXY header")
		waitLog(t, s, "PROXY header from an untrusted peer")
		// Everyone else is unaffected.
		x := s.newClient(t, "x", fromIP(watcherIP))
		y := s.newClient(t, "y", viaProxy(h.ports["v2"]))
		relayOK(t, x, y)
	})
}

func TestClientAddressFromForwardedFor(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		opts := serverOpts{mesh: true}
		if kind == kindFerry {
			opts.ferryArgs = []string{"--trusted-proxies", proxyIP}
		}
		s := startServer(t, kind, opts)
		h := startHaproxy(t, s.port, []haFrontend{{name: "http", mode: "http"}})
		w := s.newClient(t, "watcher", withMeshKey(s.meshKey), withWatch(), fromIP(watcherIP))
		b := s.newClient(t, "b", viaProxy(h.ports["http"]))
		got := presentAddr(t, w, b.pub)
		want := clientIP
		if kind == kindDerper {
			want = proxyIP // derper ignores X-Forwarded-For
		}
		if got.Addr().String() != want {
			t.Errorf("%s behind an HTTP proxy reports %v; want %s", kind, got, want)
		}
		// The header is believed from trusted proxies only: a client dialing
		// directly from 127.0.0.3 (untrusted) that claims another address
		// is reported as itself, by both servers.
		z := s.newClient(t, "z", withDialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(watcherIP)}}
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &headerInjector{Conn: c, header: "X-Forwarded-For: 198.51.100.9"}, nil
		}))
		zLocal, err := z.c.LocalAddr()
		if err != nil {
			t.Fatal(err)
		}
		if got := presentAddr(t, w, z.pub); got != zLocal {
			t.Errorf("%s: untrusted client claiming X-Forwarded-For 198.51.100.9 reported as %v; want its own %v", kind, got, zLocal)
		}
	})
}

// headerInjector adds one header line to the HTTP request head its
// connection writes first.
type headerInjector struct {
	net.Conn
	header string
	done   bool
}

func (h *headerInjector) Write(p []byte) (int, error) {
	if h.done {
		return h.Conn.Write(p)
	}
	i := strings.Index(string(p), "\r\n")
	if i < 0 {
		return h.Conn.Write(p)
	}
	h.done = true
	out := string(p[:i+2]) + h.header + "\r\n" + string(p[i+2:])
	if _, err := h.Conn.Write([]byte(out)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// refused dials addr (from src when set), writes first, then a DERP
// upgrade, and expects the connection closed without a 101.
func refused(t *testing.T, s *server, addr, src string, first []byte) {
	t.Helper()
	conn := dialFrom(t, addr, src)
	defer conn.Close()
	conn.Write(first)
	fmt.Fprintf(conn, "GET /derp HTTP/1.1\r\nHost: localhost\r\nUpgrade: DERP\r\nConnection: Upgrade\r\n\r\n")
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	n, err := conn.Read(buf)
	if err == nil || strings.Contains(string(buf[:n]), "101") {
		t.Fatalf("connection to %s from %q with first bytes %q: read %q, %v; want it closed without a response", addr, src, first, buf[:n], err)
	}
}

func dialFrom(t *testing.T, addr, src string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitLog waits (bounded) for the server's log to contain substr.
func waitLog(t *testing.T, s *server, substr string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(s.logs.String(), substr) {
		if time.Now().After(deadline) {
			t.Fatalf("server log lacks %q after 5s", substr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

package interop

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"ferry.invalid/interop/derpserver"
	"ferry.invalid/interop/testcert"
	"tailscale.com/types/key"
)

// serverOpts selects how a server under test is started.
type serverOpts struct {
	tls  bool // serve TLS (manual cert for "localhost") instead of plain HTTP
	mesh bool // configure a mesh pre-shared key
	// ferryArgs are added to ferry's command line only (flags derper lacks).
	ferryArgs []string
	// args are added to both servers' command lines.
	args []string
	// port fixes the listener's port (0: a free one), so that a region's
	// nodes can name each other before they start, and a restart keeps it.
	port int
	// ca signs the server's certificate (nil: self-signed).
	ca *testcert.CA
	// meshHex is the mesh key to use with mesh (empty: a random one).
	meshHex string
	// env is added to the process's environment.
	env []string
}

// server is one running DERP server process (derper or ferry).
type server struct {
	kind     string
	tls      bool
	port     int // TCP port of the DERP/HTTP(S) listener on 127.0.0.1
	stunPort int // UDP port of the STUN listener on 127.0.0.1
	dir      string
	args     []string

	certFile string         // PEM file of the self-signed cert (TLS only)
	certPool *x509.CertPool // pool holding that cert (TLS only)

	meshKey key.DERPMesh // zero unless opts.mesh
	meshHex string
	pskFile string

	httpc *http.Client
	logs  *lockedBuffer
	cmd   *exec.Cmd
	exitc chan struct{} // closed when the process has exited

	stopOnce sync.Once
}

// lockedBuffer is a goroutine-safe bytes.Buffer used to capture logs.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) Logf(format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	fmt.Fprintf(&b.buf, "%s ", time.Now().Format("15:04:05.000"))
	fmt.Fprintf(&b.buf, format, args...)
	if !strings.HasSuffix(format, "\n") {
		b.buf.WriteByte('\n')
	}
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var (
	portsMu   sync.Mutex
	portsUsed = map[string]bool{}
)

// freePort returns a currently unused loopback port for network ("tcp" or
// "udp"), never the same one twice within this process.
func freePort(t testing.TB, network string) int {
	t.Helper()
	for range 50 {
		var port int
		switch network {
		case "tcp":
			ln, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			port = ln.Addr().(*net.TCPAddr).Port
			ln.Close()
		case "udp":
			pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			port = pc.LocalAddr().(*net.UDPAddr).Port
			pc.Close()
		default:
			t.Fatalf("bad network %q", network)
		}
		k := network + "/" + strconv.Itoa(port)
		portsMu.Lock()
		used := portsUsed[k]
		portsUsed[k] = true
		portsMu.Unlock()
		if !used {
			return port
		}
	}
	t.Fatalf("could not find a free %s port", network)
	return 0
}

// startServer starts a server of the given kind and waits until it answers
// GET /derp/probe. It is stopped (with its children) when t ends, and its
// output is logged if t failed.
func startServer(t *testing.T, kind string, opts serverOpts) *server {
	t.Helper()
	dir := t.TempDir()
	var lastErr error
	for attempt := range 3 {
		s, err := tryStartServer(t, kind, opts, dir, attempt)
		if err == nil {
			return s
		}
		lastErr = err
		// Only retry if the process died because a port was taken (a race
		// with another test); anything else will not do better on a retry.
		if !errors.Is(err, derpserver.ErrExited) || !strings.Contains(strings.ToLower(err.Error()), "in use") {
			break
		}
	}
	t.Fatalf("starting %s: %v", kind, lastErr)
	return nil
}

// readyTimeout bounds a server's start (TestKernelTLS raises it for the
// emulated kernel test VM).
var readyTimeout = 15 * time.Second

func tryStartServer(t *testing.T, kind string, opts serverOpts, dir string, attempt int) (*server, error) {
	port := opts.port
	if port == 0 {
		port = freePort(t, "tcp")
	}
	s := &server{
		kind:     kind,
		tls:      opts.tls,
		port:     port,
		stunPort: freePort(t, "udp"),
		dir:      dir,
		logs:     new(lockedBuffer),
		exitc:    make(chan struct{}),
	}
	// Identical flags for both servers, but for plain ferry: dev mode
	// (plain HTTP, a random key; -a overrides its default address).
	// derper's --dev forces :3340, so it runs plain on our own port.
	flags := derpserver.Flags{
		Addr:     fmt.Sprintf("127.0.0.1:%d", s.port),
		STUNPort: s.stunPort,
		KeyFile:  filepath.Join(dir, "derper.key"),
		TLS:      opts.tls,
		CertDir:  dir,
		Hostname: "localhost",
		Dev:      !opts.tls && kind == kindFerry,
	}

	var bin string
	switch kind {
	case kindDerper:
		bin = derperBin
	case kindFerry:
		if ferryBinErr != nil {
			t.Fatal(ferryBinErr)
		}
		bin = ferryBin
	default:
		t.Fatalf("unknown server kind %q", kind)
	}

	if opts.tls {
		if err := s.writeCert(opts.ca); err != nil {
			return nil, err
		}
	}
	if opts.mesh {
		s.meshHex = opts.meshHex
		if s.meshHex == "" {
			var raw [32]byte
			rand.Read(raw[:])
			s.meshHex = hex.EncodeToString(raw[:])
		}
		mk, err := key.ParseDERPMesh(s.meshHex)
		if err != nil {
			return nil, err
		}
		s.meshKey = mk
		s.pskFile = filepath.Join(dir, "mesh.key")
		if err := os.WriteFile(s.pskFile, []byte(s.meshHex+"\n"), 0o600); err != nil {
			return nil, err
		}
		flags.Extra = append(flags.Extra, "--mesh-psk-file", s.pskFile)
	}

	flags.Extra = append(flags.Extra, opts.args...)
	if kind == kindFerry {
		// FERRY_ARGS adds flags to every ferry command line, so the suite
		// can run once per I/O back end ("--io epoll", "--io uring").
		flags.Extra = append(flags.Extra, strings.Fields(os.Getenv("FERRY_ARGS"))...)
		flags.Extra = append(flags.Extra, opts.ferryArgs...)
	}
	s.args = flags.Args()

	s.httpc = s.newHTTPClient()

	launch := func(argv []string) (*server, error) {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Dir = dir
		cmd.Stdout = s.logs
		cmd.Stderr = s.logs
		cmd.Env = append(append(os.Environ(), "RUST_BACKTRACE=1"), opts.env...)
		setProcAttrs(cmd)
		fmt.Fprintf(s.logs, "=== attempt %d: %s %s\n", attempt, bin, strings.Join(s.args, " "))
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		s.cmd = cmd
		go func() {
			err := cmd.Wait()
			fmt.Fprintf(s.logs, "=== process exited: %v\n", err)
			close(s.exitc)
		}()
		t.Cleanup(s.stop)
		return s, nil
	}
	probe := derpserver.Probe{Client: s.httpc, BaseURL: s.baseURL(), Timeout: readyTimeout}
	if _, err := derpserver.Start(bin, flags, launch, probe); err != nil {
		s.stop()
		if errors.Is(err, derpserver.ErrExited) {
			err = fmt.Errorf("%w; output:\n%s", err, s.logs.String())
		}
		return nil, err
	}
	if err := s.checkBackend(kind, opts); err != nil {
		s.stop()
		return nil, err
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s server (%s %s) output:\n%s", kind, filepath.Base(bin), strings.Join(s.args, " "), s.logs.String())
		}
	})
	t.Logf("started %s: %s %s", kind, filepath.Base(bin), strings.Join(s.args, " "))
	return s, nil
}

// Exited reports whether the server's process has ended, and how
// (derpserver.Process).
func (s *server) Exited() (bool, error) {
	select {
	case <-s.exitc:
		return true, fmt.Errorf("status: %v", s.cmd.ProcessState)
	default:
		return false, nil
	}
}

// stop terminates the server's process group: SIGTERM, then SIGKILL after a
// grace period.
func (s *server) stop() {
	s.stopOnce.Do(s.doStop)
}

func (s *server) doStop() {
	defer s.httpc.CloseIdleConnections()
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	// Signal the group only while its leader is known to be alive (not yet
	// reaped), so the process group ID cannot have been reused.
	select {
	case <-s.exitc:
	default:
		killGroup(s.cmd, syscall.SIGTERM)
		select {
		case <-s.exitc:
		case <-time.After(3 * time.Second):
			killGroup(s.cmd, syscall.SIGKILL)
			select {
			case <-s.exitc:
			case <-time.After(5 * time.Second):
			}
		}
	}
}

// checkBackend: with FERRY_EXPECT_BACKEND set (scripts/test.d/20-interop.sh
// sets it for the `--io auto` pass where io_uring runs), a ferry whose
// command line does not choose a back end itself must have logged that it
// runs on that one, so a pass meant for io_uring cannot quietly test epoll.
func (s *server) checkBackend(kind string, opts serverOpts) error {
	want := os.Getenv("FERRY_EXPECT_BACKEND")
	if kind != kindFerry || want == "" {
		return nil
	}
	for _, a := range opts.ferryArgs {
		if a == "--io" || strings.HasPrefix(a, "--io=") {
			return nil
		}
	}
	if !strings.Contains(s.logs.String(), `backend="`+want+`"`) {
		return fmt.Errorf("ferry did not report the %s back end (FERRY_EXPECT_BACKEND); output:\n%s", want, s.logs.String())
	}
	return nil
}

// addr is the listener's host:port.
func (s *server) addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// baseURL is the HTTP(S) base URL. TLS uses the name "localhost", which the
// certificate is issued for (and which derper requires as SNI).
func (s *server) baseURL() string {
	if s.tls {
		return fmt.Sprintf("https://localhost:%d", s.port)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", s.port)
}

// derpURL is the URL given to derphttp.NewClient.
func (s *server) derpURL() string { return s.baseURL() + "/derp" }

// tlsConfig is the client TLS config that trusts this server's cert.
func (s *server) tlsConfig() *tls.Config {
	return &tls.Config{RootCAs: s.certPool, ServerName: "localhost"}
}

func (s *server) newHTTPClient() *http.Client {
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		// Always dial the loopback listener, whatever "localhost" resolves to.
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "tcp4", s.addr())
		},
		ForceAttemptHTTP2:   false,
		TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConns:        4,
		IdleConnTimeout:     5 * time.Second,
	}
	if s.tls {
		tr.TLSClientConfig = s.tlsConfig()
	}
	return &http.Client{
		Transport: tr,
		Timeout:   10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// dial opens a raw connection to the listener: TCP, plus a TLS handshake
// (SNI localhost, no ALPN) on TLS servers.
func (s *server) dial(t testing.TB) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp4", s.addr(), 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", s.addr(), err)
	}
	t.Cleanup(func() { c.Close() })
	if !s.tls {
		return c
	}
	tc := tls.Client(c, s.tlsConfig())
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err != nil {
		t.Fatalf("TLS handshake with %s: %v", s.addr(), err)
	}
	c.SetDeadline(time.Time{})
	return tc
}

// writeCert writes the server's certificate for "localhost" and 127.0.0.1,
// signed by ca (self-signed when ca is nil), as DIR/localhost.crt and
// DIR/localhost.key, and the pool a client trusts it with.
func (s *server) writeCert(ca *testcert.CA) error {
	trust, err := testcert.WriteLocalhost(s.dir, ca)
	if err != nil {
		return err
	}
	s.certFile = filepath.Join(s.dir, "localhost.crt")
	s.certPool = x509.NewCertPool()
	s.certPool.AddCert(trust)
	return nil
}

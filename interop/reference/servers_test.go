package reference

// Starting the two servers under test on loopback: derper (../bin/derper,
// which must be built from this module's tailscale.com) and ferry
// (FERRY_BIN, else the workspace's target/release or target/debug).

import (
	"bytes"
	"context"
	"crypto/rand"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"ferry.invalid/interop/testcert"
	"tailscale.com/types/key"
)

const (
	kindDerper = "derper"
	kindFerry  = "ferry"
)

// binaries are the servers' executables, or why one cannot be used (each
// test of that server fails with it: nothing here skips).
var binaries = map[string]binary{}

type binary struct {
	path string
	err  error
}

func TestMain(m *testing.M) {
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	p, err := locateDerper(filepath.Join(wd, "..", "bin", "derper"))
	binaries[kindDerper] = binary{p, err}
	p, err = locateFerry(wd)
	binaries[kindFerry] = binary{p, err}
	os.Exit(m.Run())
}

// depVersion is the version of module path in a binary's build info (its
// main module: a tool's, or a dependency).
func depVersion(bi *debug.BuildInfo, path string) string {
	if bi.Main.Path == path {
		return bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == path {
			return d.Version
		}
	}
	return ""
}

// locateDerper checks that the derper at p was built from the
// tailscale.com this test is built with.
func locateDerper(p string) (string, error) {
	own, ok := debug.ReadBuildInfo()
	if !ok {
		return "", fmt.Errorf("the test binary has no build info")
	}
	want := depVersion(own, "tailscale.com")
	bi, err := buildinfo.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("derper at %s: %v (build it: bash .ci/setup.d/10-derper.sh)", p, err)
	}
	if got := depVersion(bi, "tailscale.com"); got != want {
		return "", fmt.Errorf("derper at %s is tailscale.com %q, want %s (rebuild it: bash .ci/setup.d/10-derper.sh)", p, got, want)
	}
	return p, nil
}

// locateFerry finds the ferry binary: $FERRY_BIN, else the workspace's
// target/release/ferry, else target/debug/ferry.
func locateFerry(wd string) (string, error) {
	if v := os.Getenv("FERRY_BIN"); v != "" {
		if st, err := os.Stat(v); err != nil || st.IsDir() {
			return "", fmt.Errorf("FERRY_BIN=%q is not a file (%v)", v, err)
		}
		return filepath.Abs(v)
	}
	var tried []string
	for _, profile := range []string{"release", "debug"} {
		p := filepath.Join(wd, "..", "..", "target", profile, "ferry")
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
		tried = append(tried, p)
	}
	return "", fmt.Errorf("no ferry binary (FERRY_BIN unset, none of %s): cargo build -p ferry", strings.Join(tried, ", "))
}

// eachServer runs fn as one parallel subtest per server.
func eachServer(t *testing.T, fn func(t *testing.T, kind string)) {
	for _, kind := range []string{kindDerper, kindFerry} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			if err := binaries[kind].err; err != nil {
				t.Fatal(err)
			}
			fn(t, kind)
		})
	}
}

// syncBuffer collects a process's output from two pipes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// server is a running derper or ferry with a mesh key.
type server struct {
	kind    string
	port    int
	url     string
	meshKey key.DERPMesh
	ca      *testcert.CA // nil: plain HTTP
}

// serverOpts: how to start a server (the zero value: plain HTTP on a free
// port with a random mesh key).
type serverOpts struct {
	extra   []string     // more flags (both servers take derper's)
	ca      *testcert.CA // serve TLS for localhost with a certificate ca signs
	port    int          // 0: a free one
	meshHex string       // "": a random mesh key
	env     []string     // added to the process's environment
}

// freePort is a TCP or UDP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T, network string) int {
	t.Helper()
	if network == "udp" {
		c, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).Port
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startServer runs kind on a loopback port with a mesh key, waits until
// GET /derp/probe answers, and stops it when t ends (its output is logged
// if t failed).
func startServer(t *testing.T, kind string, opts serverOpts) *server {
	t.Helper()
	dir := t.TempDir()
	meshHex := opts.meshHex
	if meshHex == "" {
		var raw [32]byte
		if _, err := rand.Read(raw[:]); err != nil {
			t.Fatal(err)
		}
		meshHex = hex.EncodeToString(raw[:])
	}
	meshKey, err := key.ParseDERPMesh(meshHex)
	if err != nil {
		t.Fatal(err)
	}
	psk := filepath.Join(dir, "mesh.key")
	if err := os.WriteFile(psk, []byte(meshHex+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port := opts.port
	if port == 0 {
		port = freePort(t, "tcp")
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	stun := strconv.Itoa(freePort(t, "udp"))
	var args []string
	switch {
	case opts.ca != nil:
		if _, err := testcert.WriteLocalhost(dir, opts.ca); err != nil {
			t.Fatal(err)
		}
		args = []string{"-a", addr, "--certmode", "manual", "--certdir", dir, "--hostname", "localhost",
			"--http-port", "-1", "--stun-port", stun, "-c", filepath.Join(dir, "derper.key")}
	case kind == kindFerry:
		// --dev: plain HTTP and a random key (-a overrides its address).
		args = []string{"--dev", "-a", addr, "--stun-port", stun}
	default:
		args = []string{"-a", addr, "--http-port", "-1", "--stun-port", stun, "-c", filepath.Join(dir, "derper.key")}
	}
	if kind == kindFerry {
		args = append(args, strings.Fields(os.Getenv("FERRY_ARGS"))...)
	}
	args = append(args, "--mesh-psk-file", psk)
	args = append(args, opts.extra...)

	out := new(syncBuffer)
	cmd := exec.Command(binaries[kind].path, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(os.Environ(), opts.env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			t.Logf("%s %s output:\n%s", kind, strings.Join(args, " "), out.String())
		}
	})

	s := &server{kind: kind, port: port, meshKey: meshKey, ca: opts.ca}
	s.url = s.baseURL() + "/derp"
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-exited:
			t.Fatalf("%s exited before it was ready:\n%s", kind, out.String())
		default:
		}
		err := probe(s.httpClient(), s.baseURL()+"/derp/probe")
		if err == nil {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after 15 s: %v", kind, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// baseURL is the server's scheme, host and port: TLS is for "localhost".
func (s *server) baseURL() string {
	if s.ca != nil {
		return "https://localhost:" + strconv.Itoa(s.port)
	}
	return "http://127.0.0.1:" + strconv.Itoa(s.port)
}

// httpClient dials the server's loopback listener, whatever "localhost"
// resolves to, and trusts its certificate.
func (s *server) httpClient() *http.Client {
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "tcp4", "127.0.0.1:"+strconv.Itoa(s.port))
		},
		DisableKeepAlives: true,
	}
	if s.ca != nil {
		tr.TLSClientConfig = clientConfig(s.ca)
	}
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

// probe asks once, for at most a second, whether the server is ready.
func probe(c *http.Client, url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

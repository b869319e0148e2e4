// Package derpserver starts a DERP server under test, derper or ferry
// (which takes derper's flags), for both Go suites: the interop tests
// (this module's root package) and the end-to-end bed (e2e/testbed). The
// caller runs the process where it needs it (in this network namespace
// or another, pinned or not); this package owns what the two servers
// share: their command line and when they are ready.
package derpserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// Flags is a DERP server's command line, the same for derper and ferry.
type Flags struct {
	// Addr is the listener, host:port or :port (-a).
	Addr string
	// STUNPort is the STUN listener's UDP port (--stun-port).
	STUNPort int
	// KeyFile keeps the server's node key across restarts (-c).
	KeyFile string
	// TLS serves HTTPS with the certificate for Hostname in CertDir
	// (Hostname.crt, Hostname.key: --certmode manual). Without it the
	// server speaks plain HTTP: any port but 443 without --certmode does,
	// for both servers.
	TLS      bool
	CertDir  string
	Hostname string
	// Dev is ferry's --dev instead of the plain-HTTP flags (plain HTTP, a
	// random key; ferry only: derper's -dev forces :3340). Not with TLS.
	Dev bool
	// Extra flags come last (mesh keys, ferry's own flags).
	Extra []string
}

// Args is the command line without the program's name.
func (f Flags) Args() []string {
	stun := strconv.Itoa(f.STUNPort)
	var args []string
	switch {
	case f.TLS:
		args = []string{
			"-a", f.Addr,
			"--certmode", "manual", "--certdir", f.CertDir, "--hostname", f.Hostname,
			"--http-port", "-1",
			"--stun-port", stun,
			"-c", f.KeyFile,
		}
	case f.Dev:
		args = []string{"--dev", "-a", f.Addr, "--stun-port", stun}
	default:
		args = []string{"-a", f.Addr, "--http-port", "-1", "--stun-port", stun, "-c", f.KeyFile}
	}
	return append(args, f.Extra...)
}

// Process is a started server, as the caller started it.
type Process interface {
	// Exited reports whether the process has ended, and how.
	Exited() (bool, error)
}

// Probe says how to ask a server whether it is ready.
type Probe struct {
	// Client reaches the server (its transport dials the listener and
	// trusts its certificate).
	Client *http.Client
	// BaseURL is the server's scheme and host: GET BaseURL/derp/probe.
	BaseURL string
	// Timeout bounds the whole wait.
	Timeout time.Duration
}

// ErrExited: the server's process ended before it was ready.
var ErrExited = errors.New("server process exited before becoming ready")

// Start runs bin with the flags through launch, which starts the process
// where the caller wants it, and waits until the server answers GET
// /derp/probe with 200, its process ends (ErrExited), or the probe's
// timeout passes. The process is returned with any error: stopping it
// is the caller's.
func Start[P Process](bin string, f Flags, launch func(argv []string) (P, error), probe Probe) (P, error) {
	p, err := launch(append([]string{bin}, f.Args()...))
	if err != nil {
		return p, err
	}
	return p, WaitReady(p, probe)
}

// WaitReady polls GET /derp/probe until it answers 200, the process ends
// (ErrExited), or the probe's timeout passes.
func WaitReady(p Process, probe Probe) error {
	deadline := time.Now().Add(probe.Timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		if done, err := p.Exited(); done {
			return fmt.Errorf("%w (%v)", ErrExited, err)
		}
		lastErr = probeOnce(probe)
		if lastErr == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %v: %v", probe.Timeout, lastErr)
}

// probeOnce asks once, for at most a second.
func probeOnce(probe Probe) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", probe.BaseURL+"/derp/probe", nil)
	if err != nil {
		return err
	}
	resp, err := probe.Client.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /derp/probe: %s", resp.Status)
	}
	return nil
}

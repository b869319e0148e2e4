package derpserver

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestArgsAreDerpersCommandLine(t *testing.T) {
	tls := Flags{Addr: ":443", STUNPort: 3478, KeyFile: "/k", TLS: true, CertDir: "/d", Hostname: "h", Extra: []string{"--x"}}
	want := []string{"-a", ":443", "--certmode", "manual", "--certdir", "/d", "--hostname", "h",
		"--http-port", "-1", "--stun-port", "3478", "-c", "/k", "--x"}
	if got := tls.Args(); !slices.Equal(got, want) {
		t.Errorf("TLS: %q, want %q", got, want)
	}
	plain := Flags{Addr: "127.0.0.1:1", STUNPort: 2, KeyFile: "/k"}
	want = []string{"-a", "127.0.0.1:1", "--http-port", "-1", "--stun-port", "2", "-c", "/k"}
	if got := plain.Args(); !slices.Equal(got, want) {
		t.Errorf("plain: %q, want %q", got, want)
	}
	dev := Flags{Addr: "127.0.0.1:1", STUNPort: 2, KeyFile: "/k", Dev: true}
	want = []string{"--dev", "-a", "127.0.0.1:1", "--stun-port", "2"}
	if got := dev.Args(); !slices.Equal(got, want) {
		t.Errorf("dev: %q, want %q", got, want)
	}
}

// proc is a process that has ended once exited is set.
type proc struct{ exited atomic.Bool }

func (p *proc) Exited() (bool, error) {
	if p.exited.Load() {
		return true, errors.New("exit status 1")
	}
	return false, nil
}

// probeServer answers /derp/probe with 503 the first `busy` times, then 200.
func probeServer(t *testing.T, busy int32) *httptest.Server {
	var calls atomic.Int32
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/derp/probe" {
			http.NotFound(w, r)
			return
		}
		if calls.Add(1) <= busy {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func TestStartWaitsForTheProbe(t *testing.T) {
	s := probeServer(t, 3)
	var argv []string
	launch := func(a []string) (*proc, error) {
		argv = a
		return new(proc), nil
	}
	f := Flags{Addr: ":1", STUNPort: 2, KeyFile: "/k"}
	probe := Probe{Client: s.Client(), BaseURL: s.URL, Timeout: 10 * time.Second}
	if _, err := Start("/bin/derper", f, launch, probe); err != nil {
		t.Fatal(err)
	}
	if want := append([]string{"/bin/derper"}, f.Args()...); !slices.Equal(argv, want) {
		t.Errorf("launched %q, want %q", argv, want)
	}
}

func TestWaitReadyStopsWhenTheProcessEnds(t *testing.T) {
	s := probeServer(t, 1<<30)
	p := new(proc)
	p.exited.Store(true)
	err := WaitReady(p, Probe{Client: s.Client(), BaseURL: s.URL, Timeout: 10 * time.Second})
	if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "exit status 1") {
		t.Fatalf("err = %v, want ErrExited with the status", err)
	}
}

func TestWaitReadyGivesUpAfterItsTimeout(t *testing.T) {
	s := probeServer(t, 1<<30)
	start := time.Now()
	err := WaitReady(new(proc), Probe{Client: s.Client(), BaseURL: s.URL, Timeout: 300 * time.Millisecond})
	if err == nil || errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "503") {
		t.Fatalf("err = %v, want a timeout naming the last answer", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %v for a 300 ms timeout", took)
	}
}

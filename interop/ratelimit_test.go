package interop

// Per-client receive limits (--rate-config) and their reload on SIGHUP,
// with derper beside ferry: a limited client sending as fast as it can is
// relayed at its rate, nothing is dropped, a mesh peer beside it is not
// limited, a new file applies on SIGHUP, a bad one is refused and the old
// limits stay.

import (
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"tailscale.com/derp"
)

func writeRate(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// flood sends 1000-byte packets from a to b as fast as a's connection
// takes them until stop, and counts what b receives.
type flood struct {
	got  atomic.Int64
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func startFlood(t *testing.T, a, b *dclient) *flood {
	f := &flood{stop: make(chan struct{})}
	pkt := nonDisco(1000)
	f.wg.Add(2)
	go func() {
		defer f.wg.Done()
		for {
			select {
			case <-f.stop:
				return
			default:
			}
			if err := a.c.Send(b.pub, pkt); err != nil {
				return
			}
		}
	}()
	go func() {
		defer f.wg.Done()
		for {
			m, err := b.recv(time.Second)
			if err != nil {
				select {
				case <-f.stop:
					return
				default:
				}
				continue
			}
			if p, ok := m.(derp.ReceivedPacket); ok {
				f.got.Add(int64(len(p.Data)))
			}
		}
	}()
	return f
}

// rate measures b's receive rate over d, in bytes of packet data a second.
func (f *flood) rate(d time.Duration) float64 {
	before := f.got.Load()
	time.Sleep(d)
	return float64(f.got.Load()-before) / d.Seconds()
}

// end stops the flood; later calls do nothing.
func (f *flood) end() {
	f.once.Do(func() { close(f.stop) })
}

func TestRateConfig(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		dir := t.TempDir()
		path := filepath.Join(dir, "rate.json")
		writeRate(t, path, `{"PerClientRateLimitBytesPerSec": 1000000}`)
		s := startServer(t, kind, serverOpts{mesh: true, args: []string{"--rate-config", path}})
		a, b := s.newClient(t, "a"), s.newClient(t, "b")
		m, c := s.newClient(t, "mesh", withMeshKey(s.meshKey)), s.newClient(t, "c")
		// Which receiver a drop in the server's log was for.
		t.Logf("limited flood a %s -> b %s; mesh flood %s -> c %s", a.pub, b.pub, m.pub, c.pub)

		limited := startFlood(t, a, b)
		free := startFlood(t, m, c)
		defer limited.end()
		defer free.end()
		time.Sleep(500 * time.Millisecond) // past the first burst
		// 1,000,000 bytes/s of frames: 1037-byte frames carry 1000 bytes.
		want := 1e6 * 1000 / 1037
		got := limited.rate(2 * time.Second)
		t.Logf("%s: limited client relayed at %.0f B/s (want about %.0f)", kind, got, want)
		if got < 0.9*want || got > 1.1*want {
			t.Errorf("limited client relayed at %.0f B/s; want %.0f within 10%%", got, want)
		}
		if mesh := free.rate(time.Second); mesh < 3*want {
			t.Errorf("mesh peer relayed at %.0f B/s beside it; want it not limited (> %.0f)", mesh, 3*want)
		}
		// The unlimited flood has shown what it is for; left running it
		// would keep the relay's core saturated through the phases below,
		// which measure the limited client's rate alone (a debug build on
		// a busy machine then delivered 10 % under the new limit).
		free.end()

		// A new limit on SIGHUP, in effect within a second.
		writeRate(t, path, `{"PerClientRateLimitBytesPerSec": 2000000}`)
		s.cmd.Process.Signal(syscall.SIGHUP)
		time.Sleep(time.Second)
		// Drops are counted from here, where the limited flood runs alone:
		// the mesh flood's receiver, when a loaded machine stalls it past
		// the backpressure budget, has its packets dropped by design.
		droppedBefore := 0.0
		if kind == kindFerry {
			droppedBefore = droppedPackets(t, s)
		}
		got = limited.rate(2 * time.Second)
		t.Logf("%s: after SIGHUP: %.0f B/s", kind, got)
		if got < 0.9*2*want || got > 1.1*2*want {
			t.Errorf("after SIGHUP with 2 MB/s: relayed at %.0f B/s; want %.0f within 10%%", got, 2*want)
		}

		// A bad file is refused; the limits stay.
		writeRate(t, path, `{"PerClientRateLimitBytesPerSec": "fast"}`)
		s.cmd.Process.Signal(syscall.SIGHUP)
		time.Sleep(500 * time.Millisecond)
		got = limited.rate(2 * time.Second)
		if got < 0.9*2*want || got > 1.1*2*want {
			t.Errorf("after a bad file: relayed at %.0f B/s; want the previous %.0f within 10%%", got, 2*want)
		}
		// Both publish the limits in force, under derper's names.
		if v := s.mustMetric(t, "derp_rate_limit_per_client_bytes_per_second"); v != 2e6 {
			t.Errorf("%s: derp_rate_limit_per_client_bytes_per_second = %v; want 2e6", kind, v)
		}
		if v := s.mustMetric(t, "derp_rate_limit_per_client_burst_bytes"); v != 65568 {
			t.Errorf("%s: derp_rate_limit_per_client_burst_bytes = %v; want 65568", kind, v)
		}
		if kind == kindFerry {
			waitLog(t, s, "rate config not applied")
			dropped := droppedPackets(t, s) - droppedBefore
			if dropped != 0 {
				t.Errorf("ferry dropped %v packets with the limited flood alone; want none (senders are slowed, not dropped from)", dropped)
			}
		}
	})
}

// droppedPackets is Ferry's count of packets it dropped, all reasons.
func droppedPackets(t *testing.T, s *server) float64 {
	t.Helper()
	samples, err := s.scrapeMetrics()
	if err != nil {
		t.Fatal(err)
	}
	dropped := 0.0
	for _, m := range samples {
		if m.name == "derp_packets_dropped" {
			dropped += m.value
		}
	}
	return dropped
}

//go:build linux

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"ferry.invalid/interop/e2e/testbed"
)

// The test runs only when asked: it needs root, builds tailscaled and
// Headscale (minutes, the first time) and takes about a minute and a half.
// `go test ./...` in the interop module passes over it with a printed
// reason; scripts/test.d/50-e2e.sh sets FERRY_E2E=1.
const enableVar = "FERRY_E2E"

var (
	setupOnce sync.Once
	setupSkip string // non-empty: why the test is skipped
	setupErr  error
	bins      testbed.Binaries
	ferryErr  error // no ferry binary: ferry subtests fail with it
)

func setup(t *testing.T) {
	setupOnce.Do(func() {
		if os.Getenv(enableVar) == "" {
			setupSkip = enableVar + " is not set (the end-to-end test needs root and builds tailscaled and Headscale; scripts/test.d/50-e2e.sh runs it)"
			return
		}
		if err := testbed.Preflight(); err != nil {
			setupSkip = err.Error()
			return
		}
		testbed.Reap(t.Logf)
		moduleDir, err := filepath.Abs("..")
		if err != nil {
			setupErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		start := time.Now()
		bins, setupErr = testbed.EnsureBinaries(ctx, moduleDir, filepath.Join(moduleDir, "bin"), t.Logf)
		if setupErr != nil {
			return
		}
		t.Logf("binaries ready in %.0f s", time.Since(start).Seconds())
		bins.Ferry, ferryErr = testbed.LocateFerry(moduleDir)
	})
	if setupSkip != "" {
		fmt.Printf("e2e: SKIP: %s\n", setupSkip)
		t.Skip(setupSkip)
	}
	if setupErr != nil {
		t.Fatal(setupErr)
	}
}

// relayConfigs are the relays every run covers, in order: ferry over TLS
// and plain HTTP, then derper the same two ways for comparison.
// INTEROP_SERVERS (derper,ferry) narrows the list, as in the interop suite.
func relayConfigs(t *testing.T) []testbed.DerpServerOptions {
	kinds := []string{testbed.Ferry, testbed.Derper}
	if v := strings.TrimSpace(os.Getenv("INTEROP_SERVERS")); v != "" {
		kinds = nil
		for _, k := range strings.Split(v, ",") {
			switch k = strings.TrimSpace(k); k {
			case testbed.Ferry, testbed.Derper:
				kinds = append(kinds, k)
			case "":
			default:
				t.Fatalf("INTEROP_SERVERS: unknown server %q", k)
			}
		}
	}
	// FERRY_ARGS: extra ferry flags, as in the interop suite ("--io epoll").
	ferryArgs := strings.Fields(os.Getenv("FERRY_ARGS"))
	var out []testbed.DerpServerOptions
	for _, k := range kinds {
		for _, tls := range []bool{true, false} {
			o := testbed.DerpServerOptions{Kind: k, TLS: tls}
			if k == testbed.Ferry {
				o.ExtraArgs = ferryArgs
			}
			out = append(out, o)
		}
	}
	return out
}

// TestTailscaleThroughRelay brings up Headscale, two tailscaled nodes and
// the relay in namespaces, then checks that the nodes reach each other
// only through the relay and that real traffic flows: peers online,
// `tailscale ping` via DERP, ICMP ping and an iperf3 TCP transfer through
// the tunnel, and the relay's packet counters covering that transfer.
func TestTailscaleThroughRelay(t *testing.T) {
	setup(t)
	var summaries []string
	for _, opts := range relayConfigs(t) {
		// Sequential: the relays are compared, so they must not share
		// the CPUs with each other.
		t.Run(opts.Name(), func(t *testing.T) {
			if opts.Kind == testbed.Ferry && ferryErr != nil {
				t.Fatal(ferryErr)
			}
			s := checkRelay(t, opts)
			if s != "" {
				summaries = append(summaries, s)
			}
		})
	}
	if len(summaries) > 0 {
		t.Logf("summary (iperf3 TCP 5 s, A→B through the relay):\n%s", strings.Join(summaries, "\n"))
	}
}

// upBed brings a bed up, closed when the test ends; on failure (or with
// FERRY_E2E_LOGS) the last logLines lines of every process are logged.
func upBed(t *testing.T, cfg testbed.Config, logLines int) *testbed.Bed {
	bed := testbed.New(cfg)
	t.Cleanup(bed.Close)
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("FERRY_E2E_LOGS") != "" {
			t.Logf("process output:\n%s", bed.Logs(logLines))
		}
	})
	if err := bed.Up(); err != nil {
		t.Fatalf("bringing the network up: %v", err)
	}
	return bed
}

// tunnelMTU bounds the inner packet size: each relayed packet carries at
// most this many bytes of iperf payload, so a transfer of N bytes needs at
// least N/tunnelMTU packets through the relay.
const tunnelMTU = 1280

func checkRelay(t *testing.T, opts testbed.DerpServerOptions) string {
	start := time.Now()
	bed := upBed(t, testbed.Config{Bins: bins, Relay: opts, Logf: t.Logf}, 60)
	a, b := bed.A, bed.B
	before, err := bed.Relay.Metrics()
	if err != nil {
		t.Fatalf("relay metrics: %v", err)
	}
	if c := before.Sum("derp_current_connections"); c < 2 {
		t.Errorf("derp_current_connections = %v with both nodes up, want ≥ 2", c)
	}

	// tailscale ping (disco through the relay): the path must be DERP,
	// never direct. The first ping right after login may time out.
	for _, pair := range [][2]*testbed.Node{{a, b}, {b, a}} {
		from, to := pair[0], pair[1]
		var out string
		viaDERP := false
		for attempt := 0; attempt < 3 && !viaDERP; attempt++ {
			out, _ = from.TailscalePing(to.IP, 3)
			if strings.Contains(out, "via 10.78.") { // a node's own address: direct
				t.Fatalf("tailscale ping %s→%s went direct, the UDP block failed:\n%s", from.Name, to.Name, out)
			}
			viaDERP = strings.Contains(out, "via DERP(fe)")
		}
		if !viaDERP {
			t.Fatalf("tailscale ping %s→%s never went via DERP(fe):\n%s", from.Name, to.Name, out)
		}
		t.Logf("tailscale ping %s→%s: %s", from.Name, to.Name, firstLineWith(out, "via DERP"))
	}

	// ICMP through the tunnel.
	pr, err := testbed.Ping(a, b.IP, 10, 200*time.Millisecond)
	if err != nil {
		t.Fatalf("ping %s: %v", b.IP, err)
	}
	if pr.Received == 0 || pr.Loss() > 0.2 {
		t.Fatalf("ping %s: %d of %d replies", b.IP, pr.Received, pr.Sent)
	}

	// iperf3 TCP, A→B.
	srv, err := testbed.StartIperfServer(b)
	if err != nil {
		t.Fatal(err)
	}
	bed.AddProc(srv)
	clientBefore, err := a.ClientMetrics()
	if err != nil {
		t.Fatal(err)
	}
	ir, err := testbed.Iperf(a, b, testbed.IperfOptions{Duration: 5 * time.Second})
	if err != nil {
		t.Fatalf("iperf3: %v", err)
	}
	if ir.ReceivedBytes < 1<<20 {
		t.Fatalf("iperf3 moved only %d bytes in 5 s", ir.ReceivedBytes)
	}

	// Still relayed after the transfer: no direct address in use.
	st, err := a.Status()
	if err != nil {
		t.Fatal(err)
	}
	if p := st.PeerNamed(b.Name); p == nil || p.CurAddr != "" || p.Relay != "fe" {
		t.Errorf("status of %s on %s after the transfer: %+v, want relayed via fe with no CurAddr", b.Name, a.Name, p)
	}

	// The relay saw the transfer: at least one relayed packet per MTU of
	// payload, in and out.
	after, err := bed.Relay.Metrics()
	if err != nil {
		t.Fatalf("relay metrics: %v", err)
	}
	minPackets := float64(ir.ReceivedBytes) / tunnelMTU
	recv := testbed.Delta(before, after, "derp_packets_received")
	sent := testbed.Delta(before, after, "derp_packets_sent")
	if recv < minPackets || sent < minPackets {
		t.Errorf("relay counted %.0f packets received and %.0f sent during a %d-byte transfer, want ≥ %.0f each",
			recv, sent, ir.ReceivedBytes, minPackets)
	}
	drops := testbed.NonZero(before, after, "derp_packets_dropped")
	// Packets the sending tailscaled dropped itself, its queue towards the
	// relay being full: with the relay's own drops, the cause of TCP
	// retransmits.
	clientAfter, err := a.ClientMetrics()
	if err != nil {
		t.Fatal(err)
	}
	senderDrops := testbed.Delta(clientBefore, clientAfter, "magicsock_send_derp_dropped") +
		testbed.Delta(clientBefore, clientAfter, "magicsock_send_derp_error_queue")
	blocked, _ := testbed.BlockedUDP(a.NS)

	summary := fmt.Sprintf("%-12s ping avg %5.2f ms  TCP %6.1f Mbit/s  %6d retransmits  relay +%.0f recv +%.0f sent, drops %v  sender tailscaled drops %.0f  (direct UDP blocked: %d)  %.0f s",
		opts.Name(), avg(pr.RTTms), ir.ReceivedBps/1e6, ir.Retransmits, recv, sent, drops, senderDrops, blocked, time.Since(start).Seconds())
	t.Log(summary)
	return summary
}

func avg(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func firstLineWith(s, substr string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

//go:build linux

package e2e

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"ferry.invalid/interop/e2e/testbed"
)

// TestMeshRegion: two real tailscaled nodes whose home DERP nodes are
// different nodes of one region (each is kept off the other's node),
// UDP between them blocked, so everything they say crosses the mesh
// between the two relay nodes. Then the first node is killed (SIGKILL),
// and A's tunnel must recover through the remaining node by itself. The
// region of ferry (first) and derper (second) runs beside an all-derper
// region, the reference; the recovery times of both are logged.
func TestMeshRegion(t *testing.T) {
	setup(t)
	regions := [][2]string{{testbed.Ferry, testbed.Derper}, {testbed.Derper, testbed.Derper}}
	var summaries []string
	for _, kinds := range regions {
		t.Run(kinds[0]+"+"+kinds[1], func(t *testing.T) {
			for _, k := range kinds {
				if !relayKindSelected(t, k) {
					t.Skipf("INTEROP_SERVERS excludes %s", k)
				}
				if k == testbed.Ferry && ferryErr != nil {
					t.Fatal(ferryErr)
				}
			}
			summaries = append(summaries, checkMeshRegion(t, kinds))
		})
	}
	t.Logf("summary:\n%s", strings.Join(summaries, "\n"))
}

func checkMeshRegion(t *testing.T, kinds [2]string) string {
	ferryArgs := strings.Fields(os.Getenv("FERRY_ARGS"))
	opts := func(kind string) testbed.DerpServerOptions {
		o := testbed.DerpServerOptions{Kind: kind, TLS: true}
		if kind == testbed.Ferry {
			o.ExtraArgs = ferryArgs
		}
		return o
	}
	peer := opts(kinds[1])
	bed := upBed(t, testbed.Config{Bins: bins, Relay: opts(kinds[0]), Peer: &peer, Logf: t.Logf}, 80)
	a, b := bed.A, bed.B
	first, second := bed.Relay, bed.Peer
	before := map[*testbed.Relay]testbed.Metrics{}
	for _, r := range []*testbed.Relay{first, second} {
		m, err := r.Metrics()
		if err != nil {
			t.Fatalf("relay metrics: %v", err)
		}
		before[r] = m
	}

	// tailscale ping is disco through DERP: it crosses the mesh.
	for _, pair := range [][2]*testbed.Node{{a, b}, {b, a}} {
		var out string
		ok := false
		for attempt := 0; attempt < 5 && !ok; attempt++ {
			out, _ = pair[0].TailscalePing(pair[1].IP, 3)
			if strings.Contains(out, "via 10.78.") {
				t.Fatalf("tailscale ping %s→%s went direct:\n%s", pair[0].Name, pair[1].Name, out)
			}
			ok = strings.Contains(out, "via DERP(fe)")
		}
		if !ok {
			t.Fatalf("tailscale ping %s→%s never went via DERP(fe):\n%s", pair[0].Name, pair[1].Name, out)
		}
	}
	pr, err := testbed.Ping(a, b.IP, 10, 200*time.Millisecond)
	if err != nil || pr.Received == 0 || pr.Loss() > 0.2 {
		t.Fatalf("ping through the mesh: %d of %d replies (%v)", pr.Received, pr.Sent, err)
	}
	srv, err := testbed.StartIperfServer(b)
	if err != nil {
		t.Fatal(err)
	}
	bed.AddProc(srv)
	ir, err := testbed.Iperf(a, b, testbed.IperfOptions{Duration: 3 * time.Second})
	if err != nil {
		t.Fatalf("iperf3 through the mesh: %v", err)
	}
	if ir.ReceivedBytes < 1<<20 {
		t.Fatalf("iperf3 moved only %d bytes in 3 s through the mesh", ir.ReceivedBytes)
	}
	// Each node forwarded to the other: A's side on the first node, B's
	// on the second.
	for _, r := range []*testbed.Relay{first, second} {
		after, err := r.Metrics()
		if err != nil {
			t.Fatalf("relay metrics: %v", err)
		}
		out := testbed.Delta(before[r], after, "derp_packets_forwarded_out")
		in := testbed.Delta(before[r], after, "derp_packets_forwarded_in")
		if out < 100 || in < 100 {
			t.Errorf("%s node on port %d forwarded %.0f packets out and %.0f in during the transfer, want ≥ 100 each (it has %.0f connections, %.0f packets received; the nodes' homes are not on different relays?)",
				r.Opts.Kind, r.Port, out, in, after.Sum("derp_current_connections"), testbed.Delta(before[r], after, "derp_packets_received"))
		}
	}

	// Kill the first node: A must come back through the second by itself
	// (the rule that kept it off the second node goes at the same time).
	if err := bed.AllowAToPeer(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(first.Proc.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The clock starts once the process is gone (a packet sent in the
	// moment before could still cross the dying node).
	for deadline := time.Now().Add(10 * time.Second); ; {
		if done, _ := first.Proc.Exited(); done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed %s node did not exit", first.Opts.Kind)
		}
		time.Sleep(10 * time.Millisecond)
	}
	killed := time.Now()
	recovered := time.Duration(0)
	for time.Since(killed) < 90*time.Second {
		r, _ := testbed.Ping(a, b.IP, 1, 200*time.Millisecond)
		if r.Received > 0 {
			recovered = time.Since(killed)
			break
		}
	}
	if recovered == 0 {
		t.Fatalf("A's tunnel to B did not recover within 90 s of the %s node being killed", first.Opts.Kind)
	}
	pr2, err := testbed.Ping(a, b.IP, 10, 200*time.Millisecond)
	if err != nil || pr2.Loss() > 0.2 {
		t.Fatalf("after recovery: %d of %d replies (%v)", pr2.Received, pr2.Sent, err)
	}
	// Both nodes are now on the remaining relay.
	if m, err := second.Metrics(); err != nil {
		t.Fatal(err)
	} else if c := m.Sum("derp_current_connections"); c < 2 {
		t.Errorf("the remaining %s node has %.0f connections after recovery, want A and B", second.Opts.Kind, c)
	}
	summary := fmt.Sprintf("%s+%s: ping %.2f ms, TCP %.1f Mbit/s through the mesh; tunnel back %.2f s after the %s node was killed",
		kinds[0], kinds[1], avg(pr.RTTms), ir.ReceivedBps/1e6, recovered.Seconds(), kinds[0])
	t.Log(summary)
	return summary
}

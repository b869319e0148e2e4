//go:build linux

package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"ferry.invalid/interop/e2e/testbed"
)

// TestPeerRelay: Ferry, started with the tailnet flags, is a node of the
// Headscale tailnet (tagged, with the cap/relay grant for the user's
// nodes) and the two tailscaled nodes, which cannot reach each other by
// UDP, use it as their peer relay: `tailscale ping` says `via
// peer-relay(...)` both ways, `tailscale status --json` names the peer
// relay for the peer, and bytes cross the peer relay's port (counted by
// nftables in the relay's namespace).
func TestPeerRelay(t *testing.T) {
	setup(t)
	if ferryErr != nil {
		t.Fatal(ferryErr)
	}
	// A Ferry of its own beside the DERP relay (with iperf3); then the
	// DERP relay itself restarted with the flags, its disco traffic
	// reaching it through itself.
	t.Run("second-ferry", func(t *testing.T) { checkPeerRelay(t, secondFerry) })
	t.Run("derp-ferry", func(t *testing.T) { checkPeerRelay(t, derpFerry) })
	// The reference: tailscaled's own peer relay in the same place,
	// checked the same way (but for Ferry's metrics and status, and the
	// fallback and restart steps, which test the clients as much as the
	// relay).
	t.Run("reference-tailscaled", func(t *testing.T) { checkPeerRelay(t, referenceTailscaled) })
}

// What serves the peer relay in a subtest.
type peerRelayKind int

const (
	secondFerry         peerRelayKind = iota // a Ferry of its own
	derpFerry                                // the bed's DERP relay, restarted as the peer relay too
	referenceTailscaled                      // tailscaled's own peer relay
)

func checkPeerRelay(t *testing.T, kind peerRelayKind) {
	ownDERP := kind == derpFerry
	start := time.Now()
	cfg := testbed.Config{
		Bins:   bins,
		Relay:  testbed.DerpServerOptions{Kind: testbed.Ferry},
		Policy: testbed.PeerRelayPolicy,
		Logf:   t.Logf,
	}
	if kind == secondFerry {
		// Short enough that the fallback phase's block outlives it.
		cfg.PeerRelayIdle = peerRelayIdle
	}
	bed := upBed(t, cfg, 80)
	relayName := "fe-relay"
	metrics := bed.PeerRelayMetrics
	var ferryLogs func() string // the second Ferry's log
	var ferryProc *testbed.Proc // the second Ferry
	switch kind {
	case derpFerry:
		relayName = "fe-derp"
		if err := bed.RestartRelayAsPeerRelay(relayName); err != nil {
			t.Fatalf("restarting the DERP relay as the peer relay: %v", err)
		}
		metrics = bed.Relay.Metrics
	case referenceTailscaled:
		relayName = "fe-ref"
		if _, err := bed.StartTailscaledPeerRelay(relayName); err != nil {
			t.Fatalf("starting tailscaled's peer relay: %v", err)
		}
	default:
		p, err := bed.StartFerryPeerRelay(relayName)
		if err != nil {
			t.Fatalf("starting Ferry's peer relay: %v", err)
		}
		ferryLogs = p.Logs
		ferryProc = p
		// No --peer-relay-endpoints: Ferry asks the home region's STUN
		// server (the bed's relay) from the peer-relay port.
		const learned = "STUN names the port's public address"
		if err := waitFor(10*time.Second, func() (bool, string) {
			line := firstLineWith(p.Logs(), learned)
			return strings.Contains(line, testbed.RelayIP+":"+fmt.Sprint(testbed.PeerRelayPort)), "Ferry's log: " + line
		}); err != nil {
			t.Fatalf("no STUN answer for the peer-relay port: %v", err)
		}
	}
	a, b := bed.A, bed.B

	waitRelayNode(t, bed, relayName)
	pingViaPeerRelay(t, bed, 90*time.Second)

	// status --json agrees, both ways.
	// derp-ferry offers a forwarded port (--peer-relay-endpoints): the
	// clients' path names it.
	prefix := bed.PeerRelayAddr + ":vni:"
	for _, pair := range [][2]*testbed.Node{{a, b}, {b, a}} {
		st, err := pair[0].Status()
		if err != nil {
			t.Fatal(err)
		}
		p := st.PeerNamed(pair[1].Name)
		if p == nil || !strings.HasPrefix(p.PeerRelay, prefix) {
			t.Fatalf("%s's status of %s: PeerRelay %q, want %s…", pair[0].Name, pair[1].Name, peerRelayOf(p), prefix)
		}
	}

	// The pings crossed the port both ways.
	in, out, err := bed.PeerRelayBytes()
	if err != nil {
		t.Fatal(err)
	}
	if in == 0 || out == 0 {
		t.Fatalf("peer relay port: %d bytes in, %d out", in, out)
	}

	if kind == referenceTailscaled {
		checkIperf(t, bed, in, out, prefix)
		t.Logf("whole test %.1f s", time.Since(start).Seconds())
		return
	}
	if !ownDERP {
		var bps float64
		in, out, bps = checkIperf(t, bed, in, out, prefix)
		checkBadInput(t, bed, relayName, ferryProc, metrics, bps, prefix)
		in, out, err = bed.PeerRelayBytes()
		if err != nil {
			t.Fatal(err)
		}
		freedVNI := checkFallback(t, bed, metrics)
		checkClientRestart(t, bed, metrics, ferryLogs, prefix, freedVNI)
		checkFerryStatus(t, bed, relayName)
	}

	// Ferry's own counters: allocations answered, packets forwarded.
	m, err := metrics()
	if err != nil {
		t.Fatal(err)
	}
	for _, series := range []string{
		`ferry_peer_relay_allocations_total{result="new"}`,
		"ferry_udp_peer_relay_forwarded_total",
	} {
		if v, ok := m[series]; !ok || v == 0 {
			t.Errorf("peer relay metrics: %s = %v (present: %v)", series, v, ok)
		}
	}
	t.Logf("peer relay: %d bytes in, %d out; %v allocations, %v packets forwarded",
		in, out, m.Sum("ferry_peer_relay_allocations_total"), m["ferry_udp_peer_relay_forwarded_total"])

	if ownDERP {
		// Restarted with its saved state it is the same node (it polls
		// without registering again), and the nodes find the peer relay
		// again.
		restart := time.Now()
		if err := bed.RestartRelay(); err != nil {
			t.Fatalf("restarting the relay: %v", err)
		}
		waitRelayNode(t, bed, relayName)
		pingViaPeerRelay(t, bed, 90*time.Second)
		if strings.Contains(bed.Relay.Proc.Logs(), "tailnet: registered") {
			t.Fatalf("after the restart Ferry registered a new node instead of polling with its saved state")
		}
		t.Logf("after a restart, the peer relay path is back in %.1f s", time.Since(restart).Seconds())
	}
	t.Logf("whole test %.1f s", time.Since(start).Seconds())
}

// checkIperf runs iperf3 TCP A→B through the tunnel: its bytes cross the
// peer relay's port (in from A, out to B), WireGuard and header overhead
// on top. in and out are the port's counters before; it returns them
// after, and iperf3's rate (bit/s).
func checkIperf(t *testing.T, bed *testbed.Bed, in, out int64, prefix string) (int64, int64, float64) {
	a, b := bed.A, bed.B
	srv, err := testbed.StartIperfServer(b)
	if err != nil {
		t.Fatal(err)
	}
	bed.AddProc(srv)
	ir, err := testbed.Iperf(a, b, testbed.IperfOptions{Duration: 3 * time.Second})
	if err != nil {
		t.Fatalf("iperf3: %v", err)
	}
	if ir.ReceivedBytes < 1<<20 {
		t.Fatalf("iperf3 moved only %d bytes in 3 s", ir.ReceivedBytes)
	}
	in2, out2, err := bed.PeerRelayBytes()
	if err != nil {
		t.Fatal(err)
	}
	if min(in2-in, out2-out) < ir.ReceivedBytes {
		t.Fatalf("iperf3 moved %d bytes but the peer relay port saw only %d in, %d out", ir.ReceivedBytes, in2-in, out2-out)
	}
	st, err := a.Status()
	if err != nil {
		t.Fatal(err)
	}
	if p := st.PeerNamed(b.Name); p == nil || !strings.HasPrefix(p.PeerRelay, prefix) || p.CurAddr != "" {
		t.Fatalf("after iperf3, %s's status of %s: %+v, want the peer relay and no direct address", a.Name, b.Name, p)
	}
	t.Logf("iperf3 A→B through the peer relay: %.0f Mbit/s (%d bytes; port %d bytes in, %d out)",
		ir.ReceivedBps/1e6, ir.ReceivedBytes, in2-in, out2-out)
	return in2, out2, ir.ReceivedBps
}

// peerRelayIdle is the second Ferry's steady-state lifetime in
// TestPeerRelay (Ferry's test knob). tailscaled heartbeats an active path
// every 3 s, so only a blocked path goes silent this long; but it must
// outlast tailscaled's 30 s between relay path discoveries: the first
// handshake often loses its pings to the side not yet bound, and the next
// discovery reuses the endpoint (5 s and 15 s here freed it first, and
// the path never came).
const peerRelayIdle = 40 * time.Second

// checkFallback blocks the nodes' UDP to the peer relay's port: the path
// falls back to DERP (tailscale ping answers via DERP, ICMP still
// crosses the tunnel, the port's counters stand still), and both sides
// of the endpoint in use are silent at Ferry: it frees the endpoint
// (freed_idle grows) within the lifetime the bed set. It unblocks the
// port before returning and returns the freed endpoint's VNI; the path's
// return (with another VNI) is checked by checkClientRestart, which
// follows (waiting here for tailscaled to find the unblocked port on its
// own takes about 22 s of CI time).
func checkFallback(t *testing.T, bed *testbed.Bed, metrics func() (testbed.Metrics, error)) string {
	a, b := bed.A, bed.B
	const freed = `ferry_udp_peer_relay_events_total{event="freed_idle"}`
	freedBefore := func() float64 {
		m, err := metrics()
		if err != nil {
			t.Fatal(err)
		}
		v, ok := m[freed]
		if !ok {
			t.Fatalf("peer relay metrics: no %s", freed)
		}
		return v
	}()
	st, err := a.Status()
	if err != nil {
		t.Fatal(err)
	}
	vni := peerRelayVNI(st.PeerNamed(b.Name), bed.PeerRelayAddr+":vni:")
	if vni == "" {
		t.Fatalf("before the block, %s's status of %s names no peer relay VNI: %q", a.Name, b.Name, peerRelayOf(st.PeerNamed(b.Name)))
	}
	start := time.Now()
	if err := bed.BlockPeerRelay(true); err != nil {
		t.Fatalf("blocking the peer relay's port: %v", err)
	}
	in0, out0, err := bed.PeerRelayBytes()
	if err != nil {
		t.Fatal(err)
	}
	for _, pair := range [][2]*testbed.Node{{a, b}, {b, a}} {
		from, to := pair[0], pair[1]
		var out string
		if err := waitFor(30*time.Second, func() (bool, string) {
			// One ping, answered within a second: a ping lost on the
			// blocked path costs a second, not five.
			out, _ = from.CLI(10*time.Second, "ping", "--c", "1", "--timeout", "1s", to.IP)
			return strings.Contains(out, "via DERP(") && !strings.Contains(out, "via peer-relay"), out
		}); err != nil {
			t.Fatalf("with the peer relay's port blocked, tailscale ping %s→%s never went via DERP alone: %v", from.Name, to.Name, err)
		}
	}
	fellBack := time.Since(start)
	pr, err := testbed.Ping(a, b.IP, 10, 100*time.Millisecond)
	if err != nil {
		t.Fatalf("ping %s: %v", b.IP, err)
	}
	if pr.Received < 8 {
		t.Fatalf("with the peer relay's port blocked, ping %s: %d of %d replies", b.IP, pr.Received, pr.Sent)
	}
	in1, out1, err := bed.PeerRelayBytes()
	if err != nil {
		t.Fatal(err)
	}
	if in1 != in0 || out1 != out0 {
		t.Fatalf("the peer relay's port counted bytes while blocked: %d in, %d out", in1-in0, out1-out0)
	}
	// Still blocked: both sides silent for longer than the lifetime.
	var freedAfter float64
	if err := waitFor(bed.Cfg.PeerRelayIdle+10*time.Second, func() (bool, string) {
		m, err := metrics()
		if err != nil {
			return false, err.Error()
		}
		v, ok := m[freed]
		if !ok {
			t.Fatalf("peer relay metrics: no %s", freed)
		}
		freedAfter = v
		return v > freedBefore, fmt.Sprintf("%s %v → %v", freed, freedBefore, v)
	}); err != nil {
		t.Fatalf("with both sides silent %.1f s (lifetime %v), Ferry freed no endpoint: %v",
			time.Since(start).Seconds(), bed.Cfg.PeerRelayIdle, err)
	}
	idleFreed := time.Since(start)

	if err := bed.BlockPeerRelay(false); err != nil {
		t.Fatalf("unblocking the peer relay's port: %v", err)
	}
	t.Logf("blocked: via DERP after %.1f s (%d of %d ICMP replies); %v endpoint(s) freed idle after %.1f s (lifetime %v); the path had VNI %s",
		fellBack.Seconds(), pr.Received, pr.Sent, freedAfter-freedBefore, idleFreed.Seconds(), bed.Cfg.PeerRelayIdle, vni)
	return vni
}

// peerRelayVNI is the VNI in p's peer relay path (prefix then the VNI),
// or "".
func peerRelayVNI(p *testbed.PeerStatus, prefix string) string {
	if p == nil || !strings.HasPrefix(p.PeerRelay, prefix) {
		return ""
	}
	return strings.TrimPrefix(p.PeerRelay, prefix)
}

// checkClientRestart restarts node A's tailscaled (same node key, a new
// disco key) right after checkFallback unblocked the port: Ferry
// allocates for the new pair of disco keys and the path through the peer
// relay comes back, its bytes on the port.
func checkClientRestart(t *testing.T, bed *testbed.Bed, metrics func() (testbed.Metrics, error), ferryLogs func() string, prefix, freedVNI string) {
	before, err := metrics()
	if err != nil {
		t.Fatal(err)
	}
	in0, out0, err := bed.PeerRelayBytes()
	if err != nil {
		t.Fatal(err)
	}
	oldDisco, err := bed.B.PeerDiscoKey(bed.A.Name)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := bed.RestartNode(bed.A); err != nil {
		t.Fatal(err)
	}
	// The endpoint A used is gone (freed idle): the path needs a new one,
	// found at one of tailscaled's relay path discoveries (30 s apart; the
	// first handshake on a fresh endpoint often loses its pings). Seen
	// back after 7-68 s.
	pingViaPeerRelay(t, bed, 150*time.Second)
	newDisco, err := bed.B.PeerDiscoKey(bed.A.Name)
	if err != nil {
		t.Fatal(err)
	}
	if newDisco == oldDisco {
		t.Fatalf("%s kept its disco key %s over the restart", bed.A.Name, oldDisco)
	}
	// Ferry's allocations name A's new key, whichever node asked: the
	// endpoint A used was freed while blocked, so the path that is back
	// runs through a new one (Ferry logs the first allocation naming each
	// peer's current disco key).
	const firstSeen = "peer relay: endpoint allocated for a disco key first seen"
	var line string
	if err := waitFor(10*time.Second, func() (bool, string) {
		line = ""
		for _, l := range strings.Split(ferryLogs(), "\n") {
			if strings.Contains(l, firstSeen) && strings.Contains(l, newDisco) {
				line = l
			}
		}
		return line != "", "Ferry's log has no line " + strconv.Quote(firstSeen) + " naming " + newDisco
	}); err != nil {
		t.Fatalf("after %s's restart (disco key %s → %s) Ferry allocated no endpoint naming the new key: %v",
			bed.A.Name, oldDisco, newDisco, err)
	}
	after, err := metrics()
	if err != nil {
		t.Fatal(err)
	}
	const allocs = `ferry_peer_relay_allocations_total{result="new"}`
	if _, ok := after[allocs]; !ok {
		t.Fatalf("peer relay metrics: no %s", allocs)
	}
	if after[allocs] <= before[allocs] {
		t.Fatalf("after %s's restart (new disco key) the path is back but Ferry made no new allocation: %s %v → %v",
			bed.A.Name, allocs, before[allocs], after[allocs])
	}
	in1, out1, err := bed.PeerRelayBytes()
	if err != nil {
		t.Fatal(err)
	}
	if in1 == in0 || out1 == out0 {
		t.Fatalf("after %s's restart the port counted %d bytes in, %d out", bed.A.Name, in1-in0, out1-out0)
	}
	st, err := bed.A.Status()
	if err != nil {
		t.Fatal(err)
	}
	vni := peerRelayVNI(st.PeerNamed(bed.B.Name), prefix)
	if vni == "" || vni == freedVNI {
		t.Fatalf("back via the peer relay, %s's status of %s: %q, want a VNI other than the freed %s",
			bed.A.Name, bed.B.Name, peerRelayOf(st.PeerNamed(bed.B.Name)), freedVNI)
	}
	t.Logf("%s restarted (new disco key): via the peer relay again after %.1f s, %v new allocations, VNI %s (was %s); Ferry: %s",
		bed.A.Name, time.Since(start).Seconds(), after[allocs]-before[allocs], vni, freedVNI, line)
}

// checkFerryStatus: `ferry status` shows the tailnet node registered,
// its home region and the peer relay's open endpoints.
func checkFerryStatus(t *testing.T, bed *testbed.Bed, relayName string) {
	out, err := bed.PeerRelayStatus()
	if err != nil {
		t.Fatalf("ferry status: %v\n%s", err, out)
	}
	for _, want := range []string{
		fmt.Sprintf("tailnet      registered  %s (nodekey:", relayName),
		"home region 900",
		"peer relay   endpoints connecting ",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("ferry status lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "open 0") || !strings.Contains(out, "allocations existing ") {
		t.Fatalf("ferry status: no open endpoint or no allocations:\n%s", out)
	}
	t.Logf("ferry status:\n%s", out)
}

// waitRelayNode waits until both nodes see the relay node (one node of
// that name) with its tag and its home DERP region (PreferredDERP, reported once Ferry's DERP
// client is connected).
func waitRelayNode(t *testing.T, bed *testbed.Bed, relayName string) {
	t.Helper()
	for _, n := range []*testbed.Node{bed.A, bed.B} {
		if err := waitFor(45*time.Second, func() (bool, string) {
			st, err := n.Status()
			if err != nil {
				return false, err.Error()
			}
			same := 0
			for _, p := range st.Peer {
				if strings.EqualFold(p.HostName, relayName) {
					same++
				}
			}
			if same > 1 {
				return false, fmt.Sprintf("%s sees %d nodes named %s", n.Name, same, relayName)
			}
			p := st.PeerNamed(relayName)
			if p == nil {
				return false, fmt.Sprintf("%s has no peer %s", n.Name, relayName)
			}
			tagged := false
			for _, tag := range p.Tags {
				tagged = tagged || tag == testbed.PeerRelayTag
			}
			return tagged && p.Relay == "fe" && p.Online, fmt.Sprintf("%s sees %s with tags %v, home region %q, online %v", n.Name, relayName, p.Tags, p.Relay, p.Online)
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// pingViaPeerRelay runs tailscale ping both ways until the path is the
// peer relay (the clients look for one in their path discovery, driven
// by traffic), never direct.
func pingViaPeerRelay(t *testing.T, bed *testbed.Bed, within time.Duration) {
	t.Helper()
	a, b := bed.A, bed.B
	want := "via peer-relay(" + bed.PeerRelayAddr + ":vni:"
	for _, pair := range [][2]*testbed.Node{{a, b}, {b, a}} {
		from, to := pair[0], pair[1]
		var out string
		if err := waitFor(within, func() (bool, string) {
			out, _ = from.TailscalePing(to.IP, 3)
			if strings.Contains(out, "via 10.78.") {
				t.Fatalf("tailscale ping %s→%s went direct, the UDP block failed:\n%s", from.Name, to.Name, out)
			}
			return strings.Contains(out, want), out
		}); err != nil {
			t.Fatalf("tailscale ping %s→%s never went %s...): %v", from.Name, to.Name, want, err)
		}
		t.Logf("tailscale ping %s→%s: %s", from.Name, to.Name, firstLineWith(out, "via peer-relay"))
	}

}

func peerRelayOf(p *testbed.PeerStatus) string {
	if p == nil {
		return "(no such peer)"
	}
	return p.PeerRelay
}

// waitFor calls check until it reports done or timeout passes (at least
// once; at most one call a second); the error carries check's last word.
func waitFor(timeout time.Duration, check func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	for {
		done, why := check()
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %s", timeout, why)
		}
		time.Sleep(time.Second)
	}
}

//go:build linux

package main

// The lossy long-haul comparison (-longhaul, or -rtt and -loss with
// -peer-relay): the bed's nodes get a round trip and a loss rate on their
// uplinks (testbed.Bed.DelayUplinks), so that the peer relays and DERP
// alone (derp-derper, derp-ferry: no peer relay, the DERP server on the
// relay's CPUs) cross the same long, lossy path. Before the relay starts,
// a UDP blast from node A into the relay's namespace (no tunnel) measures
// what the user-space delay line can carry at most; during each iperf3
// run its counters say what it did carry and what loss was achieved.

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"log"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"ferry.invalid/interop/e2e/testbed"
)

var (
	flagLongHaul = flag.Bool("longhaul", false, "the lossy long-haul comparison: -peer-relay with, unless given, -rtt 150ms -loss 1 -flows 1 -peer-relays ferry,tailscaled,derp-derper,derp-ferry")
	flagRTT      = flag.Duration("rtt", 0, "with -peer-relay: round trip added between the nodes, half on each node's uplink (scripts/lib/link-delay.py); 0: none")
	flagLoss     = flag.Float64("loss", 0, "with -rtt: loss on each node's uplink, percent of packets (steps of 0.1)")
	flagCC       = flag.String("congestion", "", "with -peer-relay: TCP congestion control (e.g. cubic) of iperf3's flow (-C) and of every connection on the bed's network (the nodes' TCP to DERP); empty: the machine's default (recorded)")
)

// The DERP-only kinds of -peer-relays: no peer relay, DERP through derper
// or through Ferry.
const (
	derpOnlyDerper = "derp-derper"
	derpOnlyFerry  = "derp-ferry"
)

// derpOnlyKind is the DERP server of a DERP-only kind, or "".
func derpOnlyKind(kind string) string {
	switch kind {
	case derpOnlyDerper:
		return testbed.Derper
	case derpOnlyFerry:
		return testbed.Ferry
	}
	return ""
}

// applyLongHaul turns -longhaul into -peer-relay and the long-haul
// defaults of every flag not given on the command line.
func applyLongHaul() {
	if !*flagLongHaul {
		return
	}
	*flagPeerRelay = true
	given := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { given[f.Name] = true })
	defaults := map[string]string{
		"rtt":         "150ms",
		"loss":        "1",
		"flows":       "1",
		"peer-relays": strings.Join([]string{"ferry", "tailscaled", derpOnlyDerper, derpOnlyFerry}, ","),
	}
	for name, v := range defaults {
		if !given[name] {
			if err := flag.Set(name, v); err != nil {
				panic(err)
			}
		}
	}
}

// LongHaulSample is the path one sample ran on.
type LongHaulSample struct {
	RTTms       float64 // round trip added (-rtt)
	LossPercent float64 // loss per uplink (-loss)
	// Congestion: iperf3's TCP congestion control (-congestion); Outer:
	// node A's default, which its TCP connection to DERP uses.
	Congestion, OuterCongestion string
	// IdleRTTms: ICMP ping A→B through the tunnel, idle, once the path is
	// the one named (median of 20).
	IdleRTTms float64
	// The delay line's ceiling: during a UDP blast (1300-byte datagrams,
	// 1 Gbit/s offered, 3 s) from node A into the relay's namespace, not
	// through the tunnel, the packets and bytes that came out of the
	// line (its counters), per second.
	CeilingPps, CeilingMbps float64
	// CeilingArrivedPps: of those, what iperf3's receiver counted.
	CeilingArrivedPps float64
}

// LineSample is what the delay line carried during one iperf3 run (both
// uplinks, both directions of the flow).
type LineSample struct {
	// Packets out of the delay line: dropped as loss, and delivered.
	LostPackets, PassedPackets int64
	LossPercent                float64 // achieved: lost / (lost + passed)
	PacketsPerSec, Mbps        float64 // out of the line, lost ones included
	// IntoMB and OutMB: bytes into the line and out of it (a difference
	// beyond what is in flight is the line's own queue overflowing).
	IntoMB, OutMB float64
}

func lineSample(d testbed.LongHaulCounters, secs float64) *LineSample {
	l := &LineSample{
		LostPackets:   d.LostPackets,
		PassedPackets: d.PassedPackets,
		IntoMB:        float64(d.IntoBytes) / 1e6,
		OutMB:         float64(d.LostBytes+d.PassedBytes) / 1e6,
	}
	if n := d.LostPackets + d.PassedPackets; n > 0 {
		l.LossPercent = 100 * float64(d.LostPackets) / float64(n)
	}
	if secs > 0 {
		l.PacketsPerSec = float64(d.LostPackets+d.PassedPackets) / secs
		l.Mbps = float64(d.LostBytes+d.PassedBytes) * 8 / secs / 1e6
	}
	return l
}

// lineOf is f's LineSample, or a zero one.
func lineOf(f FlowSample) LineSample {
	if f.Line == nil {
		return LineSample{}
	}
	return *f.Line
}

// lossPermille is -loss in per mille, checked.
func lossPermille() (int, error) {
	p := math.Round(*flagLoss * 10)
	if *flagLoss < 0 || p >= 1000 || math.Abs(p-*flagLoss*10) > 1e-6 {
		return 0, fmt.Errorf("-loss %v: want 0 ≤ loss < 100, in steps of 0.1", *flagLoss)
	}
	return int(p), nil
}

// delayLineScript is scripts/lib/link-delay.py beside the interop module.
func delayLineScript() (string, error) {
	if *flagRTT <= 0 {
		return "", nil
	}
	if _, err := lossPermille(); err != nil {
		return "", err
	}
	dir, err := moduleRoot()
	if err != nil {
		return "", err
	}
	script := filepath.Join(filepath.Dir(dir), "scripts", "lib", "link-delay.py")
	if _, err := os.Stat(script); err != nil {
		return "", fmt.Errorf("the delay line: %w", err)
	}
	return script, nil
}

// longHaul puts the long-haul path on bed and measures the delay line's
// ceiling.
func longHaul(bed *testbed.Bed, script string) (*testbed.LongHaul, *LongHaulSample, error) {
	permille, err := lossPermille()
	if err != nil {
		return nil, nil, err
	}
	lh, err := bed.DelayUplinks(script, *flagRTT/2, permille)
	if err != nil {
		return nil, nil, fmt.Errorf("long-haul path: %w", err)
	}
	ls := &LongHaulSample{RTTms: float64(*flagRTT) / float64(time.Millisecond), LossPercent: *flagLoss}
	if ls.OuterCongestion, err = testbed.Congestion(bed.A.NS); err != nil {
		return nil, nil, err
	}
	ls.Congestion = cmp.Or(*flagCC, ls.OuterCongestion)
	relay := bed.RelayNode()
	srv, err := testbed.StartIperfServer(relay)
	if err != nil {
		return nil, nil, err
	}
	defer srv.Stop(2 * time.Second)
	c0, err := lh.Counters()
	if err != nil {
		return nil, nil, err
	}
	const secs = 3
	r, err := testbed.Iperf(bed.A, relay, testbed.IperfOptions{Duration: secs * time.Second, UDPRate: "1G", UDPLen: 1300})
	if err != nil {
		return nil, nil, fmt.Errorf("delay line ceiling: %w", err)
	}
	c1, err := lh.Counters()
	if err != nil {
		return nil, nil, err
	}
	// Over the blast's 3 s; the iperf3 control connection adds a few
	// packets.
	d := c1.Sub(c0)
	ls.CeilingPps = float64(d.LostPackets+d.PassedPackets) / secs
	ls.CeilingMbps = float64(d.LostBytes+d.PassedBytes) * 8 / secs / 1e6
	ls.CeilingArrivedPps = float64(r.Packets-r.LostPackets) / secs
	log.Printf("   delay line ceiling: %.0f packets/s, %.0f Mbit/s out of the line during a 1 Gbit/s UDP blast (%.0f packets/s reached iperf3)", ls.CeilingPps, ls.CeilingMbps, ls.CeilingArrivedPps)
	return lh, ls, nil
}

// checkRTT pings A→B through the tunnel and fails unless the round trip
// is at least 90 % of -rtt: the delay is on the path.
func checkRTT(bed *testbed.Bed, ls *LongHaulSample) error {
	p, err := testbed.Ping(bed.A, bed.B.IP, 20, 100*time.Millisecond)
	if err != nil {
		return err
	}
	if len(p.RTTms) == 0 {
		return errors.New("no ping through the tunnel answered")
	}
	ls.IdleRTTms = p.Percentile(0.5)
	log.Printf("   ping through the tunnel: %.1f ms (median of %d), %.0f%% lost", ls.IdleRTTms, p.Received, 100*p.Loss())
	if ls.IdleRTTms < 0.9*ls.RTTms {
		return fmt.Errorf("ping through the tunnel took %.1f ms, less than the %.0f ms the path should add", ls.IdleRTTms, ls.RTTms)
	}
	return nil
}

// parseFlows parses -flows ("1,4").
func parseFlows(list string) ([]int, error) {
	var flows []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 128 {
			return nil, fmt.Errorf("-flows %q: want a list of flow counts (1-128)", list)
		}
		flows = append(flows, n)
	}
	return flows, nil
}

//go:build linux

package main

// The peer-relay comparison (-peer-relay): Ferry's peer relay against
// tailscaled's own on the e2e test's peer-relay bed (Headscale with the
// cap/relay grant, two tailscaled nodes whose direct UDP is blocked, the
// bed's Ferry as their DERP server). Per relay and repetition, on a fresh
// bed: the path is checked to be the peer relay, then iperf3 TCP A→B with
// one flow and with four, each with the peer relay's CPU time
// (/proc/<pid>/stat, all threads) and the bytes its port sent (nftables)
// around it. The peer relay runs alone on -relay-cpus; the nodes, iperf3,
// ping and the DERP server on -node-cpus (Headscale unpinned).

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"ferry.invalid/interop/e2e/testbed"
)

var (
	flagPeerRelay  = flag.Bool("peer-relay", false, "compare peer relays instead of DERP relays: -peer-relays on the peer-relay bed, iperf3 TCP with 1 and 4 flows, the peer relay's CPU per Gbit/s")
	flagPeerRelays = flag.String("peer-relays", "ferry,tailscaled", "with -peer-relay: peer relays to compare, in order; derp-derper and derp-ferry are no peer relay at all (DERP only, through that DERP server, which then runs on -relay-cpus; they need -rtt)")
	flagFlows      = flag.String("flows", "1,4", "with -peer-relay: iperf3 TCP runs, by number of parallel flows")
	flagRetries    = flag.Int("retries", 1, "with -peer-relay: how often a failed sample is tried again on a fresh bed before the run fails")
)

// PeerRelaySample is one peer relay's measurements in one repetition.
type PeerRelaySample struct {
	Relay  string
	Repeat int
	Path   string // `tailscale ping` A→B's last line
	Flows  []FlowSample
	// Failed: the errors of the attempts before this sample (-retries).
	Failed []string `json:",omitempty"`
	// LongHaul: the delay and loss on the path (with -rtt).
	LongHaul *LongHaulSample `json:",omitempty"`
	// AfterIdle: with -after-idle, the path after the idle spell.
	AfterIdle *IdleSample `json:",omitempty"`
	// LoadAvg and BusyBefore as in Sample.
	LoadAvg    string
	BusyBefore float64
}

// FlowSample is one iperf3 TCP run through the peer relay.
type FlowSample struct {
	Streams     int
	Mbps        float64 // iperf3 receiver
	Retransmits int64
	PortOutMB   float64 // bytes the peer relay's port sent, in MB
	RelayCPU    float64 // the peer relay's CPU seconds per second
	// CoresPerGbps is the peer relay's CPU seconds per Gbit its port
	// sent: cores busy per Gbit/s relayed.
	CoresPerGbps float64
	// ICMP RTT through the tunnel during the run: median and p99, ms.
	LoadedRTTms, LoadedRTTp99ms float64
	// UDP receive-buffer overflows (RcvbufErrors) during the run in the
	// namespaces of the relay and of the receiving node B: datagrams lost
	// before anyone read them.
	RelayRcvbufErrors, NodeBRcvbufErrors int64
	// RelayDrops: Ferry's drop counters that moved during the run
	// (ferry_udp_drops_total by reason, socket drops, the peer relay's
	// drops); tailscaled has none to read.
	RelayDrops []string
	// DerpDrops: the DERP server's derp_packets_dropped during the run
	// (DERP-only kinds). SenderDERPDrops: packets node A's tailscaled
	// dropped because its queue towards DERP was full (as Sample's
	// SenderDrops).
	DerpDrops, SenderDERPDrops float64
	// Line: what the long-haul delay line carried during the run (-rtt).
	Line *LineSample `json:",omitempty"`
}

// ferryDropSeries are the Ferry series whose growth during a run
// FlowSample.RelayDrops lists.
var ferryDropSeries = []string{"ferry_udp_drops_total", "ferry_udp_socket_drops_total", "ferry_udp_peer_relay_drops_total"}

func runPeerRelay(bins testbed.Binaries) error {
	relays := strings.Split(*flagPeerRelays, ",")
	for _, k := range relays {
		switch k {
		case "ferry", "tailscaled":
		case derpOnlyDerper, derpOnlyFerry:
			if *flagRTT <= 0 {
				return fmt.Errorf("-peer-relays %s needs -rtt (its path check counts the DERP port's bytes in the long-haul table)", k)
			}
		default:
			return fmt.Errorf("-peer-relays: unknown %q (want ferry, tailscaled, %s, %s)", k, derpOnlyDerper, derpOnlyFerry)
		}
	}
	flows, err := parseFlows(*flagFlows)
	if err != nil {
		return err
	}
	script, err := delayLineScript()
	if err != nil {
		return err
	}
	samples, err := interleaved(relays, func(kind string, rep int) (PeerRelaySample, error) {
		// A failed attempt (a path that is not the one named, a stalled
		// tunnel) is no sample: it is logged, kept in the JSON and the
		// table, and tried again on a fresh bed up to -retries times.
		var failed []string
		for attempt := 0; ; attempt++ {
			s, err := measurePeerRelay(bins, kind, rep, flows, script)
			s.Failed = failed
			if err == nil {
				return s, nil
			}
			if attempt >= *flagRetries {
				return s, fmt.Errorf("peer relay: %w", err)
			}
			failed = append(failed, err.Error())
			log.Printf("   FAILED (%v): trying %s, repetition %d again on a fresh bed", err, kind, rep+1)
		}
	})
	if err != nil {
		return err
	}
	printPeerRelayTable(relays, flows, samples)
	return nil
}

func measurePeerRelay(bins testbed.Binaries, kind string, rep int, flows []int, script string) (s PeerRelaySample, err error) {
	s = PeerRelaySample{Relay: kind, Repeat: rep + 1}
	s.BusyBefore, s.LoadAvg = machineBefore()
	log.Printf("== %s, repetition %d", kind, rep+1)
	// The DERP server only carries disco and the first packets; it
	// shares the nodes' CPUs. Without a peer relay it carries everything
	// and takes the peer relay's place.
	derp := testbed.DerpServerOptions{Kind: testbed.Ferry, Place: testbed.Placement{CPUs: *flagNodeCPU}}
	derpOnly := derpOnlyKind(kind)
	if derpOnly != "" {
		derp = testbed.DerpServerOptions{Kind: derpOnly, Place: testbed.Placement{CPUs: *flagRelayCPU, Nice: *flagNice}}
		if derpOnly == testbed.Ferry {
			derp.Workers = 1
		}
	}
	bed := testbed.New(testbed.Config{
		Bins:           bins,
		Relay:          derp,
		Policy:         testbed.PeerRelayPolicy,
		NodePlace:      testbed.Placement{CPUs: *flagNodeCPU, Nice: *flagNice},
		PeerRelayPlace: testbed.Placement{CPUs: *flagRelayCPU, Nice: *flagNice},
		Congestion:     *flagCC,
		Logf:           log.Printf,
	})
	defer bed.Close()
	defer func() {
		if err != nil {
			log.Printf("process output:\n%s", bed.Logs(40))
		}
	}()
	if err := bed.Up(); err != nil {
		return s, err
	}
	var lh *testbed.LongHaul
	if *flagRTT > 0 {
		if lh, s.LongHaul, err = longHaul(bed, script); err != nil {
			return s, err
		}
	}
	var proc *testbed.Proc
	switch {
	case derpOnly != "":
		proc = bed.Relay.Proc
	case kind == "ferry":
		proc, err = bed.StartFerryPeerRelay("fe-relay")
	default:
		var n *testbed.Node
		n, err = bed.StartTailscaledPeerRelay("fe-ref")
		if n != nil {
			proc = n.Proc
		}
	}
	if err != nil {
		return s, fmt.Errorf("starting the peer relay: %w", err)
	}
	a, b := bed.A, bed.B
	want, label := "via peer-relay("+bed.PeerRelayAddr+":vni:", "via peer-relay"
	if derpOnly != "" {
		want, label = "via DERP(", "via DERP("
	}
	if s.Path, err = waitPath(bed, want, label); err != nil {
		return s, err
	}
	log.Printf("   %s", s.Path)
	if lh != nil {
		if err := checkRTT(bed, s.LongHaul); err != nil {
			return s, err
		}
	}
	srv, err := testbed.StartIperfServer(b)
	if err != nil {
		return s, err
	}
	bed.AddProc(srv)
	for _, streams := range flows {
		cpu0, err := proc.CPUSeconds()
		if err != nil {
			return s, err
		}
		var lc0 testbed.LongHaulCounters
		if lh != nil {
			if lc0, err = lh.Counters(); err != nil {
				return s, err
			}
		}
		var out0 int64
		if derpOnly == "" {
			if _, out0, err = bed.PeerRelayBytes(); err != nil {
				return s, err
			}
		}
		relayUDP0, err1 := testbed.UDPCounters(bed.Netns.Relay)
		nodeUDP0, err2 := testbed.UDPCounters(b.NS)
		if err := errors.Join(err1, err2); err != nil {
			return s, err
		}
		var m0 testbed.Metrics
		switch {
		case kind == "ferry":
			m0, err = bed.PeerRelayMetrics()
		case derpOnly != "":
			m0, err = bed.Relay.Metrics()
		}
		if err != nil {
			return s, err
		}
		ca0, err := a.ClientMetrics()
		if err != nil {
			return s, err
		}
		t0 := time.Now()
		r, loaded, err := iperfWithPing(a, b, testbed.IperfOptions{Duration: *flagDuration, Streams: streams, Congestion: *flagCC})
		if err != nil {
			return s, fmt.Errorf("TCP ×%d: %w", streams, err)
		}
		elapsed := time.Since(t0).Seconds()
		cpu1, err := proc.CPUSeconds()
		if err != nil {
			return s, err
		}
		var line *LineSample
		var out1 int64
		if lh != nil {
			lc1, err := lh.Counters()
			if err != nil {
				return s, err
			}
			d := lc1.Sub(lc0)
			line = lineSample(d, elapsed)
			if derpOnly != "" {
				out0, out1 = 0, d.DerpOutBytes
			}
		}
		if derpOnly == "" {
			if _, out1, err = bed.PeerRelayBytes(); err != nil {
				return s, err
			}
		}
		// The bytes must have crossed the port named: the peer relay's,
		// or with DERP only the DERP server's.
		if out1-out0 < r.ReceivedBytes {
			return s, fmt.Errorf("TCP ×%d: iperf3 moved %d bytes but the %s port sent %d: not on that path", streams, r.ReceivedBytes, kind, out1-out0)
		}
		f := FlowSample{
			Streams:     streams,
			Mbps:        r.ReceivedBps / 1e6,
			Retransmits: r.Retransmits,
			PortOutMB:   float64(out1-out0) / 1e6,
			RelayCPU:    (cpu1 - cpu0) / elapsed,
			Line:        line,
		}
		if gbit := float64(out1-out0) * 8 / 1e9; gbit > 0 {
			f.CoresPerGbps = (cpu1 - cpu0) / gbit
		}
		relayUDP1, err1 := testbed.UDPCounters(bed.Netns.Relay)
		nodeUDP1, err2 := testbed.UDPCounters(b.NS)
		if err := errors.Join(err1, err2); err != nil {
			return s, err
		}
		f.LoadedRTTms, f.LoadedRTTp99ms = loaded.Percentile(0.5), loaded.Percentile(0.99)
		f.RelayRcvbufErrors = relayUDP1["RcvbufErrors"] - relayUDP0["RcvbufErrors"]
		f.NodeBRcvbufErrors = nodeUDP1["RcvbufErrors"] - nodeUDP0["RcvbufErrors"]
		switch {
		case kind == "ferry":
			m1, err := bed.PeerRelayMetrics()
			if err != nil {
				return s, err
			}
			for _, name := range ferryDropSeries {
				f.RelayDrops = append(f.RelayDrops, testbed.NonZero(m0, m1, name)...)
			}
		case derpOnly != "":
			m1, err := bed.Relay.Metrics()
			if err != nil {
				return s, err
			}
			f.RelayDrops = testbed.NonZero(m0, m1, "derp_packets_dropped")
			f.DerpDrops = testbed.Delta(m0, m1, "derp_packets_dropped")
		}
		ca1, err := a.ClientMetrics()
		if err != nil {
			return s, err
		}
		f.SenderDERPDrops = clientDrops(ca0, ca1)
		s.Flows = append(s.Flows, f)
		if line != nil {
			log.Printf("   delay line: %.0f packets/s, %.1f Mbit/s out of it, loss %.2f%% (%d of %d)",
				line.PacketsPerSec, line.Mbps, line.LossPercent, line.LostPackets, line.LostPackets+line.PassedPackets)
		}
		log.Printf("   TCP ×%d: %.0f Mbit/s, %d retransmits, port sent %.1f MB, peer relay CPU %.0f%% of a core, %.3f cores per Gbit/s, RTT under load %.2f ms (p99 %.2f), relay drops %v, A's drops towards DERP %.0f, UDP receive-buffer overflows: relay %d, B %d",
			streams, f.Mbps, f.Retransmits, f.PortOutMB, 100*f.RelayCPU, f.CoresPerGbps, f.LoadedRTTms, f.LoadedRTTp99ms, f.RelayDrops, f.SenderDERPDrops, f.RelayRcvbufErrors, f.NodeBRcvbufErrors)
	}
	if *flagAfterIdle > 0 && derpOnly == "" {
		if s.AfterIdle, err = afterIdle(bed, want, s.Path); err != nil {
			return s, err
		}
	}
	return s, nil
}

// waitPath waits (90 s at most) until `tailscale ping` says want both
// ways; it returns A→B's last line holding label.
func waitPath(bed *testbed.Bed, want, label string) (string, error) {
	var last string
	for _, pair := range [][2]*testbed.Node{{bed.A, bed.B}, {bed.B, bed.A}} {
		deadline := time.Now().Add(90 * time.Second)
		for {
			out, _ := pair[0].TailscalePing(pair[1].IP, 3)
			if strings.Contains(out, want) {
				if pair[0] == bed.A {
					last = lastLineWith(out, label)
				}
				break
			}
			if time.Now().After(deadline) {
				return "", fmt.Errorf("tailscale ping %s→%s never went %s…):\n%s", pair[0].Name, pair[1].Name, want, out)
			}
			time.Sleep(time.Second)
		}
	}
	return last, nil
}

func lastLineWith(text, substr string) string {
	lines := strings.Split(text, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], substr) {
			return strings.TrimSpace(lines[i])
		}
	}
	return ""
}

// printPeerRelayTable prints medians and ranges per peer relay, and
// Ferry's cores per Gbit/s as a fraction of tailscaled's; with -rtt also
// the path's figures and each path's throughput as a multiple of DERP's.
func printPeerRelayTable(relays []string, flows []int, samples []PeerRelaySample) {
	type row struct {
		label string
		get   func(FlowSample) float64
		unit  string
		prec  int
	}
	rows := []row{
		{"TCP", func(f FlowSample) float64 { return f.Mbps }, "Mbit/s", 0},
		{"TCP retransmits", func(f FlowSample) float64 { return float64(f.Retransmits) }, "", 0},
		{"relay CPU", func(f FlowSample) float64 { return 100 * f.RelayCPU }, "% of a core", 0},
		{"relay cores per Gbit/s sent", func(f FlowSample) float64 { return f.CoresPerGbps }, "", 3},
		{"ping RTT under load (median)", func(f FlowSample) float64 { return f.LoadedRTTms }, "ms", 2},
		{"ping RTT under load (p99)", func(f FlowSample) float64 { return f.LoadedRTTp99ms }, "ms", 2},
		{"UDP receive-buffer overflows, relay", func(f FlowSample) float64 { return float64(f.RelayRcvbufErrors) }, "", 0},
		{"UDP receive-buffer overflows, node B", func(f FlowSample) float64 { return float64(f.NodeBRcvbufErrors) }, "", 0},
		{"DERP server drops", func(f FlowSample) float64 { return f.DerpDrops }, "packets", 0},
		{"A's tailscaled drops towards DERP (queue full)", func(f FlowSample) float64 { return f.SenderDERPDrops }, "packets", 0},
	}
	if *flagRTT > 0 {
		rows = append(rows,
			row{"uplink loss achieved", func(f FlowSample) float64 { return lineOf(f).LossPercent }, "%", 2},
			row{"delay line carried", func(f FlowSample) float64 { return lineOf(f).PacketsPerSec }, "packets/s", 0},
		)
	}
	values := func(relay string, flow int, get func(FlowSample) float64) []float64 {
		var xs []float64
		for _, s := range samples {
			if s.Relay == relay && flow < len(s.Flows) {
				xs = append(xs, get(s.Flows[flow]))
			}
		}
		return xs
	}
	fmt.Printf("\nPeer relays: %d repetitions, %v per iperf3 run, relay CPUs %q, node CPUs %q, nice %d, %s, %d CPUs.\n",
		*flagRepeats, *flagDuration, *flagRelayCPU, *flagNodeCPU, *flagNice, time.Now().Format("2006-01-02"), runtime.NumCPU())
	if *flagRTT > 0 {
		cc := "?"
		for _, s := range samples {
			if s.LongHaul != nil {
				cc = fmt.Sprintf("%s (outer TCP to DERP: %s)", s.LongHaul.Congestion, s.LongHaul.OuterCongestion)
			}
		}
		fmt.Printf("Long haul: %v round trip added between the nodes, %.1f%% loss on each node's uplink; iperf3 TCP congestion control %s.\n", *flagRTT, *flagLoss, cc)
	}
	fmt.Printf("Median (min–max) over the repetitions.\n\n")
	fmt.Printf("| Metric | %s |\n|---|%s\n", strings.Join(relays, " | "), strings.Repeat("---|", len(relays)))
	failedCells := make([]string, len(relays))
	for i, relay := range relays {
		n := 0
		for _, s := range samples {
			if s.Relay == relay {
				n += len(s.Failed)
			}
		}
		failedCells[i] = strconv.Itoa(n)
	}
	fmt.Printf("| attempts failed and tried again (all repetitions) | %s |\n", strings.Join(failedCells, " | "))
	if *flagRTT > 0 {
		perSample := []struct {
			label string
			get   func(*LongHaulSample) float64
			unit  string
			prec  int
		}{
			{"ping RTT through the tunnel, idle (median)", func(l *LongHaulSample) float64 { return l.IdleRTTms }, "ms", 1},
			{"delay line ceiling (UDP blast, no tunnel)", func(l *LongHaulSample) float64 { return l.CeilingPps }, "packets/s", 0},
			{"delay line ceiling (UDP blast, no tunnel)", func(l *LongHaulSample) float64 { return l.CeilingMbps }, "Mbit/s", 0},
		}
		for _, r := range perSample {
			cells := make([]string, len(relays))
			for i, relay := range relays {
				var xs []float64
				for _, s := range samples {
					if s.Relay == relay && s.LongHaul != nil {
						xs = append(xs, r.get(s.LongHaul))
					}
				}
				cells[i] = summarize(xs, r.prec, r.unit)
			}
			fmt.Printf("| %s | %s |\n", r.label, strings.Join(cells, " | "))
		}
	}
	for flow, streams := range flows {
		for _, r := range rows {
			cells := make([]string, len(relays))
			for i, relay := range relays {
				cells[i] = summarize(values(relay, flow, r.get), r.prec, r.unit)
			}
			fmt.Printf("| %s, %d flow(s) | %s |\n", r.label, streams, strings.Join(cells, " | "))
		}
	}
	fmt.Println()
	if slices.Contains(relays, "ferry") && slices.Contains(relays, "tailscaled") {
		for flow, streams := range flows {
			get := func(f FlowSample) float64 { return f.CoresPerGbps }
			fe, ts := values("ferry", flow, get), values("tailscaled", flow, get)
			if len(fe) == 0 || len(ts) == 0 {
				continue
			}
			mt := median(ts)
			if mt > 0 {
				fmt.Printf("%d flow(s): Ferry's cores per Gbit/s are %.2f× tailscaled's (medians).\n", streams, median(fe)/mt)
			}
		}
	}
	for _, base := range []string{derpOnlyDerper, derpOnlyFerry} {
		if !slices.Contains(relays, base) {
			continue
		}
		for flow, streams := range flows {
			get := func(f FlowSample) float64 { return f.Mbps }
			b := values(base, flow, get)
			if len(b) == 0 || median(b) <= 0 {
				continue
			}
			for _, relay := range relays {
				if xs := values(relay, flow, get); derpOnlyKind(relay) == "" && len(xs) > 0 {
					fmt.Printf("%d flow(s): %s's TCP throughput is %.1f× %s's (medians).\n", streams, relay, median(xs)/median(b), base)
				}
			}
		}
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

//go:build linux

// Command tunnelbench measures the quality of a Tailscale tunnel carried by
// a DERP relay: two real tailscaled nodes whose direct UDP is blocked talk
// through ferry or derper (package testbed builds the network), and iperf3
// and ping measure what an application sees. With -peer-relay it compares
// peer relays instead (Ferry's and tailscaled's, see peerrelay.go).
//
// Per relay and repetition, on a fresh network:
//
//   - idle latency: ICMP ping RTT through the tunnel, no other traffic;
//   - TCP: one iperf3 stream A→B for -duration: throughput and TCP
//     retransmits, with a ping running alongside (latency under load), the
//     relay's drop counters and its CPU time;
//   - TCP with 4 parallel streams;
//   - UDP at each -udp-rates target (1200-byte datagrams, below the
//     tunnel's 1280-byte MTU): throughput received and loss.
//
// The relays alternate within each repetition (the order flips every
// repetition) so that drift on the machine hits both. Results: a Markdown
// table (medians, min–max) on standard output and every sample as JSON in
// -out. Run it as root; bench/tunnel/run.sh builds what it needs.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"ferry.invalid/interop/e2e/testbed"
)

var (
	flagRelays   = flag.String("relays", "ferry,derper,direct", "relays to compare, in order; \"direct\" is the baseline: UDP between the nodes left open, so WireGuard goes direct and no relay carries the traffic")
	flagTLS      = flag.Bool("tls", true, "DERP over TLS (false: plain HTTP)")
	flagRepeats  = flag.Int("repeats", 3, "repetitions per relay (each on a fresh network)")
	flagDuration = flag.Duration("duration", 10*time.Second, "length of each iperf3 run")
	flagRates    = flag.String("udp-rates", "100M,300M,600M", "iperf3 UDP target rates")
	flagRelayCPU = flag.String("relay-cpus", "0", "taskset CPU list for the relay (empty: unpinned)")
	flagNodeCPU  = flag.String("node-cpus", "1", "taskset CPU list for tailscaled, iperf3 and ping (empty: unpinned)")
	flagNice     = flag.Int("nice", -20, "nice value for the relay, tailscaled, iperf3 and ping, so that other work on the machine disturbs them less (0: unchanged)")
	flagWorkers  = flag.Int("ferry-workers", 0, "ferry --workers (0: one per CPU in -relay-cpus)")
	flagFerryArg = flag.String("ferry-args", "", "extra ferry flags, space-separated (e.g. \"--send-queue-bytes 65536\")")
	flagFerry    = flag.String("ferry", "", "ferry binary (default: $FERRY_BIN, ../target/release/ferry, ../target/debug/ferry)")
	flagOut      = flag.String("out", "", "write every sample as JSON to this file")
	flagIdle     = flag.Float64("wait-idle", 0.25, "before each sample, wait until the machine's CPUs are busier than this fraction no more (0: don't wait)")
	flagIdleMax  = flag.Duration("wait-idle-max", 3*time.Minute, "longest wait for -wait-idle; the sample is taken anyway after it")
)

// Sample is one relay's measurements in one repetition.
type Sample struct {
	Relay  string
	Repeat int

	IdleRTTms float64 // median

	TCPMbps        float64
	TCPRetransmits int64
	LoadedRTTms    float64 // median RTT during the TCP run
	LoadedRTTp99ms float64
	LoadedLoss     float64 // fraction of pings lost during the TCP run
	RelayDrops     float64 // derp_packets_dropped during the TCP run
	RelayDropsBy   []string
	RelayCPU       float64 // relay CPU seconds per second during the TCP run
	// Packets tailscaled dropped itself during the TCP run because its
	// queue towards the relay was full (magicsock_send_derp_dropped and
	// _error_queue): on A (data) and B (ACKs).
	SenderDrops, ReceiverDrops float64
	LoadAvg                    string  // /proc/loadavg before the run
	BusyBefore                 float64 // CPU busy fraction (all CPUs) just before the run, none of it ours

	TCP4Mbps        float64
	TCP4Retransmits int64

	UDP []UDPSample
}

// UDPSample is one UDP run at a target rate.
type UDPSample struct {
	Rate        string
	Mbps        float64 // received
	LossPercent float64
	JitterMs    float64
	RelayDrops  float64 // derp_packets_dropped during the run
	SenderDrops float64 // tailscaled's own drops on A (see Sample)
}

func main() {
	flag.Parse()
	applyLongHaul()
	log.SetFlags(log.Ltime)
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	if err := testbed.Preflight(); err != nil {
		return fmt.Errorf("cannot run: %v", err)
	}
	testbed.Reap(log.Printf)
	moduleDir, err := moduleRoot()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	bins, err := testbed.EnsureBinaries(ctx, moduleDir, filepath.Join(moduleDir, "bin"), log.Printf)
	if err != nil {
		return err
	}
	if *flagFerry != "" {
		os.Setenv("FERRY_BIN", *flagFerry)
	}
	if *flagPeerRelay {
		if bins.Ferry, err = testbed.LocateFerry(moduleDir); err != nil {
			return err
		}
		log.Printf("ferry: %s", bins.Ferry)
		return runPeerRelay(bins)
	}
	relays := strings.Split(*flagRelays, ",")
	for _, k := range relays {
		if k != testbed.Ferry && k != testbed.Derper && k != direct {
			return fmt.Errorf("-relays: unknown %q (want ferry, derper, direct)", k)
		}
	}
	if slices.Contains(relays, testbed.Ferry) {
		if bins.Ferry, err = testbed.LocateFerry(moduleDir); err != nil {
			return err
		}
		log.Printf("ferry: %s", bins.Ferry)
	}
	var rates []string
	if *flagRates != "" {
		rates = strings.Split(*flagRates, ",")
	}

	samples, err := interleaved(relays, func(kind string, rep int) (Sample, error) {
		return measure(bins, kind, rep, rates)
	})
	if err != nil {
		return err
	}
	printTable(relays, rates, samples)
	return nil
}

// interleaved measures every relay -repeats times, the relays alternating
// within a repetition and their order flipped every repetition (so that
// drift on the machine hits all of them), and writes the samples to -out.
func interleaved[S any](relays []string, measure func(kind string, rep int) (S, error)) ([]S, error) {
	var samples []S
	for rep := range *flagRepeats {
		order := slices.Clone(relays)
		if rep%2 == 1 {
			slices.Reverse(order)
		}
		for _, kind := range order {
			s, err := measure(kind, rep)
			if err != nil {
				return nil, fmt.Errorf("%s, repetition %d: %w", kind, rep+1, err)
			}
			samples = append(samples, s)
		}
	}
	if *flagOut != "" {
		b, _ := json.MarshalIndent(samples, "", "  ")
		if err := os.WriteFile(*flagOut, append(b, '\n'), 0o644); err != nil {
			return nil, err
		}
	}
	return samples, nil
}

// moduleRoot finds the interop module directory (holding go.mod) from the
// working directory upwards.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for range 10 {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module ferry.invalid/interop") {
			return dir, nil
		}
		dir = filepath.Dir(dir)
	}
	return "", errors.New("run tunnelbench from inside the interop module (bench/tunnel/run.sh does)")
}

// direct names the baseline: no relay on the data path.
const direct = "direct"

// columnName is a relay's name in the results ("ferry-tls", "direct").
func columnName(kind string) string {
	if kind == direct {
		return direct
	}
	return testbed.DerpServerOptions{Kind: kind, TLS: *flagTLS}.Name()
}

func measure(bins testbed.Binaries, kind string, rep int, rates []string) (s Sample, err error) {
	relayKind := kind
	if kind == direct {
		// derper still serves DERP (disco, the first packets), but the
		// nodes switch to their direct UDP path.
		relayKind = testbed.Derper
	}
	opts := testbed.DerpServerOptions{Kind: relayKind, TLS: *flagTLS, Workers: *flagWorkers,
		Place: testbed.Placement{CPUs: *flagRelayCPU, Nice: *flagNice}}
	if relayKind == testbed.Ferry {
		if opts.Workers == 0 && *flagRelayCPU != "" {
			opts.Workers = cpuCount(*flagRelayCPU)
		}
		opts.ExtraArgs = strings.Fields(*flagFerryArg)
	}
	s = Sample{Relay: columnName(kind), Repeat: rep + 1}
	s.BusyBefore, s.LoadAvg = machineBefore()
	log.Printf("== %s, repetition %d", s.Relay, rep+1)
	bed := testbed.New(testbed.Config{Bins: bins, Relay: opts, NodePlace: testbed.Placement{CPUs: *flagNodeCPU, Nice: *flagNice}, AllowDirectUDP: kind == direct, Logf: log.Printf})
	defer bed.Close()
	defer func() {
		if err != nil {
			log.Printf("process output:\n%s", bed.Logs(40))
		}
	}()
	if err := bed.Up(); err != nil {
		return s, err
	}
	a, b := bed.A, bed.B
	// Warm the path (the first disco ping after login often times out)
	// and make sure it is the one to measure.
	want := "via DERP("
	if kind == direct {
		want = "via " + testbed.NodeBIP + ":"
	}
	onPath := false
	for range 5 {
		out, _ := a.TailscalePing(b.IP, 5)
		if strings.Contains(out, want) {
			onPath = true
			break
		}
	}
	if !onPath {
		return s, fmt.Errorf("tailscale ping never went %s", want)
	}
	srv, err := testbed.StartIperfServer(b)
	if err != nil {
		return s, err
	}
	bed.AddProc(srv)

	idle, err := testbed.Ping(a, b.IP, 20, 100*time.Millisecond)
	if err != nil {
		return s, err
	}
	s.IdleRTTms = idle.Percentile(0.5)

	// One TCP stream, with a ping alongside and the relay's counters and
	// CPU time around it.
	m0, err := bed.Relay.Metrics()
	if err != nil {
		return s, err
	}
	cpu0, _ := bed.Relay.CPUSeconds()
	ca0, errA := a.ClientMetrics()
	cb0, errB := b.ClientMetrics()
	if err := errors.Join(errA, errB); err != nil {
		return s, err
	}
	t0 := time.Now()
	tcp, loaded, err := iperfWithPing(a, b, testbed.IperfOptions{Duration: *flagDuration})
	if err != nil {
		return s, fmt.Errorf("TCP: %w", err)
	}
	cpu1, _ := bed.Relay.CPUSeconds()
	elapsed := time.Since(t0).Seconds()
	m1, err := bed.Relay.Metrics()
	if err != nil {
		return s, err
	}
	ca1, errA := a.ClientMetrics()
	cb1, errB := b.ClientMetrics()
	if err := errors.Join(errA, errB); err != nil {
		return s, err
	}
	s.SenderDrops = clientDrops(ca0, ca1)
	s.ReceiverDrops = clientDrops(cb0, cb1)
	s.TCPMbps = tcp.ReceivedBps / 1e6
	s.TCPRetransmits = tcp.Retransmits
	s.LoadedRTTms = loaded.Percentile(0.5)
	s.LoadedRTTp99ms = loaded.Percentile(0.99)
	s.LoadedLoss = loaded.Loss()
	s.RelayDrops = testbed.Delta(m0, m1, "derp_packets_dropped")
	s.RelayDropsBy = testbed.NonZero(m0, m1, "derp_packets_dropped")
	s.RelayCPU = (cpu1 - cpu0) / elapsed
	log.Printf("   TCP %.0f Mbit/s, %d retransmits, RTT under load %.2f ms (p99 %.2f), relay drops %v, tailscaled drops %.0f (A) %.0f (B), relay CPU %.0f%%",
		s.TCPMbps, s.TCPRetransmits, s.LoadedRTTms, s.LoadedRTTp99ms, s.RelayDropsBy, s.SenderDrops, s.ReceiverDrops, 100*s.RelayCPU)

	tcp4, err := testbed.Iperf(a, b, testbed.IperfOptions{Duration: *flagDuration, Streams: 4})
	if err != nil {
		return s, fmt.Errorf("TCP ×4: %w", err)
	}
	s.TCP4Mbps = tcp4.ReceivedBps / 1e6
	s.TCP4Retransmits = tcp4.Retransmits
	log.Printf("   TCP ×4 %.0f Mbit/s, %d retransmits", s.TCP4Mbps, s.TCP4Retransmits)

	for _, rate := range rates {
		m0, err := bed.Relay.Metrics()
		if err != nil {
			return s, err
		}
		c0, err := a.ClientMetrics()
		if err != nil {
			return s, err
		}
		u, err := testbed.Iperf(a, b, testbed.IperfOptions{Duration: *flagDuration, UDPRate: rate})
		if err != nil {
			return s, fmt.Errorf("UDP %s: %w", rate, err)
		}
		m1, err := bed.Relay.Metrics()
		if err != nil {
			return s, err
		}
		c1, err := a.ClientMetrics()
		if err != nil {
			return s, err
		}
		us := UDPSample{Rate: rate, Mbps: u.ReceivedBps / 1e6, LossPercent: u.LostPercent, JitterMs: u.JitterMs,
			RelayDrops: testbed.Delta(m0, m1, "derp_packets_dropped"), SenderDrops: clientDrops(c0, c1)}
		s.UDP = append(s.UDP, us)
		log.Printf("   UDP %s: %.0f Mbit/s received, %.2f%% lost (%d of %d), relay drops %.0f, tailscaled drops %.0f",
			rate, us.Mbps, us.LossPercent, u.LostPackets, u.Packets, us.RelayDrops, us.SenderDrops)
	}
	return s, nil
}

// machineBefore waits for the machine to be idle enough (waitIdle) and
// returns how busy it was and /proc/loadavg.
func machineBefore() (busy float64, loadAvg string) {
	busy = waitIdle(*flagIdle, *flagIdleMax)
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		loadAvg = strings.TrimSpace(string(b))
	}
	return busy, loadAvg
}

// iperfWithPing runs iperf3 from a to b with ICMP pings every 100 ms
// alongside (from a second into the run to a second before its end).
func iperfWithPing(a, b *testbed.Node, o testbed.IperfOptions) (testbed.IperfResult, testbed.PingResult, error) {
	var (
		wg      sync.WaitGroup
		loaded  testbed.PingResult
		pingErr error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(time.Second) // let TCP ramp up
		n := int((o.Duration - 2*time.Second) / (100 * time.Millisecond))
		loaded, pingErr = testbed.Ping(a, b.IP, max(n, 5), 100*time.Millisecond)
	}()
	r, err := testbed.Iperf(a, b, o)
	wg.Wait()
	if err == nil && pingErr != nil {
		err = fmt.Errorf("ping under load: %w", pingErr)
	}
	return r, loaded, err
}

// waitIdle waits until the machine's CPUs, sampled over 2 s, are less
// busy than threshold, or until max passes, and returns the last busy
// fraction seen. Other work on the machine skews every number; this
// keeps samples out of its busiest stretches and records what remained.
func waitIdle(threshold float64, maxWait time.Duration) float64 {
	deadline := time.Now().Add(maxWait)
	for {
		busy := cpuBusy(2 * time.Second)
		if threshold <= 0 || busy < threshold || time.Now().After(deadline) {
			if threshold > 0 && busy >= threshold {
				log.Printf("   machine still %.0f%% busy after %v; measuring anyway", 100*busy, maxWait)
			}
			return busy
		}
		log.Printf("   machine %.0f%% busy (other work); waiting", 100*busy)
	}
}

// cpuBusy returns the fraction of all CPUs' time spent not idle over d.
func cpuBusy(d time.Duration) float64 {
	read := func() (busy, total float64) {
		b, err := os.ReadFile("/proc/stat")
		if err != nil {
			return 0, 0
		}
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
		for i, v := range f[1:] {
			var x float64
			fmt.Sscan(v, &x)
			total += x
			if i != 3 && i != 4 { // idle, iowait
				busy += x
			}
		}
		return busy, total
	}
	b0, t0 := read()
	time.Sleep(d)
	b1, t1 := read()
	if t1 <= t0 {
		return 0
	}
	return (b1 - b0) / (t1 - t0)
}

// clientDrops is how many packets tailscaled dropped on its way to the
// relay between two scrapes of its metrics.
func clientDrops(before, after testbed.Metrics) float64 {
	return testbed.Delta(before, after, "magicsock_send_derp_dropped") +
		testbed.Delta(before, after, "magicsock_send_derp_error_queue")
}

// cpuCount counts the CPUs in a taskset list such as "0", "0,2" or "0-3".
func cpuCount(list string) int {
	n := 0
	for _, part := range strings.Split(list, ",") {
		var lo, hi int
		if _, err := fmt.Sscanf(part, "%d-%d", &lo, &hi); err == nil {
			n += hi - lo + 1
		} else {
			n++
		}
	}
	return max(n, 1)
}

// printTable prints medians and ranges per relay as Markdown.
func printTable(relays, rates []string, samples []Sample) {
	names := make([]string, len(relays))
	for i, k := range relays {
		names[i] = columnName(k)
	}
	type row struct {
		label string
		get   func(Sample) float64
		unit  string
		prec  int
	}
	rows := []row{
		{"TCP, 1 stream", func(s Sample) float64 { return s.TCPMbps }, "Mbit/s", 0},
		{"TCP retransmits, 1 stream", func(s Sample) float64 { return float64(s.TCPRetransmits) }, "", 0},
		{"TCP, 4 streams", func(s Sample) float64 { return s.TCP4Mbps }, "Mbit/s", 0},
		{"TCP retransmits, 4 streams", func(s Sample) float64 { return float64(s.TCP4Retransmits) }, "", 0},
		{"relay drops during 1-stream TCP", func(s Sample) float64 { return s.RelayDrops }, "packets", 0},
		{"sender tailscaled drops (queue to relay full)", func(s Sample) float64 { return s.SenderDrops }, "packets", 0},
		{"relay CPU during 1-stream TCP", func(s Sample) float64 { return 100 * s.RelayCPU }, "% of a core", 0},
		{"ping RTT, idle (median)", func(s Sample) float64 { return s.IdleRTTms }, "ms", 2},
		{"ping RTT under TCP load (median)", func(s Sample) float64 { return s.LoadedRTTms }, "ms", 2},
		{"ping RTT under TCP load (p99)", func(s Sample) float64 { return s.LoadedRTTp99ms }, "ms", 2},
		{"ping loss under TCP load", func(s Sample) float64 { return 100 * s.LoadedLoss }, "%", 1},
		{"machine busy before the sample (other work)", func(s Sample) float64 { return 100 * s.BusyBefore }, "%", 0},
	}
	for i, rate := range rates {
		rows = append(rows,
			row{"UDP " + rate + " offered: received", func(s Sample) float64 { return udpAt(s, i).Mbps }, "Mbit/s", 0},
			row{"UDP " + rate + " offered: loss", func(s Sample) float64 { return udpAt(s, i).LossPercent }, "%", 2},
			row{"UDP " + rate + " offered: relay drops", func(s Sample) float64 { return udpAt(s, i).RelayDrops }, "packets", 0},
		)
	}
	fmt.Printf("\n%d repetitions, %v per iperf3 run, relay CPUs %q, node CPUs %q, nice %d, %s, %d CPUs.\n",
		*flagRepeats, *flagDuration, *flagRelayCPU, *flagNodeCPU, *flagNice, time.Now().Format("2006-01-02"), runtime.NumCPU())
	fmt.Printf("Median (min–max) over the repetitions.\n\n")
	fmt.Printf("| Metric | %s |\n|---|%s\n", strings.Join(names, " | "), strings.Repeat("---|", len(names)))
	for _, r := range rows {
		cells := make([]string, len(names))
		for i, name := range names {
			var xs []float64
			for _, s := range samples {
				if s.Relay == name {
					xs = append(xs, r.get(s))
				}
			}
			cells[i] = summarize(xs, r.prec, r.unit)
		}
		fmt.Printf("| %s | %s |\n", r.label, strings.Join(cells, " | "))
	}
}

func udpAt(s Sample, i int) UDPSample {
	if i < len(s.UDP) {
		return s.UDP[i]
	}
	return UDPSample{}
}

func summarize(xs []float64, prec int, unit string) string {
	if len(xs) == 0 {
		return "–"
	}
	med := median(xs)
	lo, hi := slices.Min(xs), slices.Max(xs)
	f := fmt.Sprintf("%%.%df", prec)
	out := fmt.Sprintf(f, med)
	if unit != "" {
		out += " " + unit
	}
	return out + fmt.Sprintf(" ("+f+"–"+f+")", lo, hi)
}

//go:build linux

package testbed

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// IperfPort is the iperf3 server's port on node B's Tailscale address.
const IperfPort = 5201

// PingResult is the outcome of an ICMP ping run.
type PingResult struct {
	Sent, Received int
	RTTms          []float64 // one per reply, in order
}

// Loss is the fraction of echo requests without a reply.
func (p PingResult) Loss() float64 {
	if p.Sent == 0 {
		return 1
	}
	return 1 - float64(p.Received)/float64(p.Sent)
}

// Percentile returns the q-quantile (0..1) of the RTTs, nearest rank.
func (p PingResult) Percentile(q float64) float64 {
	return Percentile(p.RTTms, q)
}

// Percentile returns the q-quantile (0..1) of xs by nearest rank, or 0.
func Percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

var (
	rePingReply   = regexp.MustCompile(`time=([0-9.]+) ms`)
	rePingSummary = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)
)

// Ping sends count ICMP echo requests from node `from` to address ip
// through the tunnel, one every interval.
func Ping(from *Node, ip string, count int, interval time.Duration) (PingResult, error) {
	// ping sends more slowly than interval when replies come late (a
	// loaded path): give it twice its nominal time.
	timeout := 2*time.Duration(count)*interval + 15*time.Second
	argv := from.place.wrap([]string{"ping", "-n", "-c", strconv.Itoa(count),
		"-i", fmt.Sprintf("%.3f", interval.Seconds()), "-W", "2", ip})
	out, err := run(from.NS, timeout, nil, argv...)
	var r PingResult
	for _, m := range rePingReply.FindAllStringSubmatch(out, -1) {
		if v, err := strconv.ParseFloat(m[1], 64); err == nil {
			r.RTTms = append(r.RTTms, v)
		}
	}
	m := rePingSummary.FindStringSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("ping: no summary: %v", err)
	}
	r.Sent, _ = strconv.Atoi(m[1])
	r.Received, _ = strconv.Atoi(m[2])
	// ping exits 1 when some replies are missing: that is a result, not a
	// failure of the run.
	return r, nil
}

// StartIperfServer starts a persistent iperf3 server on node n's Tailscale
// address and waits until it listens.
func StartIperfServer(n *Node) (*Proc, error) {
	argv := n.place.wrap([]string{"iperf3", "-s", "-B", n.IP, "-p", strconv.Itoa(IperfPort)})
	p, err := startProc("iperf3 server on "+n.Name, n.NS, nil, argv...)
	if err != nil {
		return nil, err
	}
	for range 100 {
		out, _ := run(n.NS, 5*time.Second, nil, "ss", "-Hltn", fmt.Sprintf("sport = :%d", IperfPort))
		if strings.Contains(out, strconv.Itoa(IperfPort)) {
			return p, nil
		}
		if done, err := p.Exited(); done {
			return nil, fmt.Errorf("iperf3 server exited: %v\n%s", err, p.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.Stop(time.Second)
	return nil, fmt.Errorf("iperf3 server on %s not listening after 10 s", n.Name)
}

// IperfOptions describe one iperf3 client run.
type IperfOptions struct {
	Duration time.Duration
	Streams  int    // parallel streams (0: 1)
	UDPRate  string // if set, UDP at this target rate (iperf3 -b, e.g. "200M")
	UDPLen   int    // UDP datagram size (0: 1200, below the tunnel's 1280 MTU)
	Reverse  bool   // server sends
	// Congestion is TCP's congestion control for the run (iperf3 -C,
	// e.g. "cubic"); empty: the namespace's default.
	Congestion string
}

// IperfResult is the summary of one run.
type IperfResult struct {
	// TCP
	SentBytes, ReceivedBytes int64
	SentBps, ReceivedBps     float64
	Retransmits              int64
	// UDP (receiver's view)
	Packets, LostPackets int64
	LostPercent          float64
	JitterMs             float64
}

// Iperf runs an iperf3 client on node `from` against the server on node
// `to` and returns iperf's own summary.
func Iperf(from, to *Node, o IperfOptions) (IperfResult, error) {
	secs := max(1, int(o.Duration.Seconds()))
	args := []string{"iperf3", "-c", to.IP, "-p", strconv.Itoa(IperfPort),
		"-t", strconv.Itoa(secs), "-J", "--connect-timeout", "5000"}
	if o.Streams > 1 {
		args = append(args, "-P", strconv.Itoa(o.Streams))
	}
	if o.Reverse {
		args = append(args, "-R")
	}
	if o.Congestion != "" {
		args = append(args, "-C", o.Congestion)
	}
	if o.UDPRate != "" {
		l := o.UDPLen
		if l == 0 {
			l = 1200
		}
		args = append(args, "-u", "-b", o.UDPRate, "-l", strconv.Itoa(l))
	}
	out, _, runErr := runSplit(from.NS, time.Duration(secs)*time.Second+30*time.Second, nil, from.place.wrap(args)...)
	var j struct {
		Error string `json:"error"`
		End   struct {
			SumSent struct {
				Bytes         int64   `json:"bytes"`
				BitsPerSecond float64 `json:"bits_per_second"`
				Retransmits   int64   `json:"retransmits"`
			} `json:"sum_sent"`
			SumReceived struct {
				Bytes         int64   `json:"bytes"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
			Sum struct {
				Bytes         int64   `json:"bytes"`
				BitsPerSecond float64 `json:"bits_per_second"`
				JitterMs      float64 `json:"jitter_ms"`
				LostPackets   int64   `json:"lost_packets"`
				Packets       int64   `json:"packets"`
				LostPercent   float64 `json:"lost_percent"`
			} `json:"sum"`
		} `json:"end"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		if runErr != nil {
			return IperfResult{}, runErr
		}
		return IperfResult{}, fmt.Errorf("iperf3 -J output: %w", err)
	}
	if j.Error != "" {
		return IperfResult{}, fmt.Errorf("iperf3: %s", j.Error)
	}
	if runErr != nil {
		return IperfResult{}, runErr
	}
	r := IperfResult{
		SentBytes:     j.End.SumSent.Bytes,
		ReceivedBytes: j.End.SumReceived.Bytes,
		SentBps:       j.End.SumSent.BitsPerSecond,
		ReceivedBps:   j.End.SumReceived.BitsPerSecond,
		Retransmits:   j.End.SumSent.Retransmits,
	}
	if o.UDPRate != "" {
		r.Packets = j.End.Sum.Packets
		r.LostPackets = j.End.Sum.LostPackets
		r.LostPercent = j.End.Sum.LostPercent
		r.JitterMs = j.End.Sum.JitterMs
		if r.ReceivedBps == 0 && r.Packets > 0 {
			// Older iperf3 reports UDP only in "sum": derive the receiver's
			// rate from the datagrams that arrived.
			r.ReceivedBps = j.End.Sum.BitsPerSecond * float64(r.Packets-r.LostPackets) / float64(r.Packets)
		}
		if r.SentBps == 0 {
			r.SentBps = j.End.Sum.BitsPerSecond
		}
	}
	return r, nil
}

//go:build linux

package testbed

import (
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A long-haul path for the bed: every packet a node sends into the relay's
// namespace (to the DERP server, the peer relay, Headscale) is first held
// back by a user-space delay line (scripts/lib/link-delay.py: a TUN device
// that hands each packet back a fixed time later; the kernel here has no
// netem) and then dropped with a fixed probability (nftables numgen) before
// it is delivered. Packets from the relay's namespace to the nodes pass
// undelayed. Every path between the two nodes — through a peer relay or
// through DERP — crosses exactly two node uplinks per round trip, so each
// sees a round trip of twice the one-way delay and the same loss in each
// direction; the relays themselves are not slowed.
//
// How: the nodes' traffic reaches the relay's namespace on its bridge br0.
// nftables marks every IPv4 packet arriving there, and a policy rule ahead
// of the local table routes marked packets into the delay line's TUN
// device; what comes back out of it is unmarked, matches the local table
// (moved behind that rule) and is delivered as usual. A mark, not the
// input interface, selects the packets because ARP asks the routing table
// whether this namespace's own address is local (an input-interface rule
// would make it answer no). Early demultiplexing is off in the namespace:
// it would hand an established connection's packets to their socket
// without the routing decision that sends them into the line.

const (
	longHaulTun   = "fe-lh"     // the delay line's TUN device
	longHaulTable = "fe_lh"     // nftables table: mark, loss, counters
	longHaulMark  = "0x4c/0xff" // the mark of packets to delay
	longHaulRoute = "77"        // routing table into the delay line
	longHaulRule  = "100"       // priority of the rule into it
	localRuleMove = "200"       // where the local table's rule goes
	bridgeIface   = "br0"       // the nodes' side of the relay namespace
	// The TUN device's queue, long enough that the delay line being
	// scheduled late does not add loss of its own.
	longHaulQueue = "20000"
	lossComment   = "loss" // counter names in longHaulTable
	passComment   = "passed"
	intoComment   = "into-line"
	derpComment   = "derp-out"
)

// LongHaul is the delay and loss DelayUplinks put on the bed.
type LongHaul struct {
	OneWay       time.Duration // delay on each node's uplink
	LossPermille int           // drop probability on each uplink, per mille
	Line         *Proc         // the delay line
	ns           string
}

// DelayUplinks puts the long-haul path on the bed (see the comment at the
// top of this file): script is link-delay.py's path, oneWay the delay on
// each uplink (round trip between the nodes: twice that), lossPermille the
// drop probability per packet on each uplink. Call it after Up; it stays
// until Close.
func (b *Bed) DelayUplinks(script string, oneWay time.Duration, lossPermille int) (*LongHaul, error) {
	if oneWay < 0 || lossPermille < 0 || lossPermille >= 1000 {
		return nil, fmt.Errorf("DelayUplinks: delay %v, loss %d‰ out of range", oneWay, lossPermille)
	}
	python, err := exec.LookPath("python3")
	if err != nil {
		return nil, fmt.Errorf("the delay line needs python3: %w", err)
	}
	ns := b.Netns.Relay
	if _, err := run(ns, 10*time.Second, nil, "sysctl", "-qw", "net.ipv4.ip_forward=1",
		"net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
		"net.ipv4.ip_early_demux=0"); err != nil {
		return nil, err
	}
	// The line is the network: as favoured as the nodes, on any CPU.
	place := Placement{Nice: b.Cfg.NodePlace.Nice}
	line, err := startProc("delay line", ns, nil, place.wrap([]string{python, "-u", script, longHaulTun,
		strconv.FormatFloat(float64(oneWay)/float64(time.Millisecond), 'f', 3, 64)})...)
	if line != nil {
		b.procs = append(b.procs, line)
	}
	if err != nil {
		return nil, err
	}
	if err := line.WaitLine("ready", 10*time.Second); err != nil {
		return nil, err
	}
	steps := [][]string{
		{"ip", "link", "set", longHaulTun, "txqueuelen", longHaulQueue, "up"},
		{"sysctl", "-qw", "net.ipv4.conf." + longHaulTun + ".rp_filter=0"},
		{"ip", "route", "add", "default", "dev", longHaulTun, "table", longHaulRoute},
		{"ip", "rule", "add", "fwmark", longHaulMark, "lookup", longHaulRoute, "priority", longHaulRule},
		// The local table is consulted after the rule above (so the
		// nodes' packets to this namespace's own address go into the
		// line first) and before anything else (so what leaves the line
		// is delivered here).
		{"ip", "rule", "add", "lookup", "local", "priority", localRuleMove},
		{"ip", "rule", "del", "priority", "0"},
	}
	for _, s := range steps {
		if _, err := run(ns, 10*time.Second, nil, s...); err != nil {
			return nil, err
		}
	}
	mark, _, _ := strings.Cut(longHaulMark, "/")
	rules := fmt.Sprintf(`table inet %[1]s {
	chain tag_uplinks {
		type filter hook prerouting priority -150; policy accept;
		iifname %[2]q meta nfproto ipv4 meta mark set %[10]s
		iifname %[3]q numgen random mod 1000 < %[4]d counter drop comment %[6]q
		iifname %[3]q counter comment %[7]q
	}
	chain to_line {
		type filter hook forward priority 0; policy accept;
		iifname %[2]q oifname %[3]q counter comment %[5]q
	}
	chain derp_port {
		type filter hook output priority 0; policy accept;
		tcp sport %[8]d counter comment %[9]q
	}
}
`, longHaulTable, bridgeIface, longHaulTun, lossPermille, intoComment, lossComment, passComment, b.Relay.Port, derpComment, mark)
	if _, err := runInput(ns, 10*time.Second, nil, strings.NewReader(rules), "nft", "-f", "-"); err != nil {
		return nil, err
	}
	return &LongHaul{OneWay: oneWay, LossPermille: lossPermille, Line: line, ns: ns}, nil
}

// LongHaulCounters are the long-haul table's counters (cumulative).
type LongHaulCounters struct {
	// Into the delay line (bytes; packets may be GSO/TSO trains, counted
	// once).
	IntoBytes int64
	// Out of the delay line, one packet each: dropped as loss, and
	// delivered.
	LostPackets, LostBytes     int64
	PassedPackets, PassedBytes int64
	// DerpOutBytes: bytes the DERP server's TCP port sent (to the nodes
	// and to any peer relay's DERP client).
	DerpOutBytes int64
}

var reCounter = regexp.MustCompile(`counter packets (\d+) bytes (\d+).*comment "([^"]+)"`)

// Counters reads the long-haul table's counters.
func (l *LongHaul) Counters() (LongHaulCounters, error) {
	text, err := run(l.ns, 10*time.Second, nil, "nft", "list", "table", "inet", longHaulTable)
	if err != nil {
		return LongHaulCounters{}, err
	}
	return parseLongHaulCounters(text)
}

// parseLongHaulCounters reads the counters out of `nft list table`'s text;
// a counter missing is an error, never a zero.
func parseLongHaulCounters(text string) (LongHaulCounters, error) {
	var c LongHaulCounters
	seen := map[string]bool{}
	for _, m := range reCounter.FindAllStringSubmatch(text, -1) {
		pk, err1 := strconv.ParseInt(m[1], 10, 64)
		by, err2 := strconv.ParseInt(m[2], 10, 64)
		if err1 != nil || err2 != nil {
			return c, fmt.Errorf("%s: bad counter %q", longHaulTable, m[0])
		}
		seen[m[3]] = true
		switch m[3] {
		case intoComment:
			c.IntoBytes = by
		case lossComment:
			c.LostPackets, c.LostBytes = pk, by
		case passComment:
			c.PassedPackets, c.PassedBytes = pk, by
		case derpComment:
			c.DerpOutBytes = by
		}
	}
	for _, name := range []string{intoComment, lossComment, passComment, derpComment} {
		if !seen[name] {
			return c, fmt.Errorf("%s: no counter %q in:\n%s", longHaulTable, name, text)
		}
	}
	return c, nil
}

// Sub returns the counts between before (c0) and c.
func (c LongHaulCounters) Sub(c0 LongHaulCounters) LongHaulCounters {
	return LongHaulCounters{
		IntoBytes:     c.IntoBytes - c0.IntoBytes,
		LostPackets:   c.LostPackets - c0.LostPackets,
		LostBytes:     c.LostBytes - c0.LostBytes,
		PassedPackets: c.PassedPackets - c0.PassedPackets,
		PassedBytes:   c.PassedBytes - c0.PassedBytes,
		DerpOutBytes:  c.DerpOutBytes - c0.DerpOutBytes,
	}
}

// RelayNode stands for the relay's namespace as an iperf3 endpoint
// (StartIperfServer, Iperf's target): traffic to it from a node crosses
// that node's uplink only, not the tunnel.
func (b *Bed) RelayNode() *Node {
	return &Node{Name: "relay namespace", NS: b.Netns.Relay, IP: RelayIP}
}

// Congestion is the TCP congestion control of namespace ns's connections
// on the bed's network: its route's `congctl` (Config.Congestion), else
// the namespace's default.
func Congestion(ns string) (string, error) {
	route, err := run(ns, 10*time.Second, nil, "ip", "route", "show", bedSubnet)
	if err != nil {
		return "", err
	}
	if f := strings.Fields(route); slices.Contains(f, "congctl") {
		return f[slices.Index(f, "congctl")+1], nil
	}
	out, err := run(ns, 10*time.Second, nil, "cat", "/proc/sys/net/ipv4/tcp_congestion_control")
	return strings.TrimSpace(out), err
}

// bedSubnet is the bed's network.
var bedSubnet = "10.78.0.0/" + strconv.Itoa(subnet)

// setCongestion gives the bed's network route in every namespace the
// congestion control cc (nothing when cc is empty).
func setCongestion(n Netns, cc string) error {
	if cc == "" {
		return nil
	}
	for _, x := range []struct{ ns, dev, ip string }{
		{n.Relay, "br0", RelayIP}, {n.A, "eth0", NodeAIP}, {n.B, "eth0", NodeBIP},
	} {
		if _, err := run(x.ns, 10*time.Second, nil, "ip", "route", "replace", bedSubnet, "dev", x.dev,
			"proto", "kernel", "scope", "link", "src", x.ip, "congctl", cc); err != nil {
			return fmt.Errorf("congestion control %s: %w", cc, err)
		}
	}
	return nil
}

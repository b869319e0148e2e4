//go:build linux

package e2e

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"ferry.invalid/interop/e2e/testbed"
	"tailscale.com/types/key"
)

// What the bad-input phase sends (each kind counted separately); bounded
// in count and time.
const (
	floodPerKind  = 2000            // datagrams of each kind on the port
	floodDuration = 3 * time.Second // spread over this long
	discoPerKind  = 300             // packets of each kind over DERP
	// floodRSSGrowth is how much Ferry's resident memory may grow over
	// the phase.
	floodRSSGrowth = 32 << 20
	// floodIP is the flooding host on the relay's bridge.
	floodIP = "10.78.0.9"
)

// Bad input kinds on the peer-relay port.
type floodKind int

const (
	forgedBind    floodKind = iota // a bind's shape for the live VNI, a made-up sender and box
	oversize                       // a control datagram of 1400 bytes (a bind is 160)
	garbage                        // random bytes, not a valid header
	strangersData                  // data for the live VNI from an address neither side bound
	floodKinds
)

func (k floodKind) String() string {
	return [...]string{"forged bind", "oversize control", "garbage", "data from a stranger"}[k]
}

// floodDatagram writes one datagram of kind k for vni into buf.
func floodDatagram(k floodKind, i int, vni uint32, buf []byte) []byte {
	header := func(control bool) []byte {
		h := []byte{0, 0, 0x7a, 0x12, byte(vni >> 16), byte(vni >> 8), byte(vni), 0}
		if control {
			h[1], h[3] = 0x80, 0x11
		}
		return h
	}
	switch k {
	case forgedBind, oversize:
		n := 160
		if k == oversize {
			n = 1400
		}
		d := append(buf[:0], header(true)...)
		d = append(d, "TS💬"...)
		d = d[:n]
		rand.Read(d[8+6:]) // sender key, nonce, box
		return d
	case garbage:
		d := buf[:1+i%200]
		rand.Read(d)
		d[0] = 0xff // version and reserved bits set: never a header
		if len(d) > 1 {
			d[1] = 0 // the data path's, not the control path's
		}
		return d
	default:
		d := append(buf[:0], header(false)...)
		d = d[:8+1200]
		rand.Read(d[8:])
		return d
	}
}

// floodPort sends floodPerKind datagrams of each kind from conn to the
// peer-relay port, interleaved, spread over floodDuration.
func floodPort(conn *net.UDPConn, vni uint32) (sent [floodKinds]int, err error) {
	dst := &net.UDPAddr{IP: net.ParseIP(testbed.RelayIP), Port: testbed.PeerRelayPort}
	buf := make([]byte, 1500)
	total := floodPerKind * int(floodKinds)
	start := time.Now()
	for i := range total {
		// Pace: datagram i no earlier than its share of the duration.
		if due := start.Add(floodDuration * time.Duration(i) / time.Duration(total)); time.Until(due) > 0 {
			time.Sleep(time.Until(due))
		}
		k := floodKind(i % int(floodKinds))
		if _, err := conn.WriteToUDP(floodDatagram(k, i, vni, buf), dst); err != nil {
			return sent, err
		}
		sent[k]++
	}
	return sent, nil
}

// floodDisco sends discoPerKind packets of each kind over DERP to Ferry's
// node key from a client of its own (a node key not in the netmap):
// oversize packets, packets without the disco magic, and disco packets
// with a made-up sender and box; spread over floodDuration (the DERP
// server queues 32 disco packets for a receiver and drops the rest of a
// burst: the bed's relay is not what is tested here).
func floodDisco(c interface {
	Send(key.NodePublic, []byte) error
}, to key.NodePublic) error {
	start := time.Now()
	total := discoPerKind * 3
	for i := range total {
		if due := start.Add(floodDuration * time.Duration(i) / time.Duration(total)); time.Until(due) > 0 {
			time.Sleep(time.Until(due))
		}
		var d []byte
		switch i % 3 {
		case 0:
			d = make([]byte, 1200)
			copy(d, "TS💬")
		case 1:
			d = make([]byte, 100)
			rand.Read(d)
			d[0] = 0
		default:
			d = make([]byte, 148)
			copy(d, "TS💬")
			rand.Read(d[6:])
		}
		if err := c.Send(to, d); err != nil {
			return err
		}
	}
	return nil
}

// checkBadInput: while iperf3 runs A→B through Ferry's peer relay, a
// third host floods the peer-relay port with forged binds, oversize
// control datagrams, garbage and data for the live VNI from its own
// address, and a DERP client with a key of its own sends Ferry oversize,
// non-disco and forged disco packets. Each is counted by its reason (at
// least 90 % of what was sent: some may be lost on the way), answered by
// nothing, logged a few times at most; the transfer keeps at least half
// of baseline (the rate checkIperf measured just before); Ferry's memory
// grows less than floodRSSGrowth; no endpoint is freed and A keeps its
// path with the same VNI.
func checkBadInput(t *testing.T, bed *testbed.Bed, relayName string, ferry *testbed.Proc, metrics func() (testbed.Metrics, error), baseline float64, prefix string) {
	start := time.Now()
	a, b := bed.A, bed.B
	st, err := a.Status()
	if err != nil {
		t.Fatal(err)
	}
	vniText := peerRelayVNI(st.PeerNamed(b.Name), prefix)
	vni, err := strconv.ParseUint(vniText, 10, 24)
	if err != nil {
		t.Fatalf("A's path to B: VNI %q: %v", vniText, err)
	}
	ns, err := bed.AddHost("x", floodIP)
	if err != nil {
		t.Fatalf("the flooding host: %v", err)
	}
	conn, err := testbed.ListenUDP(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	before, err := metrics()
	if err != nil {
		t.Fatal(err)
	}
	derpBefore, err := bed.Relay.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	// Ferry's node key, as the nodes' netmap has it.
	var ferryKey key.NodePublic
	relay := st.PeerNamed(relayName)
	if relay == nil {
		t.Fatalf("A's status has no peer %s", relayName)
	}
	if err := ferryKey.UnmarshalText([]byte(relay.PublicKey)); err != nil {
		t.Fatalf("%s's node key %q: %v", relayName, relay.PublicKey, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	derpc, err := bed.DERPClient(ctx, key.NewNode(), t.Logf)
	if err != nil {
		t.Fatalf("a DERP client of its own: %v", err)
	}
	defer derpc.Close()
	rssBefore, err := testbed.VmRSS(ferry.Pid())
	if err != nil {
		t.Fatal(err)
	}
	// Answers to the flood would come back to conn: count them.
	var answers int
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		buf := make([]byte, 2048)
		for {
			if _, _, err := conn.ReadFromUDP(buf); err != nil {
				return
			}
			answers++
		}
	}()

	var wg sync.WaitGroup
	var sent [floodKinds]int
	var portErr, discoErr error
	wg.Add(2)
	go func() { defer wg.Done(); sent, portErr = floodPort(conn, uint32(vni)) }()
	go func() { defer wg.Done(); discoErr = floodDisco(derpc, ferryKey) }()
	ir, iperfErr := testbed.Iperf(a, b, testbed.IperfOptions{Duration: floodDuration})
	wg.Wait()
	if portErr != nil || discoErr != nil || iperfErr != nil {
		t.Fatalf("flood: port %v, DERP %v, iperf3 %v", portErr, discoErr, iperfErr)
	}

	// The counters, once they stop moving (at most 5 s).
	portDrops := func(m testbed.Metrics, reason string) float64 {
		return m[`ferry_udp_peer_relay_drops_total{reason="`+reason+`"}`]
	}
	discoDrops := func(m testbed.Metrics, reason string) float64 {
		return m[`ferry_peer_relay_disco_dropped_total{reason="`+reason+`"}`]
	}
	var after testbed.Metrics
	want := 0.9 * floodPerKind
	wantDisco := 0.9 * discoPerKind
	var gaps []string
	waitFor(5*time.Second, func() (bool, string) {
		after, err = metrics()
		if err != nil {
			return false, err.Error()
		}
		gaps = nil
		check := func(what string, got, want float64) {
			if got < want {
				gaps = append(gaps, fmt.Sprintf("%s: %.0f, want ≥ %.0f", what, got, want))
			}
		}
		d := func(reason string) float64 { return portDrops(after, reason) - portDrops(before, reason) }
		// One source: beyond its bind burst, control datagrams are
		// dropped before any crypto; the rest by their shape or sender.
		check("port: forged binds + oversize (rate_limited + bad_control + unknown_sender)",
			d("rate_limited")+d("bad_control")+d("unknown_sender")+d("bad_box"), 2*want)
		check("port: oversize and forged binds past the source's burst (rate_limited)", d("rate_limited"), 1.5*want)
		check("port: garbage (bad_header)", d("bad_header"), want)
		check("port: data from a stranger (wrong_source)", d("wrong_source"), want)
		dd := func(reason string) float64 { return discoDrops(after, reason) - discoDrops(before, reason) }
		check("DERP: oversize", dd("oversize"), wantDisco)
		check("DERP: not disco", dd("not_disco"), wantDisco)
		check("DERP: forged disco from a stranger (unknown_peer)", dd("unknown_peer"), wantDisco)
		return len(gaps) == 0, strings.Join(gaps, "; ")
	})
	conn.SetReadDeadline(time.Now())
	<-readDone
	rssAfter, err := testbed.VmRSS(ferry.Pid())
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gaps {
		t.Errorf("bad input not counted: %s", g)
	}
	if len(gaps) > 0 {
		if derpAfter, err := bed.Relay.Metrics(); err == nil {
			t.Logf("the bed's DERP server dropped: %v", testbed.NonZero(derpBefore, derpAfter, "derp_packets_dropped"))
		}
	}
	if answers > 0 {
		t.Errorf("Ferry answered the flooding host %d times", answers)
	}
	for _, name := range []string{"ferry_udp_peer_relay_drops_total", "ferry_peer_relay_disco_dropped_total"} {
		t.Logf("%s grew: %v", name, testbed.NonZero(before, after, name))
	}
	if freed := testbed.NonZero(before, after, "ferry_udp_peer_relay_events_total"); len(freed) > 0 {
		for _, f := range freed {
			if strings.Contains(f, "freed") {
				t.Errorf("an endpoint was freed during the flood: %v", freed)
				break
			}
		}
	}
	if ir.ReceivedBps < 0.5*baseline {
		t.Errorf("iperf3 under the flood: %.0f Mbit/s, under half of the %.0f Mbit/s before it", ir.ReceivedBps/1e6, baseline/1e6)
	}
	if rssAfter-rssBefore > floodRSSGrowth {
		t.Errorf("Ferry's RSS grew by %d MiB during the flood (from %d MiB), bound %d MiB", (rssAfter-rssBefore)>>20, rssBefore>>20, floodRSSGrowth>>20)
	}
	st, err = a.Status()
	if err != nil {
		t.Fatal(err)
	}
	if got := peerRelayVNI(st.PeerNamed(b.Name), prefix); got != vniText {
		t.Errorf("after the flood A's path to B: %q, want the peer relay with VNI %s", peerRelayOf(st.PeerNamed(b.Name)), vniText)
	}
	// A handful of lines per reason, not one per packet.
	logs := ferry.Logs()
	portLines := strings.Count(logs, "peer relay: control datagram dropped")
	discoLines := strings.Count(logs, "peer relay: disco packet dropped")
	if portLines == 0 || discoLines == 0 || portLines > 3*4 || discoLines > 3*4 {
		t.Errorf("Ferry logged %d lines about dropped control datagrams and %d about dropped disco packets; want 1 to %d each", portLines, discoLines, 3*4)
	}
	t.Logf("bad input: sent %v on the port (%d each), %d of 3 kinds over DERP; iperf3 %.0f Mbit/s under it (%.0f before); RSS %d → %d MiB; %d+%d log lines; %.1f s",
		sent, floodPerKind, discoPerKind, ir.ReceivedBps/1e6, baseline/1e6, rssBefore>>20, rssAfter>>20, portLines, discoLines, time.Since(start).Seconds())
}

//go:build linux

package main

// After the throughput runs, -after-idle leaves the tunnel idle (the bench
// sends nothing) for the given time, then measures how long the nodes
// take to use the peer relay again: both relays free an endpoint after
// 5 minutes of silence on either side, and tailscaled stops heartbeating
// an idle path after 45 s, so after 6 minutes the path must come back
// through a new allocation (a new VNI), as it would for a user's
// connection that slept.

import (
	"flag"
	"fmt"
	"log"
	"strings"
	"time"

	"ferry.invalid/interop/e2e/testbed"
)

var flagAfterIdle = flag.Duration("after-idle", 0, "with -peer-relay: after the iperf3 runs, leave the tunnel idle this long (e.g. 6m: past the relays' 5-minute endpoint lifetime), then measure how long until the path goes through the peer relay again, with which VNI; 0: skip")

// IdleSample is what became of the peer-relay path after an idle spell.
type IdleSample struct {
	Idle      string
	VNIBefore string
	VNIAfter  string
	// BackAfterSec: from the first `tailscale ping` after the idle spell
	// to the path through the peer relay both ways.
	BackAfterSec float64
	// ICMP through the tunnel once the path was back, and the bytes the
	// peer relay's port sent meanwhile (they must have crossed it).
	PingsSent, PingsReceived int
	PortOutBytes             int64
}

// afterIdle leaves the bed's tunnel idle for *flagAfterIdle, then checks
// that the path returns through the peer relay (want: `tailscale ping`'s
// text for it; before: A→B's path line before the idle spell).
func afterIdle(bed *testbed.Bed, want, before string) (*IdleSample, error) {
	s := &IdleSample{Idle: flagAfterIdle.String(), VNIBefore: vniOf(before)}
	log.Printf("   idle for %v (the bench sends nothing)", *flagAfterIdle)
	time.Sleep(*flagAfterIdle)
	t0 := time.Now()
	path, err := waitPath(bed, want, "via peer-relay")
	if err != nil {
		return s, fmt.Errorf("after %v idle: %w", *flagAfterIdle, err)
	}
	s.BackAfterSec = time.Since(t0).Seconds()
	s.VNIAfter = vniOf(path)
	_, out0, err := bed.PeerRelayBytes()
	if err != nil {
		return s, err
	}
	pr, err := testbed.Ping(bed.A, bed.B.IP, 20, 100*time.Millisecond)
	if err != nil {
		return s, err
	}
	_, out1, err := bed.PeerRelayBytes()
	if err != nil {
		return s, err
	}
	s.PingsSent, s.PingsReceived, s.PortOutBytes = pr.Sent, pr.Received, out1-out0
	log.Printf("   after %v idle: via the peer relay again in %.1f s, VNI %s (before: %s); ICMP %d of %d, port sent %d bytes",
		*flagAfterIdle, s.BackAfterSec, s.VNIAfter, s.VNIBefore, pr.Received, pr.Sent, s.PortOutBytes)
	if pr.Received < pr.Sent*9/10 {
		return s, fmt.Errorf("after %v idle: %d of %d ICMP replies through the tunnel", *flagAfterIdle, pr.Received, pr.Sent)
	}
	if s.PortOutBytes < int64(pr.Received)*84 {
		return s, fmt.Errorf("after %v idle: %d ICMP replies but the peer relay's port sent %d bytes: not on that path", *flagAfterIdle, pr.Received, s.PortOutBytes)
	}
	return s, nil
}

// vniOf is the VNI in a `tailscale ping` line "… via peer-relay(ADDR:vni:N) …",
// or "".
func vniOf(line string) string {
	_, rest, ok := strings.Cut(line, ":vni:")
	if !ok {
		return ""
	}
	vni, _, _ := strings.Cut(rest, ")")
	return vni
}

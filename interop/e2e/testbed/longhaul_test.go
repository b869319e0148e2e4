//go:build linux

package testbed

import (
	"strings"
	"testing"
)

// What `nft list table inet fe_lh` prints (nftables 1.0), counters moved.
const longHaulListing = `table inet fe_lh {
	chain tag_uplinks {
		type filter hook prerouting priority mangle; policy accept;
		iifname "br0" meta nfproto ipv4 meta mark set 0x0000004c
		iifname "fe-lh" numgen random mod 1000 < 10 counter packets 12 bytes 15600 drop comment "loss"
		iifname "fe-lh" counter packets 1188 bytes 1544400 comment "passed"
	}
	chain to_line {
		type filter hook forward priority filter; policy accept;
		iifname "br0" oifname "fe-lh" counter packets 40 bytes 1560000 comment "into-line"
	}
	chain derp_port {
		type filter hook output priority filter; policy accept;
		tcp sport 3340 counter packets 7 bytes 4242 comment "derp-out"
	}
}
`

func TestLongHaulCountersAreReadByName(t *testing.T) {
	c, err := parseLongHaulCounters(longHaulListing)
	if err != nil {
		t.Fatal(err)
	}
	want := LongHaulCounters{IntoBytes: 1560000, LostPackets: 12, LostBytes: 15600,
		PassedPackets: 1188, PassedBytes: 1544400, DerpOutBytes: 4242}
	if c != want {
		t.Fatalf("got %+v, want %+v", c, want)
	}
	if d := c.Sub(LongHaulCounters{LostPackets: 2, PassedPackets: 188}); d.LostPackets != 10 || d.PassedPackets != 1000 {
		t.Fatalf("Sub: %+v", d)
	}
}

func TestLongHaulCounterMissingIsAnError(t *testing.T) {
	text := strings.Replace(longHaulListing, `comment "derp-out"`, "", 1)
	if c, err := parseLongHaulCounters(text); err == nil || !strings.Contains(err.Error(), "derp-out") {
		t.Fatalf("a missing counter read as %+v, err %v", c, err)
	}
}

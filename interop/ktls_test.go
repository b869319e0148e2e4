package interop

import (
	"os"
	"testing"
	"time"

	"tailscale.com/derp"
)

// TestKernelTLS: Tailscale's own DERP client (derphttp over TLS 1.3)
// against `ferry --ktls on`, on each I/O back end. On epoll both clients'
// sessions must move into the kernel (the ktls transport gauge counts
// them while they are connected, and no refusal that keeps a session in
// userspace for good is counted); on io_uring, which cannot read
// kernel-TLS records, they stay in userspace with reason "backend". Either
// way packets of every size, up to the largest DERP allows (several TLS
// records each), are relayed both ways intact, and the server's packet
// counters match what was sent.
//
// It needs a kernel with the TLS module (`--ktls on` refuses to start
// without it), so it runs where INTEROP_KTLS=1 says there is one: the
// kernel test VM (scripts/test.d/55-vm.sh, scripts/vm/guest.sh).
// Elsewhere it skips and says why.
func TestKernelTLS(t *testing.T) {
	if os.Getenv("INTEROP_KTLS") != "1" {
		t.Skip("needs the kernel's TLS module; runs in the kernel test VM (scripts/test.d/55-vm.sh sets INTEROP_KTLS=1)")
	}
	if ferryBinErr != nil {
		t.Fatal(ferryBinErr)
	}
	// The VM is often emulated (TCG), every instruction of the guest's
	// kernel and of ferry's debug build included: starts and handshakes
	// take seconds there.
	readyTimeout, connectTimeout = 90*time.Second, 60*time.Second
	// Refusals that leave a session in userspace for good (the transient
	// ones, e.g. "handshaking", are retried and may be counted).
	final := []string{"unsupported_suite", "kernel", "ulp", "failed"}
	for _, io := range []string{"epoll", "uring"} {
		t.Run(io, func(t *testing.T) {
			s := startServer(t, kindFerry, serverOpts{tls: true, ferryArgs: []string{"--io", io, "--ktls", "on"}})
			a := s.newClient(t, "a")
			b := s.newClient(t, "b")
			const rounds = 10
			sizes := []int{1, 1400, 16 << 10, derp.MaxPacketSize}
			var pkts, bytes int
			for i := range rounds {
				for _, n := range sizes {
					p := nonDisco(n)
					a.send(t, b.pub, p)
					b.expectPacket(t, a.pub, p)
					q := nonDisco(n)
					b.send(t, a.pub, q)
					a.expectPacket(t, b.pub, q)
					pkts += 2
					bytes += 2 * n
				}
				if t.Failed() {
					t.Fatalf("round %d of %d failed", i, rounds)
				}
			}
			s.waitMetricEq(t, float64(pkts), "derp_packets_sent")
			s.waitMetricEq(t, float64(bytes), "derp_bytes_received")
			inKernel, _ := s.metric(t, "ferry_connections_by_transport", "transport=ktls")
			backend, _ := s.metric(t, "ferry_ktls_refused_total", "reason=backend")
			t.Logf("--io %s --ktls on: %d packets (%d bytes) relayed; %v connections in kernel TLS, %v refused for the back end",
				io, pkts, bytes, inKernel, backend)
			switch io {
			case "epoll":
				// a and b; the scrape's own connection may be a third.
				if inKernel < 2 {
					t.Errorf("%v connections in kernel TLS while both clients are connected; want at least 2", inKernel)
				}
			case "uring":
				if inKernel != 0 || backend < 2 {
					t.Errorf("io_uring: %v connections in kernel TLS and %v refused for the back end; want 0 and at least 2", inKernel, backend)
				}
			}
			for _, r := range final {
				if v := s.mustMetric(t, "ferry_ktls_refused_total", "reason="+r); v != 0 {
					t.Errorf("ferry_ktls_refused_total{reason=%q} = %v; want 0", r, v)
				}
			}
		})
	}
}

//go:build linux

package testbed

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"tailscale.com/derp/derphttp"
	"tailscale.com/net/netmon"
	"tailscale.com/types/key"
)

// AddHost adds a namespace on the relay's bridge with address ip (a
// third party beside the nodes: no tailscaled, no filter) and returns
// its name; Close deletes it with the bed. suffix names it within the
// bed.
func (b *Bed) AddHost(suffix, ip string) (string, error) {
	ns := b.Netns.Relay[:len(b.Netns.Relay)-1] + suffix
	if _, err := run("", 10*time.Second, nil, "ip", "netns", "add", ns); err != nil {
		return "", err
	}
	b.Netns.Extra = append(b.Netns.Extra, ns)
	port := "p" + suffix
	for _, s := range [][]string{
		{ns, "ip", "link", "set", "lo", "up"},
		{ns, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", b.Netns.Relay},
		{b.Netns.Relay, "ip", "link", "set", port, "master", "br0", "up"},
		{ns, "ip", "addr", "add", ip + "/" + strconv.Itoa(subnet), "dev", "eth0"},
		{ns, "ip", "link", "set", "eth0", "up"},
	} {
		if _, err := run(s[0], 10*time.Second, nil, s[1:]...); err != nil {
			return ns, err
		}
	}
	return ns, nil
}

// inNamespace runs f on a thread switched into namespace ns (and back):
// sockets f opens stay in ns, whichever thread uses them later.
func inNamespace(ns string, f func() error) error {
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		return err
	}
	defer target.Close()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", syscall.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer self.Close()
		if err := setns(target.Fd()); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		ferr := f()
		if err := setns(self.Fd()); err != nil {
			// This thread is stuck in ns: leave it locked so that the
			// runtime discards it when the goroutine ends.
			done <- ferr
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// ListenUDP opens a UDP socket on an ephemeral port in namespace ns.
func ListenUDP(ns string) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := inNamespace(ns, func() error {
		var err error
		c, err = net.ListenUDP("udp4", &net.UDPAddr{})
		return err
	})
	return c, err
}

// DERPClient connects a DERP client with key priv to the bed's relay
// (plain HTTP only), from inside the relay's namespace.
func (b *Bed) DERPClient(ctx context.Context, priv key.NodePrivate, logf Logf) (*derphttp.Client, error) {
	if b.Relay.Opts.TLS {
		return nil, fmt.Errorf("DERPClient: the bed's relay serves TLS")
	}
	c, err := derphttp.NewClient(priv, b.Relay.url("/derp"), func(f string, a ...any) { logf(f, a...) }, netmon.NewStatic())
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort(RelayIP, strconv.Itoa(b.Relay.Port))
	c.SetURLDialer(func(ctx context.Context, _, _ string) (net.Conn, error) {
		return dialInNamespace(ctx, b.Netns.Relay, addr)
	})
	if err := c.Connect(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// VmRSS is the resident set size of process pid, in bytes.
func VmRSS(pid int) (int64, error) {
	text, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	var kb int64
	for _, line := range strings.Split(string(text), "\n") {
		if n, _ := fmt.Sscanf(line, "VmRSS: %d kB", &kb); n == 1 {
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

//go:build linux

package testbed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Addresses of the test network (10.78.0.0/24 on the relay's bridge).
const (
	RelayIP = "10.78.0.1"
	NodeAIP = "10.78.0.2"
	NodeBIP = "10.78.0.3"
	subnet  = 24
)

// nsPrefix starts every namespace the test bed creates.
const nsPrefix = "fe-"

// Netns is the set of namespaces of one bed.
type Netns struct {
	Relay, A, B string
	// Extra are namespaces added to the bed later (AddHost).
	Extra []string
}

// Preflight reports why the machine cannot run a bed, or nil if it can:
// not root, no `ip`/`nft`/`iperf3`/`ping`, or network namespaces (or
// nftables, veth, bridges, TUN) unavailable. It tries a throwaway namespace.
func Preflight() error {
	if os.Geteuid() != 0 {
		return errors.New("not running as root (network namespaces, TUN devices and nftables need root)")
	}
	for _, tool := range []string{"ip", "nft", "iperf3", "ping", "taskset"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found (Debian: apt-get install iproute2 nftables iperf3 iputils-ping util-linux)", tool)
		}
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return fmt.Errorf("no TUN device: %v", err)
	}
	ns := fmt.Sprintf("%s%d-probe", nsPrefix, os.Getpid())
	if out, err := run("", 10*time.Second, nil, "ip", "netns", "add", ns); err != nil {
		return fmt.Errorf("network namespaces unavailable: %v %s", err, out)
	}
	defer run("", 10*time.Second, nil, "ip", "netns", "delete", ns)
	if _, err := run(ns, 10*time.Second, nil, "ip", "link", "add", "br0", "type", "bridge"); err != nil {
		return fmt.Errorf("bridges unavailable in a namespace: %v", err)
	}
	if _, err := run(ns, 10*time.Second, nil, "ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"); err != nil {
		return fmt.Errorf("veth pairs unavailable in a namespace: %v", err)
	}
	if _, err := runInput(ns, 10*time.Second, nil, strings.NewReader("table inet fe_probe {\n\tchain c {\n\t\ttype filter hook output priority 0;\n\t}\n}\n"), "nft", "-f", "-"); err != nil {
		return fmt.Errorf("nftables unavailable in a namespace: %v", err)
	}
	return nil
}

// Reap deletes namespaces named fe-<pid>-* whose pid is no longer running,
// with any process still inside them: what a killed earlier run left. It
// never touches a namespace of a live process.
func Reap(logf Logf) {
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, nsPrefix) {
			continue
		}
		rest := strings.TrimPrefix(name, nsPrefix)
		i := strings.IndexByte(rest, '-')
		if i <= 0 {
			continue
		}
		pid, err := strconv.Atoi(rest[:i])
		if err != nil || pid == os.Getpid() || processAlive(pid) {
			continue
		}
		logf("removing namespace %s left by process %d", name, pid)
		deleteNamespace(name)
	}
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// killNamespaceProcs SIGKILLs every process inside namespace ns.
func killNamespaceProcs(ns string) {
	for range 5 {
		out, _ := run("", 5*time.Second, nil, "ip", "netns", "pids", ns)
		pids := strings.Fields(out)
		if len(pids) == 0 {
			return
		}
		for _, p := range pids {
			if pid, err := strconv.Atoi(p); err == nil && pid != os.Getpid() {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// deleteNamespace kills what runs in ns and deletes it (its veths go with
// it).
func deleteNamespace(ns string) {
	killNamespaceProcs(ns)
	run("", 10*time.Second, nil, "ip", "netns", "delete", ns)
}

// createTopology creates the three namespaces of a bed and wires them,
// blocking direct UDP between the nodes unless allowDirect. On error, the
// caller still calls deleteTopology.
func createTopology(n Netns, allowDirect bool) error {
	for _, ns := range []string{n.Relay, n.A, n.B} {
		if _, err := run("", 10*time.Second, nil, "ip", "netns", "add", ns); err != nil {
			return err
		}
		if _, err := run(ns, 10*time.Second, nil, "ip", "link", "set", "lo", "up"); err != nil {
			return err
		}
	}
	steps := [][]string{
		{n.Relay, "ip", "link", "add", "br0", "type", "bridge"},
		{n.Relay, "ip", "addr", "add", RelayIP + "/" + strconv.Itoa(subnet), "dev", "br0"},
		{n.Relay, "ip", "link", "set", "br0", "up"},
	}
	for _, node := range []struct{ ns, ip, port string }{
		{n.A, NodeAIP, "pa"},
		{n.B, NodeBIP, "pb"},
	} {
		steps = append(steps,
			// Both ends are created directly in their namespaces, so no
			// name is ever taken in the root namespace.
			[]string{node.ns, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", node.port, "netns", n.Relay},
			[]string{n.Relay, "ip", "link", "set", node.port, "master", "br0", "up"},
			[]string{node.ns, "ip", "addr", "add", node.ip + "/" + strconv.Itoa(subnet), "dev", "eth0"},
			[]string{node.ns, "ip", "link", "set", "eth0", "up"},
		)
	}
	for _, s := range steps {
		if _, err := run(s[0], 10*time.Second, nil, s[1:]...); err != nil {
			return err
		}
	}
	if allowDirect {
		return nil
	}
	// Direct UDP between the nodes is dropped on their veths (IPv4 to or
	// from the other node, and all IPv6 UDP, which only link-local
	// addresses could carry here), so WireGuard can only go through the
	// relay. The tunnel's own interface is not filtered.
	for _, node := range []struct{ ns, other string }{{n.A, NodeBIP}, {n.B, NodeAIP}} {
		rules := fmt.Sprintf(`table inet fe_block {
	chain output {
		type filter hook output priority 0; policy accept;
		oifname "eth0" ip daddr %[1]s meta l4proto udp counter drop
		oifname "eth0" meta nfproto ipv6 meta l4proto udp counter drop
	}
	chain input {
		type filter hook input priority 0; policy accept;
		iifname "eth0" ip saddr %[1]s meta l4proto udp counter drop
		iifname "eth0" meta nfproto ipv6 meta l4proto udp counter drop
	}
}
`, node.other)
		if _, err := runInput(node.ns, 10*time.Second, nil, strings.NewReader(rules), "nft", "-f", "-"); err != nil {
			return err
		}
	}
	return nil
}

// deleteTopology removes the namespaces of a bed, killing anything left
// inside them.
func deleteTopology(n Netns) {
	for _, ns := range append(append([]string(nil), n.Extra...), n.A, n.B, n.Relay) {
		if ns != "" {
			deleteNamespace(ns)
		}
	}
}

// BlockedUDP returns how many UDP packets the node's nftables rules
// dropped (direct-path attempts), read from the rule counters.
func BlockedUDP(ns string) (int64, error) {
	out, err := run(ns, 10*time.Second, nil, "nft", "list", "table", "inet", "fe_block")
	if err != nil {
		return 0, err
	}
	var total int64
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "packets" {
				if n, err := strconv.ParseInt(f[i+1], 10, 64); err == nil {
					total += n
				}
			}
		}
	}
	return total, nil
}

// dialInNamespace opens a TCP connection from inside namespace ns: the
// calling goroutine's thread switches into ns for the socket() call and
// back. The socket stays in ns afterwards, whichever thread uses it.
func dialInNamespace(ctx context.Context, ns, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNamespace(ns, func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, "tcp4", addr)
		return err
	})
	return c, err
}

func setns(fd uintptr) error {
	return unix.Setns(int(fd), unix.CLONE_NEWNET)
}

// DialRelayNamespace opens a TCP connection to addr from inside the
// relay's namespace.
func (b *Bed) DialRelayNamespace(ctx context.Context, addr string) (net.Conn, error) {
	return dialInNamespace(ctx, b.Netns.Relay, addr)
}

// refuseRelay makes namespace ns refuse its TCP connections to the
// relay's port (a reset at once, so a client moves on to the region's next
// node without waiting for a timeout).
func refuseRelay(ns string, port int) error {
	rules := fmt.Sprintf(`table inet fe_refuse {
	chain output {
		type filter hook output priority 0; policy accept;
		oifname "eth0" ip daddr %s tcp dport %d counter reject with tcp reset
	}
}
`, RelayIP, port)
	_, err := runInput(ns, 10*time.Second, nil, strings.NewReader(rules), "nft", "-f", "-")
	return err
}

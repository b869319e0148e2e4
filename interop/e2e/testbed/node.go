//go:build linux

package testbed

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Node is one tailscaled with its CLI.
type Node struct {
	Name string // host name in the tailnet ("fe-a")
	NS   string
	IP   string // Tailscale IPv4 address, known after Up
	Proc *Proc

	cli   string // tailscale binary
	sock  string
	env   []string
	place Placement
}

// startNode starts tailscaled in namespace ns with its own TUN, socket and
// state directory, and no log upload.
func startNode(bins Binaries, name, ns, dir, tun string, env []string, place Placement) (*Node, error) {
	n := &Node{Name: name, NS: ns, cli: bins.Tailscale, sock: filepath.Join(dir, "tailscaled.sock"), env: env, place: place}
	argv := []string{bins.Tailscaled,
		"--tun", tun,
		"--socket", n.sock,
		"--statedir", filepath.Join(dir, "state"),
		"--port", "41641",
		"--no-logs-no-support",
	}
	argv = place.wrap(argv)
	var err error
	n.Proc, err = startProc("tailscaled "+name, ns, env, argv...)
	if err != nil {
		return nil, err
	}
	// Ready once the LocalAPI socket exists.
	for range 100 {
		if _, err := os.Stat(n.sock); err == nil {
			return n, nil
		}
		if done, err := n.Proc.Exited(); done {
			return nil, fmt.Errorf("tailscaled %s exited during start-up: %v", name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, fmt.Errorf("tailscaled %s: no socket %s after 10 s", name, n.sock)
}

// Placement says where and how urgently a program runs.
type Placement struct {
	CPUs string // taskset CPU list ("" = any CPU)
	Nice int    // nice value (0 = unchanged; -20 = most favoured)
}

// wrap prefixes argv with `nice` and `taskset` as needed.
func (p Placement) wrap(argv []string) []string {
	if p.CPUs != "" {
		argv = append([]string{"taskset", "-c", p.CPUs}, argv...)
	}
	if p.Nice != 0 {
		argv = append([]string{"nice", "-n", strconv.Itoa(p.Nice)}, argv...)
	}
	return argv
}

// CLI runs `tailscale --socket S args...` and returns its combined output.
func (n *Node) CLI(timeout time.Duration, args ...string) (string, error) {
	argv := append([]string{n.cli, "--socket", n.sock}, args...)
	return run(n.NS, timeout, n.env, argv...)
}

// Up logs the node in with a pre-auth key: no DNS, no netfilter changes.
func (n *Node) Up(loginServer, authKey string) error {
	_, err := n.CLI(90*time.Second, "up",
		"--login-server", loginServer,
		"--authkey", authKey,
		"--hostname", n.Name,
		"--accept-dns=false",
		"--netfilter-mode=off",
		"--timeout", "60s",
	)
	if err != nil {
		return err
	}
	st, err := n.Status()
	if err != nil {
		return err
	}
	if st.BackendState != "Running" || st.Self == nil {
		return fmt.Errorf("%s: backend state %q after up", n.Name, st.BackendState)
	}
	for _, ip := range st.Self.TailscaleIPs {
		if a, err := netip.ParseAddr(ip); err == nil && a.Is4() {
			n.IP = ip
		}
	}
	if n.IP == "" {
		return fmt.Errorf("%s: no Tailscale IPv4 address in %v", n.Name, st.Self.TailscaleIPs)
	}
	return nil
}

// Status is the part of `tailscale status --json` the bed reads.
type Status struct {
	BackendState string
	Self         *PeerStatus
	Peer         map[string]*PeerStatus
}

// PeerStatus describes one node in Status.
type PeerStatus struct {
	HostName     string
	TailscaleIPs []string
	Online       bool
	Relay        string // DERP region code of the peer's home
	CurAddr      string // direct UDP address in use; empty when relayed
	PeerRelay    string // peer relay in use ("ip:port:vni:N"); empty when none
	Tags         []string
	RxBytes      int64
	TxBytes      int64
}

// Status runs `tailscale status --json`.
func (n *Node) Status() (*Status, error) {
	argv := []string{n.cli, "--socket", n.sock, "status", "--json"}
	out, _, err := runSplit(n.NS, 15*time.Second, n.env, argv...)
	if err != nil {
		return nil, err
	}
	var st Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return nil, fmt.Errorf("tailscale status --json: %w", err)
	}
	return &st, nil
}

// PeerNamed returns the peer with the given host name, or nil.
func (st *Status) PeerNamed(host string) *PeerStatus {
	for _, p := range st.Peer {
		if strings.EqualFold(p.HostName, host) {
			return p
		}
	}
	return nil
}

// ClientMetrics reads tailscaled's own counters (`tailscale debug
// metrics`), such as magicsock_send_derp_dropped: packets tailscaled
// itself dropped because its queue towards the relay was full.
func (n *Node) ClientMetrics() (Metrics, error) {
	out, _, err := runSplit(n.NS, 15*time.Second, n.env, n.cli, "--socket", n.sock, "debug", "metrics")
	if err != nil {
		return nil, err
	}
	return parseMetrics(strings.NewReader(out))
}

// TailscalePing runs `tailscale ping` (disco, count pings) to ip and
// returns the output. tailscale ping exits non-zero when no direct path
// came up even if DERP answered, so the error is informative only; the
// caller judges the output.
func (n *Node) TailscalePing(ip string, count int) (string, error) {
	return n.CLI(time.Duration(count)*6*time.Second+10*time.Second,
		"ping", "--c", fmt.Sprint(count), "--timeout", "5s", ip)
}

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
	argv  []string // tailscaled's command line, for Restart
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
	n.argv = place.wrap(argv)
	if err := n.start(); err != nil {
		return nil, err
	}
	return n, nil
}

// start runs tailscaled and waits until its LocalAPI socket exists.
func (n *Node) start() error {
	os.Remove(n.sock)
	var err error
	n.Proc, err = startProc("tailscaled "+n.Name, n.NS, n.env, n.argv...)
	if err != nil {
		return err
	}
	for range 100 {
		if _, err := os.Stat(n.sock); err == nil {
			return nil
		}
		if done, err := n.Proc.Exited(); done {
			return fmt.Errorf("tailscaled %s exited during start-up: %v", n.Name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("tailscaled %s: no socket %s after 10 s", n.Name, n.sock)
}

// RestartNode stops n's tailscaled and starts it again with its state
// (same node key; tailscaled makes a new disco key every start) and
// waits until it runs again (logged in from its state, no `up`).
func (b *Bed) RestartNode(n *Node) error {
	n.Proc.Stop(5 * time.Second)
	err := n.start()
	if n.Proc != nil {
		b.procs = append(b.procs, n.Proc)
	}
	if err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := n.Status()
		if err == nil && st.BackendState == "Running" {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("backend state %q", st.BackendState)
			}
			return fmt.Errorf("%s after a restart: %w", n.Name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
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
	PublicKey    string // node key ("nodekey:…")
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

// PeerDiscoKey returns the disco key n's netmap holds for the peer with
// host name host (`tailscale debug netmap`).
func (n *Node) PeerDiscoKey(host string) (string, error) {
	out, _, err := runSplit(n.NS, 15*time.Second, n.env, n.cli, "--socket", n.sock, "debug", "netmap")
	if err != nil {
		return "", err
	}
	var nm struct {
		Peers []struct {
			DiscoKey string
			Hostinfo struct{ Hostname string }
		}
	}
	if err := json.Unmarshal([]byte(out), &nm); err != nil {
		return "", fmt.Errorf("tailscale debug netmap: %w", err)
	}
	for _, p := range nm.Peers {
		if strings.EqualFold(p.Hostinfo.Hostname, host) {
			return p.DiscoKey, nil
		}
	}
	return "", fmt.Errorf("%s's netmap has no peer %s", n.Name, host)
}

//go:build linux

package testbed

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// PeerRelayPort is the UDP port of the peer relay in the relay's
// namespace (on RelayIP).
const PeerRelayPort = 40000

// peerRelayHTTPPort is the listener of the Ferry process that serves the
// peer relay (beside the bed's relay, which keeps its own ports).
const peerRelayHTTPPort = 3341

// peerRelayMetricsAddr is that Ferry's --metrics-addr (in the relay's
// namespace).
const peerRelayMetricsAddr = "127.0.0.1:9101"

// PeerRelayTag is the tag the peer relay's node registers with.
const PeerRelayTag = "tag:relay"

// PeerRelayPolicy is Headscale's policy for a peer-relay bed: every node
// may reach every other, and the user fe's nodes hold
// tailscale.com/cap/relay on the nodes tagged PeerRelayTag (Headscale
// compiles the reversed relay-target rule for the clients itself).
const PeerRelayPolicy = `{
  "tagOwners": {"tag:relay": ["fe@"]},
  "grants": [
    {"src": ["*"], "dst": ["*"], "ip": ["*"]},
    {"src": ["fe@"], "dst": ["tag:relay"], "app": {"tailscale.com/cap/relay": [{}]}}
  ]
}
`

// PeerRelayPublicPort is the port the bed's own relay, restarted as the
// peer relay (RestartRelayAsPeerRelay), offers with
// --peer-relay-endpoints: nftables in the relay's namespace redirects it
// to PeerRelayPort, as a port forward in front of a relay would.
const PeerRelayPublicPort = 40001

// peerRelayFlags writes a pre-auth key of the user fe tagged PeerRelayTag
// into dir, sets up the relay namespace's nftables table fe_pr counting
// the peer relay's bytes (PeerRelayBytes), and returns the tailnet flags
// that make a Ferry the peer relay.
func (b *Bed) peerRelayFlags(dir, hostname string, publicPort int) ([]string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := b.Headscale.PreAuthKey("fe", PeerRelayTag)
	if err != nil {
		return nil, err
	}
	keyFile := filepath.Join(dir, "tailnet.key")
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		return nil, err
	}
	if err := b.countPeerRelayPort(publicPort); err != nil {
		return nil, err
	}
	b.PeerRelayAddr = fmt.Sprintf("%s:%d", RelayIP, publicPort)
	flags := []string{
		"--tailnet-login-server", b.Headscale.LoginServer(),
		"--tailnet-auth-key-file", keyFile,
		"--peer-relay-port", strconv.Itoa(PeerRelayPort),
		"--tailnet-hostname", hostname,
	}
	if publicPort != PeerRelayPort {
		flags = append(flags, "--peer-relay-endpoints", b.PeerRelayAddr)
	}
	return flags, nil
}

// countPeerRelayPort sets up the relay namespace's nftables table fe_pr:
// counters of the bytes into and out of PeerRelayPort (PeerRelayBytes),
// and publicPort redirected to it when it differs. Ferry's own STUN
// probes from the port to the bed's STUN server (once a minute) are not
// counted: they are not the nodes' traffic.
func (b *Bed) countPeerRelayPort(publicPort int) error {
	forward := ""
	if publicPort != PeerRelayPort {
		forward = fmt.Sprintf(`
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		udp dport %d redirect to :%d
	}`, publicPort, PeerRelayPort)
	}
	rules := fmt.Sprintf(`table inet fe_pr {%[2]s
	chain input {
		type filter hook input priority 0; policy accept;
		udp dport %[1]d udp sport != %[3]d counter
	}
	chain output {
		type filter hook output priority 0; policy accept;
		udp sport %[1]d udp dport != %[3]d counter
	}
}
`, PeerRelayPort, forward, STUNPort)
	_, err := runInput(b.Netns.Relay, 10*time.Second, nil, strings.NewReader(rules), "nft", "-f", "-")
	return err
}

// StartTailscaledPeerRelay starts the reference: a tailscaled in the
// relay's namespace, logged in with a key of the user fe tagged
// PeerRelayTag, serving Tailscale's own peer relay on PeerRelayPort
// (`tailscale set --relay-server-port`), its bytes counted in fe_pr.
func (b *Bed) StartTailscaledPeerRelay(hostname string) (*Node, error) {
	key, err := b.Headscale.PreAuthKey("fe", PeerRelayTag)
	if err != nil {
		return nil, err
	}
	if err := b.countPeerRelayPort(PeerRelayPort); err != nil {
		return nil, err
	}
	b.PeerRelayAddr = fmt.Sprintf("%s:%d", RelayIP, PeerRelayPort)
	dir := filepath.Join(b.Dir, "peer-relay")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	env := []string{"TS_DEBUG_USE_DERP_HTTP=1"}
	if b.Cfg.Relay.TLS {
		env = []string{"SSL_CERT_FILE=" + b.Relay.CertFile}
	}
	n, err := startNode(b.Cfg.Bins, hostname, b.Netns.Relay, dir, "fe-ts-pr", env, b.Cfg.PeerRelayPlace)
	if n != nil {
		b.procs = append(b.procs, n.Proc)
	}
	if err != nil {
		return n, err
	}
	if err := n.Up(b.Headscale.LoginServer(), key); err != nil {
		return n, err
	}
	if out, err := n.CLI(30*time.Second, "set", "--relay-server-port", strconv.Itoa(PeerRelayPort)); err != nil {
		return n, fmt.Errorf("tailscale set --relay-server-port: %v %s", err, out)
	}
	return n, nil
}

// PeerRelayIdleKnob is Ferry's test-only environment variable that
// shortens its peer relay's steady-state lifetime (Config.PeerRelayIdle).
const PeerRelayIdleKnob = "FERRY_TEST_PEER_RELAY_STEADY_STATE_SECS"

// StartFerryPeerRelay starts a Ferry in the relay's namespace that joins
// the tailnet as a node tagged PeerRelayTag (pre-auth key of the user fe)
// and serves the peer relay on PeerRelayPort; its DERP client reaches the
// bed's relay as the nodes do. Returns once Ferry is connected to its
// home DERP region.
func (b *Bed) StartFerryPeerRelay(hostname string) (*Proc, error) {
	dir := filepath.Join(b.Dir, "peer-relay")
	flags, err := b.peerRelayFlags(dir, hostname, PeerRelayPort)
	if err != nil {
		return nil, err
	}
	env := []string{"RUST_BACKTRACE=1"}
	if b.Cfg.Relay.TLS {
		env = append(env, "SSL_CERT_FILE="+b.Relay.CertFile)
	} else {
		env = append(env, "TS_DEBUG_USE_DERP_HTTP=1")
	}
	if idle := b.Cfg.PeerRelayIdle; idle > 0 {
		env = append(env, fmt.Sprintf("%s=%d", PeerRelayIdleKnob, int64(idle/time.Second)))
	}
	argv := append([]string{b.Cfg.Bins.Ferry,
		"-a", fmt.Sprintf("%s:%d", RelayIP, peerRelayHTTPPort),
		"-c", filepath.Join(dir, "ferry.key"),
		"--stun=false",
		"--workers", "1",
		"--pin=false",
		"--metrics-addr", peerRelayMetricsAddr,
	}, flags...)
	p, err := startProc("ferry peer relay", b.Netns.Relay, env, b.Cfg.PeerRelayPlace.wrap(argv)...)
	if p != nil {
		b.procs = append(b.procs, p)
	}
	if err != nil {
		return p, err
	}
	if err := p.WaitLine("peer relay: connected to the home DERP region", 60*time.Second); err != nil {
		return p, fmt.Errorf("ferry peer relay: %w", err)
	}
	return p, nil
}

// RestartRelayAsPeerRelay restarts the bed's Ferry relay (plain HTTP;
// same key, same ports) with the tailnet flags and
// --peer-relay-endpoints RelayIP:PeerRelayPublicPort: it is then both the
// tailnet's DERP server and its peer relay, and its own DERP client
// connects to itself. The nodes reconnect to it by themselves;
// Relay.Metrics then includes the peer relay's series.
func (b *Bed) RestartRelayAsPeerRelay(hostname string) error {
	opts := b.Relay.Opts
	if opts.Kind != Ferry || opts.TLS {
		return fmt.Errorf("RestartRelayAsPeerRelay: needs Ferry over plain HTTP, not %s", opts.Name())
	}
	dir := filepath.Join(b.Dir, "relay")
	flags, err := b.peerRelayFlags(dir, hostname, PeerRelayPublicPort)
	if err != nil {
		return err
	}
	opts.ExtraArgs = append(append([]string(nil), opts.ExtraArgs...), flags...)
	opts.env = append(append([]string(nil), opts.env...), "TS_DEBUG_USE_DERP_HTTP=1")
	return b.restartRelay(opts)
}

// RestartRelay restarts the bed's relay as it runs (same key, ports and
// flags; a Ferry peer relay keeps its tailnet state file).
func (b *Bed) RestartRelay() error {
	return b.restartRelay(b.Relay.Opts)
}

func (b *Bed) restartRelay(opts DerpServerOptions) error {
	bin := b.Cfg.Bins.Derper
	if opts.Kind == Ferry {
		bin = b.Cfg.Bins.Ferry
	}
	b.Relay.Proc.Stop(5 * time.Second)
	r, err := startRelay(bin, b.Netns.Relay, filepath.Join(b.Dir, "relay"), opts)
	if r != nil && r.Proc != nil {
		b.procs = append(b.procs, r.Proc)
	}
	if err != nil {
		return err
	}
	b.Relay = r
	return nil
}

// PeerRelayBytes reads the fe_pr counters: bytes that reached the peer
// relay's port and bytes it sent.
func (b *Bed) PeerRelayBytes() (in, out int64, err error) {
	text, err := run(b.Netns.Relay, 10*time.Second, nil, "nft", "list", "table", "inet", "fe_pr")
	if err != nil {
		return 0, 0, err
	}
	var seen []int64
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "bytes" {
				n, err := strconv.ParseInt(f[i+1], 10, 64)
				if err != nil {
					return 0, 0, fmt.Errorf("fe_pr: %q: %v", line, err)
				}
				seen = append(seen, n)
			}
		}
	}
	if len(seen) != 2 {
		return 0, 0, fmt.Errorf("fe_pr: %d byte counters, want 2:\n%s", len(seen), text)
	}
	return seen[0], seen[1], nil
}

// CPUSeconds is the process's user+system CPU time so far (all threads).
func (p *Proc) CPUSeconds() (float64, error) {
	return procCPUSeconds(p.Pid())
}

// PeerRelayMetrics reads the peer-relay Ferry's /metrics (from inside the
// relay's namespace).
func (b *Bed) PeerRelayMetrics() (Metrics, error) {
	client := &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return dialInNamespace(ctx, b.Netns.Relay, peerRelayMetricsAddr)
			},
			DisableKeepAlives: true,
		},
	}
	return getMetrics(client, "http://"+peerRelayMetricsAddr+"/metrics")
}

// BlockPeerRelay drops (block) or lets through again (!block) the nodes'
// UDP to the peer relay's port: an nftables table fe_prblock in each
// node's namespace. DERP (TCP) is untouched.
func (b *Bed) BlockPeerRelay(block bool) error {
	rules := fmt.Sprintf(`table inet fe_prblock {
	chain output {
		type filter hook output priority 0; policy accept;
		ip daddr %s udp dport %d drop
	}
}
`, RelayIP, PeerRelayPort)
	for _, ns := range []string{b.Netns.A, b.Netns.B} {
		var err error
		if block {
			_, err = runInput(ns, 10*time.Second, nil, strings.NewReader(rules), "nft", "-f", "-")
		} else {
			_, err = run(ns, 10*time.Second, nil, "nft", "delete", "table", "inet", "fe_prblock")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// PeerRelayStatus runs `ferry status` against the peer-relay Ferry's
// metrics (from inside the relay's namespace) and returns its text.
func (b *Bed) PeerRelayStatus() (string, error) {
	return run(b.Netns.Relay, 20*time.Second, nil, b.Cfg.Bins.Ferry, "status", peerRelayMetricsAddr)
}

// UDPCounters reads the kernel's UDP counters (/proc/net/snmp, "Udp:")
// in namespace ns: RcvbufErrors, SndbufErrors and the rest by name.
func UDPCounters(ns string) (map[string]int64, error) {
	text, err := run(ns, 10*time.Second, nil, "cat", "/proc/net/snmp")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = f[1:]
			continue
		}
		out := make(map[string]int64, len(names))
		for i, v := range f[1:] {
			if i < len(names) {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("/proc/net/snmp: %q: %v", line, err)
				}
				out[names[i]] = n
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("/proc/net/snmp in %s: no Udp: lines", ns)
}

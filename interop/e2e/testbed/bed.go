//go:build linux

package testbed

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// Config describes one bed.
type Config struct {
	Bins  Binaries
	Relay DerpServerOptions
	// NodePlace places tailscaled, iperf3 and ping (CPUs, nice value).
	NodePlace Placement
	// AllowDirectUDP leaves UDP between the nodes open, so that they find
	// a direct WireGuard path and the relay carries only their first
	// packets: the benchmark's baseline (WireGuard's own limit).
	AllowDirectUDP bool
	// LocalNodeDir, when set, starts a third tailscaled in the relay's
	// namespace (state and LocalAPI socket in this directory), logged in to
	// the same tailnet before the two nodes: the tailscaled that
	// `--verify-clients` asks.
	LocalNodeDir string
	// Peer, when set, is a second relay node in the relay's region (TLS
	// on PeerTLSPort, both meshed with --mesh-with and one mesh key,
	// certificates from one throw-away CA). Node A's TCP to the peer and
	// node B's to the relay are refused, so A's home is the relay and B's
	// the peer, and their traffic crosses the mesh; Bed.AllowAToPeer
	// lifts A's rule.
	Peer *DerpServerOptions
	// Policy, when set, is Headscale's policy file (HuJSON); without it
	// every node may reach every other.
	Policy string
	// PeerRelayPlace places the peer relay that StartFerryPeerRelay or
	// StartTailscaledPeerRelay starts (CPUs, nice value).
	PeerRelayPlace Placement
	// PeerRelayIdle, when set, is the steady-state lifetime (whole
	// seconds) of the Ferry peer relay that StartFerryPeerRelay starts,
	// through Ferry's test-only environment knob; zero keeps Ferry's
	// default (5 minutes).
	PeerRelayIdle time.Duration
	// Congestion, when set, is the TCP congestion control of every
	// connection on the bed's network (the nodes' TCP to DERP and to
	// Headscale, the servers' side of it): the routes of 10.78.0.0/24 in
	// every namespace get `congctl` (a namespace's sysctl may only pick
	// what the host allows; a route may pick any).
	Congestion string
	Logf       Logf
}

// Bed is a running network: relay, Headscale and two logged-in nodes.
type Bed struct {
	Cfg       Config
	Netns     Netns
	Dir       string
	Relay     *Relay
	Peer      *Relay // with Config.Peer
	Headscale *Headscale
	A, B      *Node
	Local     *Node // with Config.LocalNodeDir
	// PeerRelayAddr is the address a Ferry peer relay offers
	// ("10.78.0.1:40000"), once started.
	PeerRelayAddr string

	procs     []*Proc
	closeOnce sync.Once
}

var bedSeq atomic.Int32

// New prepares a bed; nothing is created until Up. Always Close it.
func New(cfg Config) *Bed {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	seq := bedSeq.Add(1)
	base := fmt.Sprintf("%s%d-%d-", nsPrefix, os.Getpid(), seq)
	return &Bed{
		Cfg:   cfg,
		Netns: Netns{Relay: base + "r", A: base + "a", B: base + "b"},
	}
}

// Up creates the namespaces, starts the relay and Headscale, starts both
// nodes, logs them in and waits until each sees the other online. On error
// the bed is half-built: Close still cleans up whatever exists.
func (b *Bed) Up() error {
	logf := b.Cfg.Logf
	start := time.Now()
	if b.Cfg.Bins.Ferry == "" && b.Cfg.Relay.Kind == Ferry {
		return fmt.Errorf("no ferry binary")
	}
	dir, err := os.MkdirTemp("", "fe-bed-")
	if err != nil {
		return err
	}
	b.Dir = dir
	for _, d := range []string{"relay", "peer", "headscale", "a", "b"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := createTopology(b.Netns, b.Cfg.AllowDirectUDP); err != nil {
		return fmt.Errorf("network namespaces: %w", err)
	}
	if err := setCongestion(b.Netns, b.Cfg.Congestion); err != nil {
		return err
	}

	binOf := func(kind string) string {
		if kind == Ferry {
			return b.Cfg.Bins.Ferry
		}
		return b.Cfg.Bins.Derper
	}
	relayOpts := b.Cfg.Relay
	if b.Cfg.Peer != nil {
		if !relayOpts.TLS || !b.Cfg.Peer.TLS {
			return fmt.Errorf("a two-node region needs TLS on both (mesh links are TLS)")
		}
		if b.Cfg.Peer.Kind == Ferry && b.Cfg.Bins.Ferry == "" {
			return fmt.Errorf("no ferry binary")
		}
		var peerOpts DerpServerOptions
		if relayOpts, peerOpts, err = regionOptions(dir, relayOpts, *b.Cfg.Peer); err != nil {
			return err
		}
		b.Peer, err = startRelay(binOf(peerOpts.Kind), b.Netns.Relay, filepath.Join(dir, "peer"), peerOpts)
		if b.Peer != nil && b.Peer.Proc != nil {
			b.procs = append(b.procs, b.Peer.Proc)
		}
		if err != nil {
			return err
		}
	}
	b.Relay, err = startRelay(binOf(relayOpts.Kind), b.Netns.Relay, filepath.Join(dir, "relay"), relayOpts)
	if b.Relay != nil && b.Relay.Proc != nil {
		b.procs = append(b.procs, b.Relay.Proc)
	}
	if err != nil {
		return err
	}

	nodes := []mapNode{{Name: "900a", DERP: b.Relay.Port, STUN: STUNPort}}
	if b.Peer != nil {
		nodes = append(nodes, mapNode{Name: "900b", DERP: b.Peer.Port, STUN: PeerSTUNPort})
		// Headscale shuffles a region's nodes, so the order cannot pin
		// the homes: each node is kept off the other's relay instead.
		if err := refuseRelay(b.Netns.B, b.Relay.Port); err != nil {
			return err
		}
		if err := refuseRelay(b.Netns.A, b.Peer.Port); err != nil {
			return err
		}
	}
	b.Headscale, err = startHeadscale(b.Cfg.Bins.Headscale, b.Netns.Relay, filepath.Join(dir, "headscale"), nodes, b.Cfg.Policy)
	if b.Headscale != nil && b.Headscale.Proc != nil {
		b.procs = append(b.procs, b.Headscale.Proc)
	}
	if err != nil {
		return err
	}
	authKey, err := b.Headscale.PreAuthKey("fe")
	if err != nil {
		return err
	}

	// How the nodes reach the relay: trust its certificate, or plain HTTP.
	var env []string
	if b.Cfg.Relay.TLS {
		env = append(env, "SSL_CERT_FILE="+b.Relay.CertFile) // the CA's, in a region
	} else {
		env = append(env, "TS_DEBUG_USE_DERP_HTTP=1")
	}
	if b.Cfg.LocalNodeDir != "" {
		n, err := startNode(b.Cfg.Bins, "fe-r", b.Netns.Relay, b.Cfg.LocalNodeDir, "fe-ts-r", env, Placement{})
		if n != nil {
			b.Local = n
			b.procs = append(b.procs, n.Proc)
		}
		if err != nil {
			return err
		}
		if err := n.Up(b.Headscale.LoginServer(), authKey); err != nil {
			return err
		}
	}
	for _, spec := range []struct {
		dst      **Node
		name, ns string
		dir, tun string
	}{
		{&b.A, "fe-a", b.Netns.A, filepath.Join(dir, "a"), "fe-ts-a"},
		{&b.B, "fe-b", b.Netns.B, filepath.Join(dir, "b"), "fe-ts-b"},
	} {
		n, err := startNode(b.Cfg.Bins, spec.name, spec.ns, spec.dir, spec.tun, env, b.Cfg.NodePlace)
		if n != nil {
			*spec.dst = n
			b.procs = append(b.procs, n.Proc)
		}
		if err != nil {
			return err
		}
	}
	upErrs := make(chan error, 2)
	for _, n := range []*Node{b.A, b.B} {
		go func() { upErrs <- n.Up(b.Headscale.LoginServer(), authKey) }()
	}
	if err := errors.Join(<-upErrs, <-upErrs); err != nil {
		return err
	}
	logf("%s: nodes up (%s %s, %s %s) in %.1f s", b.Cfg.Relay.Name(), b.A.Name, b.A.IP, b.B.Name, b.B.IP, time.Since(start).Seconds())
	return b.WaitPeersOnline(45 * time.Second)
}

// WaitPeersOnline waits until each node lists the other as online (right
// after login the peer shows offline for a second or two).
func (b *Bed) WaitPeersOnline(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ok := true
		for _, pair := range [][2]*Node{{b.A, b.B}, {b.B, b.A}} {
			st, err := pair[0].Status()
			if err != nil {
				ok, last = false, err.Error()
				break
			}
			p := st.PeerNamed(pair[1].Name)
			if p == nil || !p.Online {
				ok, last = false, fmt.Sprintf("%s does not see %s online (peer: %+v)", pair[0].Name, pair[1].Name, p)
				break
			}
		}
		if ok {
			return nil
		}
		time.Sleep(300 * time.Millisecond)
	}
	return fmt.Errorf("peers not online after %v: %s", timeout, last)
}

// Logs returns the output of every process the bed started, each cut to
// its last n lines.
func (b *Bed) Logs(n int) string {
	var s string
	for _, p := range b.procs {
		s += fmt.Sprintf("----- %s (last %d lines) -----\n%s\n", p.Name, n, tailLines(p.Logs(), n))
	}
	return s
}

// Close stops every process (nodes first, so they log out of a live relay
// and control server), deletes the namespaces and the work directory.
func (b *Bed) Close() {
	b.closeOnce.Do(func() {
		for i := len(b.procs) - 1; i >= 0; i-- {
			b.procs[i].Stop(5 * time.Second)
		}
		deleteTopology(b.Netns)
		if b.Dir != "" && os.Getenv("FERRY_E2E_KEEP") == "" {
			os.RemoveAll(b.Dir)
		}
	})
}

// AddProc registers an extra process (an iperf3 server) to stop on Close.
func (b *Bed) AddProc(p *Proc) { b.procs = append(b.procs, p) }

// PeerTLSPort and PeerSTUNPort are the second relay node's ports.
const (
	PeerTLSPort  = 8443
	PeerSTUNPort = 3479
)

// regionOptions makes the two relay nodes of a region: one CA for both
// certificates, one mesh key, each with --mesh-with listing both (itself
// included, as operators write it), trusting the CA.
func regionOptions(dir string, first, second DerpServerOptions) (DerpServerOptions, DerpServerOptions, error) {
	ca, err := newCA(dir)
	if err != nil {
		return first, second, err
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return first, second, err
	}
	psk := filepath.Join(dir, "mesh.key")
	if err := os.WriteFile(psk, []byte(hex.EncodeToString(raw[:])+"\n"), 0o600); err != nil {
		return first, second, err
	}
	mesh := fmt.Sprintf("%[1]s:%[2]d/%[3]s,%[1]s:%[4]d/%[3]s", RelayHostname, TLSPort, RelayIP, PeerTLSPort)
	second.port, second.stunPort = PeerTLSPort, PeerSTUNPort
	for _, o := range []*DerpServerOptions{&first, &second} {
		o.ca = ca
		o.env = append(o.env, "SSL_CERT_FILE="+ca.File)
		o.ExtraArgs = append(append([]string(nil), o.ExtraArgs...), "--mesh-psk-file", psk, "--mesh-with", mesh)
	}
	return first, second, nil
}

// AllowAToPeer lets node A reach the region's second relay node (see
// Config.Peer).
func (b *Bed) AllowAToPeer() error {
	_, err := run(b.Netns.A, 10*time.Second, nil, "nft", "delete", "table", "inet", "fe_refuse")
	return err
}

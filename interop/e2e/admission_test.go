//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"ferry.invalid/interop/e2e/testbed"
	"tailscale.com/derp"
	"tailscale.com/derp/derphttp"
	"tailscale.com/net/netmon"
	"tailscale.com/types/key"
)

// TestAdmission: client admission against real software, for ferry and
// derper alike. With --verify-client-url pointing at Headscale's own
// /verify, and with --verify-clients asking a real tailscaled beside the
// relay, the tailnet's two nodes are admitted and reach each other through
// the relay, while a stranger's key is refused.
func TestAdmission(t *testing.T) {
	setup(t)
	for _, kind := range []string{testbed.Ferry, testbed.Derper} {
		if !relayKindSelected(t, kind) {
			continue
		}
		for _, how := range []string{"headscale-verify", "verify-clients"} {
			t.Run(kind+"-"+how, func(t *testing.T) {
				if kind == testbed.Ferry && ferryErr != nil {
					t.Fatal(ferryErr)
				}
				opts := testbed.DerpServerOptions{Kind: kind}
				cfg := testbed.Config{Bins: bins, Logf: t.Logf}
				switch how {
				case "headscale-verify":
					opts.ExtraArgs = []string{
						"--verify-client-url", fmt.Sprintf("http://%s:%d/verify", testbed.RelayIP, testbed.HeadscalePort),
						"--verify-client-url-fail-open=false",
					}
				case "verify-clients":
					cfg.LocalNodeDir = t.TempDir()
					opts.ExtraArgs = []string{"--verify-clients", "--socket", filepath.Join(cfg.LocalNodeDir, "tailscaled.sock")}
				}
				if kind == testbed.Ferry {
					opts.ExtraArgs = append(opts.ExtraArgs, strings.Fields(os.Getenv("FERRY_ARGS"))...)
				}
				cfg.Relay = opts
				bed := testbed.New(cfg)
				t.Cleanup(bed.Close)
				t.Cleanup(func() {
					if t.Failed() {
						t.Logf("process output:\n%s", bed.Logs(40))
					}
				})
				if err := bed.Up(); err != nil {
					t.Fatalf("bringing the network up: %v", err)
				}
				// The nodes' DERP connections come up (and are admitted) in
				// their own time after login: wait for a disco pong through
				// the relay first, as the main test does.
				var out string
				for attempt := 0; attempt < 5 && !strings.Contains(out, "via DERP(fe)"); attempt++ {
					out, _ = bed.A.TailscalePing(bed.B.IP, 3)
				}
				if !strings.Contains(out, "via DERP(fe)") {
					t.Fatalf("tailscale ping never went via DERP(fe):\n%s", out)
				}
				pr, err := testbed.Ping(bed.A, bed.B.IP, 5, 200*time.Millisecond)
				if err != nil || pr.Received == 0 {
					t.Fatalf("admitted nodes cannot ping through the relay: %+v, %v", pr, err)
				}
				if err := strangerRefused(bed); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// relayKindSelected applies INTEROP_SERVERS, as relayConfigs does.
func relayKindSelected(t *testing.T, kind string) bool {
	for _, o := range relayConfigs(t) {
		if o.Kind == kind {
			return true
		}
	}
	return false
}

// strangerRefused connects a DERP client with a key no tailnet knows, from
// inside the relay's namespace, and expects the connection closed without
// serverInfo.
func strangerRefused(bed *testbed.Bed) error {
	url := fmt.Sprintf("http://%s:%d/derp", testbed.RelayIP, bed.Relay.Port)
	c, err := derphttp.NewClient(key.NewNode(), url, func(string, ...any) {}, netmon.NewStatic())
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetURLDialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
		return bed.DialRelayNamespace(ctx, addr)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Connect(ctx); err != nil {
		return fmt.Errorf("stranger: connect: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		m, err := c.Recv()
		if err == nil {
			if _, ok := m.(derp.ServerInfoMessage); ok {
				err = fmt.Errorf("got serverInfo")
			} else {
				err = fmt.Errorf("got %T", m)
			}
			done <- fmt.Errorf("stranger was admitted: %v", err)
			return
		}
		if strings.Contains(err.Error(), "EOF") || strings.Contains(err.Error(), "reset") || strings.Contains(err.Error(), "closed") {
			done <- nil
			return
		}
		done <- fmt.Errorf("stranger: unexpected error %v", err)
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		return fmt.Errorf("stranger: neither admitted nor refused within 10 s")
	}
}

//go:build linux

package testbed

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// HeadscalePort is the control server's port on RelayIP.
const HeadscalePort = 8080

// Headscale is the running control server.
type Headscale struct {
	Proc  *Proc
	bin   string
	cfg   string
	ns    string
	users map[string]string // user name to ID, once created
}

// LoginServer is the URL nodes log in to.
func (h *Headscale) LoginServer() string {
	return fmt.Sprintf("http://%s:%d", RelayIP, HeadscalePort)
}

// headscaleConfig is Headscale's configuration: no DERP map but ours (its
// default would fetch Tailscale's from the Internet), no update check, no
// DNS pushed to nodes, and the policy file {{POLICY}} ("": none, so
// everyone may reach everyone).
const headscaleConfig = `server_url: http://{{IP}}:{{PORT}}
listen_addr: {{IP}}:{{PORT}}
metrics_listen_addr: 127.0.0.1:9090
grpc_listen_addr: 127.0.0.1:50443
grpc_allow_insecure: false
noise:
  private_key_path: {{DIR}}/noise_private.key
prefixes:
  v4: 100.64.0.0/10
  v6: fd7a:115c:a1e0::/48
  allocation: sequential
derp:
  server:
    enabled: false
  urls: []
  paths:
    - {{DIR}}/derp.yaml
  auto_update_enabled: false
  update_frequency: 24h
disable_check_updates: true
database:
  type: sqlite
  sqlite:
    path: {{DIR}}/db.sqlite
    write_ahead_log: true
log:
  level: info
  format: text
policy:
  mode: file
  path: "{{POLICY}}"
dns:
  magic_dns: false
  override_local_dns: false
  nameservers:
    global: []
unix_socket: {{DIR}}/headscale.sock
unix_socket_permission: "0770"
logtail:
  enabled: false
taildrop:
  enabled: false
`

// mapNode is one DERP node of the test region.
type mapNode struct {
	Name       string
	DERP, STUN int
}

// derpMapYAML is the DERP map Headscale hands to the nodes: one region
// with the relay node(s) in order (Headscale reads lower-case Go field
// names).
func derpMapYAML(nodes []mapNode) string {
	var b strings.Builder
	b.WriteString("regions:\n  900:\n    regionid: 900\n    regioncode: fe\n    regionname: Ferry test bed\n    nodes:\n")
	for _, n := range nodes {
		fmt.Fprintf(&b, "      - name: %s\n        regionid: 900\n        hostname: %s\n        ipv4: %s\n        ipv6: none\n        stunport: %d\n        derpport: %d\n",
			n.Name, RelayHostname, RelayIP, n.STUN, n.DERP)
	}
	return b.String()
}

// startHeadscale writes the configuration and DERP map into dir, starts
// Headscale in namespace ns and waits until it answers /health.
func startHeadscale(bin, ns, dir string, nodes []mapNode, policy string) (*Headscale, error) {
	h := &Headscale{bin: bin, ns: ns, cfg: filepath.Join(dir, "config.yaml"), users: map[string]string{}}
	policyPath := ""
	if policy != "" {
		policyPath = filepath.Join(dir, "policy.json")
		if err := os.WriteFile(policyPath, []byte(policy), 0o600); err != nil {
			return nil, err
		}
	}
	repl := strings.NewReplacer(
		"{{IP}}", RelayIP,
		"{{PORT}}", strconv.Itoa(HeadscalePort),
		"{{DIR}}", dir,
		"{{POLICY}}", policyPath,
	)
	if err := os.WriteFile(h.cfg, []byte(repl.Replace(headscaleConfig)), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "derp.yaml"), []byte(derpMapYAML(nodes)), 0o600); err != nil {
		return nil, err
	}
	var err error
	h.Proc, err = startProc("headscale", ns, nil, bin, "-c", h.cfg, "serve")
	if err != nil {
		return nil, err
	}
	return h, h.waitHealthy(30 * time.Second)
}

func (h *Headscale) waitHealthy(timeout time.Duration) error {
	client := &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
				return dialInNamespace(ctx, h.ns, addr)
			},
			DisableKeepAlives: true,
		},
	}
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		if done, err := h.Proc.Exited(); done {
			return fmt.Errorf("headscale exited during start-up: %v", err)
		}
		resp, err := client.Get(h.LoginServer() + "/health")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET /health: %s", resp.Status)
		}
		lastErr = err
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("headscale not healthy after %v: %v", timeout, lastErr)
}

// cli runs a headscale command and decodes its JSON output into v.
func (h *Headscale) cli(v any, args ...string) error {
	argv := append([]string{h.bin, "-c", h.cfg}, args...)
	argv = append(argv, "-o", "json")
	out, _, err := runSplit(h.ns, 30*time.Second, nil, argv...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		return fmt.Errorf("headscale %s: decoding %q: %w", strings.Join(args, " "), out, err)
	}
	return nil
}

// PreAuthKey creates the user (the first time) and a reusable pre-auth
// key for it; nodes registered with a key made with tags carry them.
func (h *Headscale) PreAuthKey(user string, tags ...string) (string, error) {
	id, ok := h.users[user]
	if !ok {
		var u struct {
			ID json.Number `json:"id"`
		}
		if err := h.cli(&u, "users", "create", user); err != nil {
			return "", err
		}
		if u.ID == "" {
			return "", fmt.Errorf("headscale users create %s: no id in the answer", user)
		}
		id = u.ID.String()
		h.users[user] = id
	}
	var k struct {
		Key string `json:"key"`
	}
	args := []string{"preauthkeys", "create", "--user", id, "--reusable", "--expiration", "1h"}
	if len(tags) > 0 {
		args = append(args, "--tags", strings.Join(tags, ","))
	}
	if err := h.cli(&k, args...); err != nil {
		return "", err
	}
	if k.Key == "" {
		return "", fmt.Errorf("headscale preauthkeys create: no key in the answer")
	}
	return k.Key, nil
}

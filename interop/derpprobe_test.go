package interop

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDerpprobe: Tailscale's derpprobe (TLS, STUN and the single-node "mesh"
// probe) reports a TLS server healthy, with and without the mesh key.
func TestDerpprobe(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		for _, withKey := range []bool{false, true} {
			name := "no-mesh-key"
			if withKey {
				name = "mesh-key"
			}
			t.Run(name, func(t *testing.T) {
				s := startServer(t, kind, serverOpts{tls: true, mesh: withKey})
				dir := t.TempDir()
				mapFile := filepath.Join(dir, "derpmap.json")
				dm := map[string]any{
					"Regions": map[string]any{
						"900": map[string]any{
							"RegionID":   900,
							"RegionCode": "interop",
							"RegionName": "Interop test",
							"Nodes": []any{map[string]any{
								"Name":     "900a",
								"RegionID": 900,
								"HostName": "localhost",
								"IPv4":     "127.0.0.1",
								// IPv6 deliberately omitted: derpprobe starts a udp6
								// STUN probe for any non-empty IPv6 string, and "none"
								// makes it send to a nil IP and time out.
								"DERPPort": s.port,
								"STUNPort": s.stunPort,
							}},
						},
					},
					"omitDefaultRegions": true,
				}
				b, err := json.MarshalIndent(dm, "", "  ")
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(mapFile, b, 0o644); err != nil {
					t.Fatal(err)
				}

				args := []string{"-derp-map", "file://" + mapFile, "-once", "-spread=false"}
				if withKey {
					args = append(args, "-mesh-psk-file", s.pskFile)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				defer cancel()
				cmd := exec.CommandContext(ctx, derpprobeBin, args...)
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+s.certFile, "SSL_CERT_DIR="+dir)
				out, err := cmd.CombinedOutput()
				t.Logf("derpprobe %s\n%s", strings.Join(args, " "), out)
				if err != nil {
					t.Fatalf("derpprobe failed: %v", err)
				}
				var good []string
				for _, line := range strings.Split(string(out), "\n") {
					if strings.Contains(line, "bad: ") {
						t.Errorf("derpprobe failure: %s", line)
					}
					if _, g, ok := strings.Cut(line, "good: "); ok {
						good = append(good, g)
					}
				}
				// Expect the TLS probe, the IPv4 STUN probe and the
				// single-node relay probe to have run and passed.
				for _, want := range []string{"derp/interop/900a/tls", "derp/interop/900a/udp:", "derp/interop/900a/900a/mesh"} {
					found := false
					for _, g := range good {
						if strings.HasPrefix(g, want) {
							found = true
						}
					}
					if !found {
						t.Errorf("no passing %q probe in derpprobe output", want)
					}
				}
			})
		}
	})
}

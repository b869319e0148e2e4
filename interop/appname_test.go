package interop

// clientInfo AppName validation, with hand-made clientInfo frames (this
// module's v1.102.5 client sends no name, and v1.104.7's refuses to send
// an invalid one): derper v1.104.7 and ferry in the same run accept at
// most 32 bytes of printable ASCII and close the connection, before
// serverInfo, on anything else. (interop/reference checks the names a
// real v1.104.7 client sends, and --disallow-app-names.)

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestAppNameValidation(t *testing.T) {
	cases := []struct {
		name, app string
		valid     bool
	}{
		{"empty", "", true},
		{"printable-32", " !~" + strings.Repeat("a", 28) + "Z", true},
		{"33-bytes", strings.Repeat("a", 33), false},
		{"control", "app\x01", false},
		{"newline", "app\n", false},
		{"del", "app\x7f", false},
		{"non-ascii", "appé", false},
	}
	eachServer(t, func(t *testing.T, kind string) {
		s := startServer(t, kind, serverOpts{})
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				info, err := json.Marshal(map[string]any{"version": 2, "AppName": c.app})
				if err != nil {
					t.Fatal(err)
				}
				r := s.rawUpgrade(t)
				if err := r.writeFrame(frameClientInfo, r.clientInfoPayload(string(info))); err != nil {
					t.Fatalf("writing clientInfo: %v", err)
				}
				if c.valid {
					r.expectServerInfo()
				} else {
					r.expectClosed(5 * time.Second)
				}
			})
		}
		// The server keeps serving.
		relayOK(t, s.newClient(t, "a"), s.newClient(t, "b"))
	})
}

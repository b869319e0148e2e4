package interop

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"
)

// TestBootstrapDNS: /bootstrap-dns serves the published names' addresses
// to everyone and an unpublished name only to a client that asks for it,
// with the same JSON from both servers. "localhost" resolves from
// /etc/hosts; an IP literal resolves to itself, which makes an exact answer
// to pin.
func TestBootstrapDNS(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		s := startServer(t, kind, serverOpts{args: []string{
			"--bootstrap-dns-names", "localhost",
			"--unpublished-bootstrap-dns-names", "127.0.0.9",
		}})
		get := func(query string) (map[string][]string, string) {
			t.Helper()
			// The first refresh runs at start-up; wait (bounded) for it.
			for i := 0; ; i++ {
				res, err := s.httpc.Get(s.baseURL() + "/bootstrap-dns" + query)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					t.Fatalf("status %d", res.StatusCode)
				}
				if ct := res.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("Content-Type %q", ct)
				}
				if len(body) > 0 || i == 100 {
					var m map[string][]string
					if err := json.Unmarshal(body, &m); err != nil {
						t.Fatalf("body %q: %v", body, err)
					}
					for _, ips := range m {
						slices.Sort(ips)
					}
					return m, string(body)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		all, raw := get("")
		t.Logf("%s: %s", kind, raw)
		if _, ok := all["127.0.0.9"]; ok || len(all) != 1 {
			t.Errorf("published answer %v; want only localhost", all)
		}
		if !slices.Contains(all["localhost"], "127.0.0.1") {
			t.Errorf("localhost resolved to %v; want 127.0.0.1 among them", all["localhost"])
		}
		_, one := get("?q=127.0.0.9")
		if want := "{\n\t\"127.0.0.9\": [\n\t\t\"127.0.0.9\"\n\t]\n}"; one != want {
			t.Errorf("?q=127.0.0.9 answered %q; want %q", one, want)
		}
		other, _ := get("?q=nothing.invalid")
		if len(other) != 1 || other["localhost"] == nil {
			t.Errorf("?q=nothing.invalid answered %v; want the published answer", other)
		}
	})
}

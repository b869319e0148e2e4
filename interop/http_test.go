package interop

import (
	"net/http"
	"strings"
	"testing"
)

// TestHTTPSurface: the non-DERP HTTP endpoints (§11).
func TestHTTPSurface(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		s := startServer(t, kind, serverOpts{})
		do := func(t *testing.T, method, path string, hdr ...string) (*http.Response, string) {
			t.Helper()
			req, err := http.NewRequest(method, s.baseURL()+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i+1 < len(hdr); i += 2 {
				req.Header.Set(hdr[i], hdr[i+1])
			}
			resp, err := s.httpc.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			defer resp.Body.Close()
			return resp, readAllLimit(resp.Body)
		}
		wantStatus := func(t *testing.T, resp *http.Response, want int) {
			t.Helper()
			if resp.StatusCode != want {
				t.Fatalf("%s %s: status %s; want %d", resp.Request.Method, resp.Request.URL.Path, resp.Status, want)
			}
		}

		t.Run("generate_204", func(t *testing.T) {
			const respHdr = "X-Tailscale-Response"
			resp, body := do(t, "GET", "/generate_204", "X-Tailscale-Challenge", "ts_127.0.0.1")
			wantStatus(t, resp, 204)
			if got := resp.Header.Get(respHdr); got != "response ts_127.0.0.1" {
				t.Errorf("%s = %q; want %q", respHdr, got, "response ts_127.0.0.1")
			}
			if body != "" {
				t.Errorf("204 with body %q", body)
			}
			if cc := resp.Header.Get("Cache-Control"); !strings.Contains(cc, "no-store") {
				t.Errorf("Cache-Control = %q; want no-cache, no-store, ...", cc)
			}

			resp, _ = do(t, "GET", "/generate_204")
			wantStatus(t, resp, 204)
			if got, ok := resp.Header[respHdr]; ok {
				t.Errorf("no challenge, but %s = %q", respHdr, got)
			}

			ok64 := strings.Repeat("a", 60) + "_.:-"
			resp, _ = do(t, "GET", "/generate_204", "X-Tailscale-Challenge", ok64)
			wantStatus(t, resp, 204)
			if got := resp.Header.Get(respHdr); got != "response "+ok64 {
				t.Errorf("64-char challenge: %s = %q; want %q", respHdr, got, "response "+ok64)
			}

			for _, bad := range []string{strings.Repeat("a", 65), "ts/127.0.0.1", "ts 1", "a=b", "ts_ü"} {
				resp, _ = do(t, "GET", "/generate_204", "X-Tailscale-Challenge", bad)
				wantStatus(t, resp, 204)
				if got, ok := resp.Header[respHdr]; ok {
					t.Errorf("invalid challenge %q answered with %s = %q", bad, respHdr, got)
				}
			}

			resp, _ = do(t, "POST", "/generate_204", "X-Tailscale-Challenge", "ts_127.0.0.1")
			wantStatus(t, resp, 204)
		})

		for _, path := range []string{"/derp/probe", "/derp/latency-check"} {
			t.Run(strings.TrimPrefix(path, "/derp/"), func(t *testing.T) {
				for _, method := range []string{"GET", "HEAD"} {
					resp, body := do(t, method, path)
					wantStatus(t, resp, 200)
					if got := resp.Header.Get("Access-Control-Allow-Origin"); got != "*" {
						t.Errorf("%s %s: Access-Control-Allow-Origin = %q; want *", method, path, got)
					}
					if body != "" {
						t.Errorf("%s %s: body %q; want empty", method, path, body)
					}
				}
				for _, method := range []string{"POST", "PUT"} {
					resp, _ := do(t, method, path)
					wantStatus(t, resp, 405)
				}
			})
		}

		t.Run("derp-without-upgrade", func(t *testing.T) {
			resp, body := do(t, "GET", "/derp")
			wantStatus(t, resp, 426)
			if !strings.Contains(body, "DERP requires connection upgrade") {
				t.Errorf("426 body %q", body)
			}
			resp, _ = do(t, "GET", "/derp", "Upgrade", "h2c", "Connection", "Upgrade")
			wantStatus(t, resp, 426)
		})

		t.Run("home", func(t *testing.T) {
			resp, body := do(t, "GET", "/")
			wantStatus(t, resp, 200)
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
				t.Errorf("/: Content-Type %q; want text/html", ct)
			}
			if !strings.Contains(strings.ToLower(body), "<html") {
				t.Errorf("/: body is not an HTML page: %.200q", body)
			}
			if got := resp.Header.Get("X-Frame-Options"); got != "DENY" {
				t.Errorf("/: X-Frame-Options = %q; want DENY", got)
			}
		})

		t.Run("unknown-path", func(t *testing.T) {
			resp, _ := do(t, "GET", "/nope")
			if kind == "derper" {
				// derper mounts its home page on "/" as a catch-all, so
				// unknown paths get the home page (200, HTML).
				wantStatus(t, resp, 200)
				if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
					t.Errorf("/nope: Content-Type %q; want text/html (the home page)", ct)
				}
				return
			}
			// Ferry deliberately answers 404 for paths it does not serve
			// (a small home page, 404 for the rest); no client
			// relies on the catch-all.
			wantStatus(t, resp, 404)
		})

		t.Run("robots.txt", func(t *testing.T) {
			resp, body := do(t, "GET", "/robots.txt")
			wantStatus(t, resp, 200)
			if body != "User-agent: *\nDisallow: /\n" {
				t.Errorf("/robots.txt body %q", body)
			}
		})

		t.Run("debug-varz", func(t *testing.T) {
			resp, body := do(t, "GET", "/debug/varz")
			wantStatus(t, resp, 200)
			if !strings.Contains(body, "derp_accepts") {
				t.Errorf("/debug/varz lacks derp_accepts")
			}
			if _, err := parseMetrics(body); err != nil {
				t.Errorf("/debug/varz does not parse: %v", err)
			}
		})
	})
}

package interop

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"io"
	"strings"
	"testing"
	"time"

	"go4.org/mem"
	"tailscale.com/types/key"
)

// TestHandshake: the derphttp client connects; its ServerPublicKey matches the
// Derp-Public-Key header of a classic 101 upgrade; over TLS it also matches
// the meta-certificate, and the client (which then uses fast start) works.
func TestHandshake(t *testing.T) {
	eachServer(t, func(t *testing.T, kind string) {
		t.Run("plain", func(t *testing.T) {
			s := startServer(t, kind, serverOpts{})
			raw := s.rawUpgrade(t)
			checkUpgradeResponse(t, raw)

			c := s.newClient(t, "c")
			if got := c.c.ServerPublicKey(); got != raw.hdrKey {
				t.Fatalf("derphttp ServerPublicKey = %v; Derp-Public-Key header = %v", got, raw.hdrKey)
			}
			if _, ok := c.c.TLSConnectionState(); ok {
				t.Fatalf("plain HTTP connection reports TLS state")
			}
		})
		t.Run("tls", func(t *testing.T) {
			s := startServer(t, kind, serverOpts{tls: true})
			raw := s.rawUpgrade(t)
			checkUpgradeResponse(t, raw)

			metaKey := checkMetaCert(t, s)
			if metaKey != raw.hdrKey {
				t.Fatalf("meta-cert key %v != Derp-Public-Key header %v", metaKey, raw.hdrKey)
			}

			// The derphttp client learns the key from the meta cert and uses
			// fast start; it must get serverInfo and relay packets.
			a := s.newClient(t, "a")
			b := s.newClient(t, "b")
			if got := a.c.ServerPublicKey(); got != raw.hdrKey {
				t.Fatalf("derphttp ServerPublicKey = %v; Derp-Public-Key header = %v", got, raw.hdrKey)
			}
			cs, ok := a.c.TLSConnectionState()
			if !ok {
				t.Fatalf("derphttp client has no TLS state")
			}
			if cs.Version != tls.VersionTLS13 {
				t.Fatalf("derphttp client negotiated TLS version %#x; want TLS 1.3 (needed for fast start)", cs.Version)
			}
			relayOK(t, a, b)
			relayOK(t, b, a)
		})
		t.Run("tls-fast-start-raw", func(t *testing.T) {
			// A fast-start request must get no HTTP response at all: the first
			// bytes are the serverKey frame, then serverInfo.
			s := startServer(t, kind, serverOpts{tls: true})
			nc := s.dial(t)
			tc := nc.(*tls.Conn)
			metaKey, _ := metaCertKey(tc.ConnectionState().PeerCertificates)
			if metaKey.IsZero() {
				t.Fatalf("no meta cert")
			}
			r := &rawConn{t: t, nc: nc, priv: key.NewNode(), serverKey: metaKey}
			r.br = bufio.NewReader(nc)
			req := upgradeRequest(s.hostHeader(), true)
			info := r.clientInfoPayload(`{"version":2,"CanAckPings":true}`)
			frame := append([]byte{frameClientInfo, 0, 0, 0, 0}, info...)
			binary.BigEndian.PutUint32(frame[1:], uint32(len(info)))
			// Request and clientInfo in one write, as the Go client does.
			if err := r.writeRaw(append([]byte(req), frame...)); err != nil {
				t.Fatal(err)
			}
			nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			first, err := r.br.Peek(5)
			if err != nil {
				t.Fatalf("reading first bytes after fast-start request: %v", err)
			}
			if strings.HasPrefix(string(first), "HTTP/") {
				t.Fatalf("server sent an HTTP response to a Derp-Fast-Start: 1 request")
			}
			r.readServerKey()
			if r.serverKey != metaKey {
				t.Fatalf("serverKey frame key %v != meta-cert key %v", r.serverKey, metaKey)
			}
			r.expectServerInfo()
			r.pingPong()
		})
	})
}

// checkUpgradeResponse checks the 101 response headers and that the
// serverKey frame carries the same key as the Derp-Public-Key header.
func checkUpgradeResponse(t *testing.T, raw *rawConn) {
	t.Helper()
	if up := raw.resp.Header.Get("Upgrade"); !strings.EqualFold(up, "DERP") {
		t.Errorf("101 Upgrade header = %q; want DERP", up)
	}
	if v := raw.resp.Header.Get("Derp-Version"); v != "2" {
		t.Errorf("101 Derp-Version header = %q; want 2", v)
	}
	if raw.serverKey != raw.hdrKey {
		t.Fatalf("serverKey frame key %v != Derp-Public-Key header %v", raw.serverKey, raw.hdrKey)
	}
	if raw.hdrKey.IsZero() {
		t.Fatalf("server key is zero")
	}
}

// checkMetaCert dials with crypto/tls and checks the derpkey meta cert:
// present (TLS 1.3), serial 2, CN "derpkey"+64 hex. Returns its key.
func checkMetaCert(t *testing.T, s *server) key.NodePublic {
	t.Helper()
	nc := s.dial(t)
	defer nc.Close()
	cs := nc.(*tls.Conn).ConnectionState()
	if cs.Version != tls.VersionTLS13 {
		t.Fatalf("TLS version %#x; want TLS 1.3", cs.Version)
	}
	if cs.NegotiatedProtocol != "" && cs.NegotiatedProtocol != "http/1.1" {
		t.Fatalf("negotiated ALPN %q with a client that offered none", cs.NegotiatedProtocol)
	}
	if len(cs.PeerCertificates) < 2 {
		t.Fatalf("server sent %d certificates; want leaf + meta cert", len(cs.PeerCertificates))
	}
	if err := cs.PeerCertificates[0].VerifyHostname("localhost"); err != nil {
		t.Fatalf("leaf certificate: %v", err)
	}
	k, cert := metaCertKey(cs.PeerCertificates)
	if cert == nil {
		t.Fatalf("no certificate with CN prefix derpkey in the chain")
	}
	if cert.SerialNumber.Int64() != 2 || cert.SerialNumber.BitLen() > 8 {
		t.Fatalf("meta cert serial = %v; want 2", cert.SerialNumber)
	}
	// crypto/tls already parsed it; re-parse the raw DER to be explicit.
	if _, err := x509.ParseCertificate(cert.Raw); err != nil {
		t.Fatalf("meta cert does not parse: %v", err)
	}
	if k.IsZero() {
		t.Fatalf("meta cert CN %q: bad key", cert.Subject.CommonName)
	}
	return k
}

// metaCertKey finds the derpkey meta cert and the key in its CN.
func metaCertKey(certs []*x509.Certificate) (key.NodePublic, *x509.Certificate) {
	for _, c := range certs {
		if hexKey, ok := strings.CutPrefix(c.Subject.CommonName, "derpkey"); ok {
			k, err := key.ParseNodePublicUntyped(mem.S(hexKey))
			if err != nil || len(hexKey) != 64 || strings.ToLower(hexKey) != hexKey {
				return key.NodePublic{}, c
			}
			return k, c
		}
	}
	return key.NodePublic{}, nil
}

// readAllLimit is a tiny helper for response bodies.
func readAllLimit(r io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(r, 1<<16))
	return string(b)
}

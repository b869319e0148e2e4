package testcert

import (
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"testing"
)

// The files verify as a server certificate for both names, against the
// certificate WriteLocalhost says to trust, with and without a CA.
func TestWriteLocalhost(t *testing.T) {
	ca, err := NewCA(t.TempDir(), "testcert CA")
	if err != nil {
		t.Fatal(err)
	}
	for name, signer := range map[string]*CA{"self-signed": nil, "CA-signed": ca} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			trust, err := WriteLocalhost(dir, signer)
			if err != nil {
				t.Fatal(err)
			}
			pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "localhost.crt"), filepath.Join(dir, "localhost.key"))
			if err != nil {
				t.Fatal(err)
			}
			leaf, err := x509.ParseCertificate(pair.Certificate[0])
			if err != nil {
				t.Fatal(err)
			}
			pool := x509.NewCertPool()
			pool.AddCert(trust)
			for _, host := range []string{"localhost", "127.0.0.1"} {
				if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: pool}); err != nil {
					t.Errorf("%s: %v", host, err)
				}
			}
		})
	}
}

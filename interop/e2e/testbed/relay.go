//go:build linux

package testbed

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"ferry.invalid/interop/derpserver"
	"ferry.invalid/interop/testcert"
)

// Relay kinds.
const (
	Ferry  = "ferry"
	Derper = "derper"
)

// RelayHostname is the relay's name in the DERP map and its certificate;
// nodes dial its IPv4 address from the map and send this name as SNI.
const RelayHostname = "derp.fe.test"

// Relay ports inside the relay namespace.
const (
	TLSPort   = 443
	PlainPort = 3340
	STUNPort  = 3478
)

// DerpServerOptions select the relay under test.
type DerpServerOptions struct {
	Kind string // Ferry or Derper
	TLS  bool   // TLS with a self-signed certificate the nodes trust; else plain HTTP
	// Place pins the relay (taskset) and sets its nice value.
	Place Placement
	// Workers sets ferry's --workers (0: its default, one per usable core).
	Workers int
	// ExtraArgs are appended to the relay's command line.
	ExtraArgs []string

	// Set by the bed for the nodes of a two-node region (Config.Peer).
	port, stunPort int      // listener and STUN ports (0: the defaults)
	env            []string // added to the relay's environment
	ca             *CA      // signs its certificate (nil: self-signed)
}

// Name is a short label: "ferry-tls", "derper-http", ...
func (o DerpServerOptions) Name() string {
	if o.TLS {
		return o.Kind + "-tls"
	}
	return o.Kind + "-http"
}

// Relay is the running DERP server.
type Relay struct {
	Opts     DerpServerOptions
	Port     int
	CertFile string // PEM certificate the nodes trust (TLS only)
	Proc     *Proc
	ns       string
	httpc    *http.Client
	scheme   string
}

// startRelay starts the relay in namespace ns. Both kinds get the same
// derper flags; the relay listens on all addresses of its namespace so
// that /debug/varz (served to loopback clients only) can be read through
// 127.0.0.1.
func startRelay(bin, ns, dir string, o DerpServerOptions) (*Relay, error) {
	r := &Relay{Opts: o, ns: ns}
	flags := derpserver.Flags{
		STUNPort: STUNPort,
		KeyFile:  filepath.Join(dir, o.Kind+".key"),
		TLS:      o.TLS,
		CertDir:  dir,
		Hostname: RelayHostname,
	}
	if o.TLS {
		r.Port = TLSPort
		if o.port != 0 {
			r.Port = o.port
		}
		if o.stunPort != 0 {
			flags.STUNPort = o.stunPort
		}
		r.scheme = "https"
		var err error
		r.CertFile, err = writeCert(dir, RelayHostname, RelayIP, o.ca)
		if err != nil {
			return nil, err
		}
	} else {
		r.Port = PlainPort
		r.scheme = "http"
	}
	flags.Addr = fmt.Sprintf(":%d", r.Port)
	if o.Kind == Ferry && o.Workers > 0 {
		flags.Extra = append(flags.Extra, "--workers", strconv.Itoa(o.Workers))
	}
	flags.Extra = append(flags.Extra, o.ExtraArgs...)
	env := append([]string(nil), o.env...)
	if o.Kind == Ferry {
		env = append(env, "RUST_BACKTRACE=1")
	}
	pool := x509.NewCertPool()
	if o.TLS { // the CA's certificate or the self-signed one
		pem, err := os.ReadFile(r.CertFile)
		if err != nil {
			return nil, err
		}
		pool.AppendCertsFromPEM(pem)
	}
	r.httpc = &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return dialInNamespace(ctx, ns, net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Port)))
			},
			TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: RelayHostname},
			DisableKeepAlives: true,
		},
	}
	launch := func(argv []string) (*Proc, error) {
		return startProc("relay ("+o.Name()+")", ns, env, o.Place.wrap(argv)...)
	}
	probe := derpserver.Probe{Client: r.httpc, BaseURL: r.url(""), Timeout: 30 * time.Second}
	var err error
	r.Proc, err = derpserver.Start(bin, flags, launch, probe)
	if err != nil && r.Proc != nil {
		err = fmt.Errorf("relay (%s): %w", o.Name(), err)
	}
	return r, err
}

func (r *Relay) url(path string) string {
	return fmt.Sprintf("%s://%s%s", r.scheme, RelayHostname, path)
}

// Metrics is one scrape of the relay's Prometheus text: series (name with
// its labels, as printed) to value.
type Metrics map[string]float64

// Metrics reads /debug/varz from inside the relay's namespace.
func (r *Relay) Metrics() (Metrics, error) {
	return getMetrics(r.httpc, r.url("/debug/varz"))
}

// getMetrics GETs a Prometheus text page and parses it.
func getMetrics(c *http.Client, url string) (Metrics, error) {
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads Prometheus text: "series value" lines, # comments.
func parseMetrics(r io.Reader) (Metrics, error) {
	m := Metrics{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i <= 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m, sc.Err()
}

// Sum adds every series of metric name (all label sets).
func (m Metrics) Sum(name string) float64 {
	var s float64
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			s += v
		}
	}
	return s
}

// Delta returns after.Sum(name) - before.Sum(name).
func Delta(before, after Metrics, name string) float64 {
	return after.Sum(name) - before.Sum(name)
}

// NonZero lists the series of metric name whose value changed between
// before and after, as "labels=delta".
func NonZero(before, after Metrics, name string) []string {
	var out []string
	for k, v := range after {
		if k == name || strings.HasPrefix(k, name+"{") {
			if d := v - before[k]; d != 0 {
				out = append(out, fmt.Sprintf("%s=%g", strings.TrimPrefix(k, name), d))
			}
		}
	}
	return out
}

// CPUSeconds is the relay process's user+system CPU time so far.
func (r *Relay) CPUSeconds() (float64, error) {
	return procCPUSeconds(r.Proc.Pid())
}

// procCPUSeconds reads utime+stime of pid from /proc (all threads).
func procCPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields resume after ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	const clockTicks = 100 // USER_HZ on Linux
	return (ut + st) / clockTicks, nil
}

// CA is a throw-away certificate authority for a region's relays: each
// relay's certificate is signed by it and everyone (relays dialing each
// other, tailscaled) trusts it through SSL_CERT_FILE.
type CA = testcert.CA

// newCA writes the region's CA certificate as dir/ca.pem.
func newCA(dir string) (*CA, error) {
	return testcert.NewCA(dir, "ferry e2e region CA")
}

// writeCert writes an ECDSA certificate for host (and ip) as dir/host.crt
// and dir/host.key, the layout of --certmode manual, and returns the path
// of the certificate the nodes must trust: the CA's when ca signs it,
// otherwise the self-signed certificate itself.
func writeCert(dir, host, ip string, ca *CA) (string, error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: host},
		DNSNames:              []string{host},
		IPAddresses:           []net.IP{net.ParseIP(ip)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	parent, signer := tmpl, any(priv)
	if ca != nil {
		tmpl.IsCA = false
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		parent, signer = ca.Cert, ca.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &priv.PublicKey, signer)
	if err != nil {
		return "", err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return "", err
	}
	certFile := filepath.Join(dir, host+".crt")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, host+".key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", err
	}
	if ca != nil {
		return ca.File, nil
	}
	return certFile, nil
}

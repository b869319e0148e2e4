package interop

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Server kinds under test.
const (
	kindDerper = "derper"
	kindFerry  = "ferry"
)

var (
	// selectedServers is the list of server kinds every test runs against,
	// in order. It comes from INTEROP_SERVERS (default: both).
	selectedServers []string

	// Absolute paths of the binaries used by the tests.
	derperBin    string
	derpprobeBin string
	ferryBin     string
	// ferryBinErr is set when no ferry binary could be located; every ferry
	// subtest fails with it (the tests never skip silently).
	ferryBinErr error
)

func TestMain(m *testing.M) {
	flag.Parse()
	if err := setup(); err != nil {
		fmt.Fprintf(os.Stderr, "interop: setup failed: %v\n", err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

func setup() error {
	var err error
	selectedServers, err = parseServers(os.Getenv("INTEROP_SERVERS"))
	if err != nil {
		return err
	}
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	binDir := filepath.Join(wd, "bin")
	derperBin = filepath.Join(binDir, "derper")
	derpprobeBin = filepath.Join(binDir, "derpprobe")

	// derpprobe is needed for either server; derper only when it's tested.
	if err := buildTool(wd, "tailscale.com/cmd/derpprobe", derpprobeBin); err != nil {
		return err
	}
	if contains(selectedServers, kindDerper) {
		if err := buildDerper(wd); err != nil {
			return err
		}
	}
	if contains(selectedServers, kindFerry) {
		ferryBin, ferryBinErr = locateFerry(wd)
	}
	return nil
}

func parseServers(v string) ([]string, error) {
	if strings.TrimSpace(v) == "" {
		return []string{kindDerper, kindFerry}, nil
	}
	var out []string
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		switch f {
		case kindDerper, kindFerry:
			if !contains(out, f) {
				out = append(out, f)
			}
		case "":
		default:
			return nil, fmt.Errorf("INTEROP_SERVERS: unknown server %q (want %q and/or %q)", f, kindDerper, kindFerry)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("INTEROP_SERVERS names no server")
	}
	return out, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// buildTool builds pkg (a main package of the pinned tailscale.com module)
// into out, unless out already exists and is newer than go.sum.
func buildTool(moduleDir, pkg, out string) error {
	sum, err := os.Stat(filepath.Join(moduleDir, "go.sum"))
	if err != nil {
		return err
	}
	if st, err := os.Stat(out); err == nil && st.ModTime().After(sum.ModTime()) {
		return nil
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(goTool, "build", "-o", out, pkg)
	cmd.Dir = moduleDir
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build -o %s %s: %v\n%s", out, pkg, err, b)
	}
	return nil
}

// buildDerper brings bin/derper up to date: the reference derper is not
// this module's tailscale.com (which stays at the older release for its
// clients) but interop/reference's, built by the set-up script that every other
// user of bin/derper runs too (it does nothing when derper is current).
func buildDerper(moduleDir string) error {
	cmd := exec.Command("bash", filepath.Join(moduleDir, "..", ".ci", "setup.d", "10-derper.sh"))
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf(".ci/setup.d/10-derper.sh: %v\n%s", err, b)
	}
	return nil
}

// locateFerry finds the ferry binary: $FERRY_BIN if set, else
// ../target/release/ferry, else ../target/debug/ferry.
func locateFerry(moduleDir string) (string, error) {
	if v := os.Getenv("FERRY_BIN"); v != "" {
		p, err := filepath.Abs(v)
		if err != nil {
			return "", err
		}
		st, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("FERRY_BIN=%q: %v", v, err)
		}
		if st.IsDir() {
			return "", fmt.Errorf("FERRY_BIN=%q is a directory", v)
		}
		return p, nil
	}
	var tried []string
	for _, rel := range []string{"../target/release/ferry", "../target/debug/ferry"} {
		p := filepath.Clean(filepath.Join(moduleDir, rel))
		tried = append(tried, p)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("no ferry binary: FERRY_BIN is unset and none of %s exists; "+
		"build it (cargo build --release) or set FERRY_BIN, or set INTEROP_SERVERS=derper to test only the reference",
		strings.Join(tried, ", "))
}

// eachServer runs fn as one parallel subtest per selected server kind.
func eachServer(t *testing.T, fn func(t *testing.T, kind string)) {
	t.Helper()
	for _, kind := range selectedServers {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			if kind == kindFerry && ferryBinErr != nil {
				t.Fatal(ferryBinErr)
			}
			fn(t, kind)
		})
	}
}

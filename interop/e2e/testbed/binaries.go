//go:build linux

package testbed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// HeadscaleVersion is the Headscale release the test bed runs. Its module
// is downloaded from the module proxy and built from that source: `go
// install` of this version is refused because the proxy does not list it.
const HeadscaleVersion = "v0.29.3"

// headscaleModule is Headscale's module path.
const headscaleModule = "github.com/juanfont/headscale"

// Binaries are the absolute paths of every program a Bed runs.
type Binaries struct {
	Tailscaled string
	Tailscale  string
	Derper     string
	Headscale  string
	Ferry      string // empty if none was found; see LocateFerry
}

// EnsureBinaries returns the Tailscale and Headscale binaries, building the
// missing ones into binDir. Names carry their version
// (tailscaled-v1.102.5, headscale-v0.29.3), so a version change in go.mod
// or HeadscaleVersion builds afresh and an existing file is reused as is.
// moduleDir is the interop module, whose go.mod pins tailscale.com and
// lists the Tailscale commands as tools.
func EnsureBinaries(ctx context.Context, moduleDir, binDir string, logf Logf) (Binaries, error) {
	var b Binaries
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return b, err
	}
	tsVersion, err := goOutput(ctx, moduleDir, nil, "list", "-m", "-f", "{{.Version}}", "tailscale.com")
	if err != nil {
		return b, fmt.Errorf("reading the tailscale.com version from %s/go.mod: %w", moduleDir, err)
	}
	tsVersion = strings.TrimSpace(tsVersion)
	for _, tool := range []struct {
		dst *string
		pkg string
	}{
		{&b.Tailscaled, "tailscale.com/cmd/tailscaled"},
		{&b.Tailscale, "tailscale.com/cmd/tailscale"},
		{&b.Derper, "tailscale.com/cmd/derper"},
	} {
		out := filepath.Join(binDir, filepath.Base(tool.pkg)+"-"+tsVersion)
		if err := buildOnce(ctx, moduleDir, tool.pkg, out, logf); err != nil {
			return b, err
		}
		*tool.dst = out
	}
	b.Headscale = filepath.Join(binDir, "headscale-"+HeadscaleVersion)
	if err := buildHeadscale(ctx, binDir, b.Headscale, logf); err != nil {
		return b, err
	}
	return b, nil
}

// buildOnce builds the main package pkg of the module in dir into out,
// unless out already exists.
func buildOnce(ctx context.Context, dir, pkg, out string, logf Logf) error {
	if _, err := os.Stat(out); err == nil {
		return nil
	}
	start := time.Now()
	logf("building %s (a few minutes the first time)", filepath.Base(out))
	tmp := out + ".tmp"
	// No VCS stamping: the build directories sit inside Ferry's git work
	// tree, which says nothing about these programs (and may have no
	// commit yet, which makes stamping fail).
	if _, err := goOutput(ctx, dir, nil, "build", "-buildvcs=false", "-o", tmp, pkg); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("building %s: %w", pkg, err)
	}
	logf("built %s in %.0f s", filepath.Base(out), time.Since(start).Seconds())
	return os.Rename(tmp, out)
}

// buildHeadscale downloads Headscale's module at HeadscaleVersion, copies
// it out of the (read-only) module cache and builds cmd/headscale there.
func buildHeadscale(ctx context.Context, binDir, out string, logf Logf) error {
	if _, err := os.Stat(out); err == nil {
		return nil
	}
	// Outside any module, so that our go.mod and go.sum stay untouched.
	outside, err := os.MkdirTemp("", "fe-gomod-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(outside)
	js, err := goOutput(ctx, outside, []string{"GOFLAGS=-mod=mod", "GOWORK=off"},
		"mod", "download", "-json", headscaleModule+"@"+HeadscaleVersion)
	if err != nil {
		return fmt.Errorf("downloading %s@%s: %w", headscaleModule, HeadscaleVersion, err)
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal([]byte(js), &mod); err != nil {
		return fmt.Errorf("go mod download output: %w", err)
	}
	if mod.Error != "" || mod.Dir == "" {
		return fmt.Errorf("go mod download %s@%s: %s", headscaleModule, HeadscaleVersion, mod.Error)
	}
	src := filepath.Join(binDir, "src", "headscale-"+HeadscaleVersion)
	if err := os.RemoveAll(src); err != nil {
		return err
	}
	// CopyFS makes the copies writable (mode 0666 plus execute bits), which
	// the build needs; the module cache is read-only.
	if err := os.CopyFS(src, os.DirFS(mod.Dir)); err != nil {
		return fmt.Errorf("copying the headscale source: %w", err)
	}
	defer func() {
		os.RemoveAll(src)
		os.Remove(filepath.Dir(src)) // bin/src, if nothing else is in it
	}()
	return buildOnce(ctx, src, "./cmd/headscale", out, logf)
}

// goOutput runs the go command in dir and returns its standard output; on
// failure the error holds its standard error.
func goOutput(ctx context.Context, dir string, env []string, args ...string) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.CommandContext(ctx, goTool, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

// LocateFerry finds the ferry binary: $FERRY_BIN if set, else
// <moduleDir>/../target/release/ferry, else .../target/debug/ferry.
func LocateFerry(moduleDir string) (string, error) {
	if v := os.Getenv("FERRY_BIN"); v != "" {
		p, err := filepath.Abs(v)
		if err != nil {
			return "", err
		}
		if st, err := os.Stat(p); err != nil || st.IsDir() {
			return "", fmt.Errorf("FERRY_BIN=%q is not a file", v)
		}
		return p, nil
	}
	var tried []string
	for _, rel := range []string{"../target/release/ferry", "../target/debug/ferry"} {
		p := filepath.Clean(filepath.Join(moduleDir, rel))
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
		tried = append(tried, p)
	}
	return "", errors.New("no ferry binary: FERRY_BIN is unset and none of " +
		strings.Join(tried, ", ") + " exists (cargo build -p ferry)")
}

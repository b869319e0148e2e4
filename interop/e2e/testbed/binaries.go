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
// (tailscaled-v1.104.7, headscale-v0.29.3), so a version change in the
// reference module or HeadscaleVersion builds afresh and an existing file
// is reused as is. moduleDir is the interop module; the Tailscale
// programs come from its reference/ module (the release Ferry is checked
// against, with the Go toolchain its go line names), which lists them as
// tools.
func EnsureBinaries(ctx context.Context, moduleDir, binDir string, logf Logf) (Binaries, error) {
	var b Binaries
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return b, err
	}
	refDir := filepath.Join(moduleDir, "reference")
	toolchain, err := goLine(filepath.Join(refDir, "go.mod"))
	if err != nil {
		return b, err
	}
	env := []string{"GOTOOLCHAIN=go" + toolchain}
	tsVersion, err := goOutput(ctx, refDir, env, "list", "-m", "-f", "{{.Version}}", "tailscale.com")
	if err != nil {
		return b, fmt.Errorf("reading the tailscale.com version from %s/go.mod: %w", refDir, err)
	}
	tsVersion = strings.TrimSpace(tsVersion)
	for _, tool := range []struct {
		dst *string
		pkg string
	}{
		{&b.Tailscale, "tailscale.com/cmd/tailscale"},
		{&b.Derper, "tailscale.com/cmd/derper"},
	} {
		out := filepath.Join(binDir, filepath.Base(tool.pkg)+"-"+tsVersion)
		if err := buildOnce(ctx, refDir, env, tool.pkg, out, logf); err != nil {
			return b, err
		}
		*tool.dst = out
	}
	b.Tailscaled = filepath.Join(binDir, "tailscaled-"+tsVersion)
	if err := buildTailscaled(ctx, refDir, env, tsVersion, b.Tailscaled, logf); err != nil {
		return b, err
	}
	b.Headscale = filepath.Join(binDir, "headscale-"+HeadscaleVersion)
	if err := buildHeadscale(ctx, binDir, b.Headscale, logf); err != nil {
		return b, err
	}
	return b, nil
}

// goLine reads the Go version a go.mod file's go line names.
func goLine(goMod string) (string, error) {
	data, err := os.ReadFile(goMod)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "go "); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("%s has no go line", goMod)
}

// buildOnce builds the main package pkg of the module in dir into out
// (with env added to the go command's), unless out already exists.
func buildOnce(ctx context.Context, dir string, env []string, pkg, out string, logf Logf) error {
	if _, err := os.Stat(out); err == nil {
		return nil
	}
	start := time.Now()
	logf("building %s (a few minutes the first time)", filepath.Base(out))
	tmp := out + ".tmp"
	// No VCS stamping: the build directories sit inside Ferry's git work
	// tree, which says nothing about these programs (and may have no
	// commit yet, which makes stamping fail).
	if _, err := goOutput(ctx, dir, env, "build", "-buildvcs=false", "-o", tmp, pkg); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("building %s: %w", pkg, err)
	}
	logf("built %s in %.0f s", filepath.Base(out), time.Since(start).Seconds())
	return os.Rename(tmp, out)
}

// buildHeadscale builds cmd/headscale of Headscale's module at
// HeadscaleVersion from its source.
func buildHeadscale(ctx context.Context, binDir, out string, logf Logf) error {
	return buildFromSource(ctx, headscaleModule, HeadscaleVersion, nil, "./cmd/headscale", out, logf, nil)
}

// buildTailscaled builds cmd/tailscaled of tailscale.com at version from
// its source, with the module replacements refDir's go.mod makes (the
// versions the module proxy serves) and one line of its userspace
// network stack removed: it sets a field, only on Windows, that the
// served gvisor release does not have. The Rust tailnet test runs
// tailscaled with that stack (--tun=userspace-networking), so it cannot
// be left out.
func buildTailscaled(ctx context.Context, refDir string, env []string, version, out string, logf Logf) error {
	edits, err := goOutput(ctx, refDir, env, "mod", "edit", "-json")
	if err != nil {
		return err
	}
	var mod struct {
		Replace []struct {
			Old struct{ Path string }
			New struct{ Path, Version string }
		}
	}
	if err := json.Unmarshal([]byte(edits), &mod); err != nil {
		return fmt.Errorf("go mod edit -json: %w", err)
	}
	prepare := func(src string) error {
		for _, r := range mod.Replace {
			if r.New.Version == "" {
				continue // a local directory of ours, not a dependency of tailscaled
			}
			arg := "-replace=" + r.Old.Path + "=" + r.New.Path + "@" + r.New.Version
			if _, err := goOutput(ctx, src, env, "mod", "edit", arg); err != nil {
				return err
			}
		}
		const line = "opts.ClockResolution = 500 * time.Microsecond"
		file := filepath.Join(src, "wgengine", "netstack", "netstack.go")
		text, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		var kept []string
		for _, l := range strings.Split(string(text), "\n") {
			if strings.TrimSpace(l) != line {
				kept = append(kept, l)
			}
		}
		return os.WriteFile(file, []byte(strings.Join(kept, "\n")), 0o644)
	}
	env = append(env[:len(env):len(env)], "GOFLAGS=-mod=mod")
	return buildFromSource(ctx, "tailscale.com", version, env, "./cmd/tailscaled", out, logf, prepare)
}

// buildFromSource downloads module@version, copies it out of the
// (read-only) module cache, lets prepare change the copy, and builds pkg
// there into out, unless out already exists.
func buildFromSource(ctx context.Context, module, version string, env []string, pkg, out string, logf Logf, prepare func(src string) error) error {
	if _, err := os.Stat(out); err == nil {
		return nil
	}
	// Outside any module, so that our go.mod and go.sum stay untouched.
	outside, err := os.MkdirTemp("", "fe-gomod-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(outside)
	dlEnv := append(env[:len(env):len(env)], "GOFLAGS=-mod=mod", "GOWORK=off")
	js, err := goOutput(ctx, outside, dlEnv, "mod", "download", "-json", module+"@"+version)
	if err != nil {
		return fmt.Errorf("downloading %s@%s: %w", module, version, err)
	}
	var dl struct{ Dir, Error string }
	if err := json.Unmarshal([]byte(js), &dl); err != nil {
		return fmt.Errorf("go mod download output: %w", err)
	}
	if dl.Error != "" || dl.Dir == "" {
		return fmt.Errorf("go mod download %s@%s: %s", module, version, dl.Error)
	}
	src := filepath.Join(filepath.Dir(out), "src", filepath.Base(out))
	if err := os.RemoveAll(src); err != nil {
		return err
	}
	// CopyFS makes the copies writable (mode 0666 plus execute bits), which
	// the build needs; the module cache is read-only.
	if err := os.CopyFS(src, os.DirFS(dl.Dir)); err != nil {
		return fmt.Errorf("copying the %s source: %w", module, err)
	}
	defer func() {
		os.RemoveAll(src)
		os.Remove(filepath.Dir(src)) // bin/src, if nothing else is in it
	}()
	if prepare != nil {
		if err := prepare(src); err != nil {
			return fmt.Errorf("preparing the %s source: %w", module, err)
		}
	}
	return buildOnce(ctx, src, env, pkg, out, logf)
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

//go:build linux

// Command e2e-binaries builds what the end-to-end test runs (tailscaled,
// tailscale and derper at the tailscale.com version interop/reference pins,
// Headscale at testbed.HeadscaleVersion) into interop/bin, with the test
// bed's own EnsureBinaries, so that set-up (.ci/setup.d/50-e2e.sh) builds
// exactly what the test would otherwise build on its first run. Run it
// from the interop module's directory: go run ./e2e/cmd/e2e-binaries.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"ferry.invalid/interop/e2e/testbed"
)

func main() {
	moduleDir, err := os.Getwd()
	if err != nil {
		log.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(moduleDir, "go.mod")); err != nil {
		log.Fatalf("run this in the interop module's directory: %v", err)
	}
	// Set-up, not a test: on a busy 2-core machine Headscale alone has
	// taken over 10 minutes to build.
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	start := time.Now()
	bins, err := testbed.EnsureBinaries(ctx, moduleDir, filepath.Join(moduleDir, "bin"), log.Printf)
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range []string{bins.Tailscaled, bins.Tailscale, bins.Derper, bins.Headscale} {
		fmt.Println(p)
	}
	log.Printf("e2e binaries ready in %.0f s", time.Since(start).Seconds())
}

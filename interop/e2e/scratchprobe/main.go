//go:build linux

package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"ferry.invalid/interop/e2e/testbed"
)

func main() {
	dir, _ := os.Getwd()
	mod := filepath.Dir(filepath.Dir(dir))
	bins, err := testbed.EnsureBinaries(context.Background(), mod, filepath.Join(mod, "bin"), log.Printf)
	if err != nil {
		log.Fatal(err)
	}
	bins.Ferry = filepath.Join(mod, "../target/release/ferry")
	extra := strings.Fields(os.Getenv("FARGS"))
	bed := testbed.New(testbed.Config{Bins: bins, Relay: testbed.RelayOptions{Kind: os.Args[1], TLS: true, Place: testbed.Placement{CPUs: "0", Nice: -20}, Workers: 1, ExtraArgs: extra}, NodePlace: testbed.Placement{CPUs: "1", Nice: -20}, Logf: log.Printf})
	defer bed.Close()
	if err := bed.Up(); err != nil {
		log.Print(err)
		return
	}
	for range 3 {
		out, _ := bed.A.TailscalePing(bed.B.IP, 3)
		if strings.Contains(out, "via DERP") {
			break
		}
	}
	srv, err := testbed.StartIperfServer(bed.B)
	if err != nil {
		log.Print(err)
		return
	}
	bed.AddProc(srv)
	done := make(chan struct{})
	go func() {
		r, err := testbed.Iperf(bed.A, bed.B, testbed.IperfOptions{Duration: 10 * time.Second})
		log.Printf("iperf %.0f Mbit/s retrans %d %v", r.ReceivedBps/1e6, r.Retransmits, err)
		close(done)
	}()
	pingc := make(chan string)
	go func() {
		out, _ := exec.Command("ip", "netns", "exec", bed.A.NS, "nice", "-n", "-20", "taskset", "-c", "1", "ping", "-D", "-n", "-i", "0.02", "-c", "400", "-W", "2", bed.B.IP).CombinedOutput()
		pingc <- string(out)
	}()
	t0 := time.Now()
	for {
		select {
		case <-done:
			out := <-pingc
			n := 0
			for _, l := range strings.Split(out, "\n") {
				if i := strings.Index(l, "time="); i > 0 {
					var v float64
					fmt.Sscanf(l[i+5:], "%f", &v)
					if v > 15 {
						fmt.Println("slow ping:", l)
					}
					n++
				}
			}
			fmt.Println("ping replies", n, "\n", out[strings.LastIndex(out, "---"):])
			return
		case <-time.After(200 * time.Millisecond):
		}
		out, _ := exec.Command("ip", "netns", "exec", bed.Netns.Relay, "ss", "-tnH", "state", "established", "( sport = :443 )").CombinedOutput()
		var qs []string
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(l)
			if len(f) >= 4 {
				qs = append(qs, fmt.Sprintf("%s r%s s%s", f[3], f[0], f[1]))
			}
		}
		fmt.Printf("%.1f %s %s\n", time.Since(t0).Seconds(), time.Now().Format("15:04:05.000"), strings.Join(qs, " | "))
	}
}

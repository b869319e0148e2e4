// Command derpload is the benchmark's independent load generator: Tailscale's
// own DERP client (tailscale.com/derp/derphttp, the reference release) over
// Go's crypto/tls, as Tailscale's clients connect. It opens -n clients in
// pairs, has each sender send -size-byte packets to its receiver as fast as
// the client goes, and prints one JSON line: what the receivers got in the
// measured window, and what the senders handed to their clients.
//
// Every client flushes each packet on its own, as tailscaled's does, so a
// TLS server opens one record per packet: the real clients' pattern, unlike
// ferry-bench, which fills 16 KiB records.
//
//	derpload -url https://localhost:8443/derp -ca ca.pem -dial 127.0.0.1:8443 -n 20 -d 3s
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"tailscale.com/derp"
	"tailscale.com/derp/derphttp"
	"tailscale.com/net/netmon"
	"tailscale.com/types/key"
)

type report struct {
	Generator     string  `json:"generator"`
	URL           string  `json:"url"`
	Peers         int     `json:"peers"`
	Size          int     `json:"size"`
	WindowSeconds float64 `json:"window_s"`
	DeliveredMbps float64 `json:"delivered_mbps"`
	SentMbps      float64 `json:"sent_mbps"`
	Packets       uint64  `json:"packets"`
	Cipher        string  `json:"cipher,omitempty"`
	SendErrors    uint64  `json:"send_errors"`
	// The server's CPU over the window (-server-pid): cores busy, and
	// core-seconds per gigabit delivered; absent without -server-pid.
	ServerCores        *float64 `json:"server_cores,omitempty"`
	ServerCoreSPerGbit *float64 `json:"server_core_s_per_gbit,omitempty"`
}

// cpuTicks is a process's user+system time in clock ticks, all threads
// (fields 14 and 15 of /proc/<pid>/stat, counted after the command name).
func cpuTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("unreadable /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("unreadable times in /proc/%d/stat", pid)
	}
	return u + st, nil
}

// ticksPerSecond is USER_HZ, 100 on every Linux this runs on.
const ticksPerSecond = 100

func main() {
	url := flag.String("url", "", "DERP URL (http://... or https://.../derp)")
	dial := flag.String("dial", "", "address to dial instead of the URL's host (host:port)")
	caFile := flag.String("ca", "", "PEM certificate to trust for https")
	n := flag.Int("n", 20, "clients, an even number: n/2 sender-receiver pairs")
	size := flag.Int("size", 1400, "packet size in bytes")
	warmup := flag.Duration("warmup", time.Second, "load before the measured window")
	window := flag.Duration("d", 2*time.Second, "measured window")
	serverPid := flag.Int("server-pid", 0, "measure this process's CPU over the window")
	flag.Parse()
	if *url == "" || *n < 2 || *n%2 != 0 || *size < 1 || *size > derp.MaxPacketSize {
		log.Fatalf("derpload: need -url, an even -n >= 2 and 1 <= -size <= %d", derp.MaxPacketSize)
	}
	var tlsConf *tls.Config
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			log.Fatalf("derpload: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			log.Fatalf("derpload: no certificate in %s", *caFile)
		}
		tlsConf = &tls.Config{RootCAs: pool}
	}

	var delivered, packets, sendErrors atomic.Uint64
	var sent atomic.Uint64
	clients := make([]*derphttp.Client, *n)
	keys := make([]key.NodePrivate, *n)
	quiet := func(string, ...any) {}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	for i := range clients {
		keys[i] = key.NewNode()
		c, err := derphttp.NewClient(keys[i], *url, quiet, netmon.NewStatic())
		if err != nil {
			log.Fatalf("derpload: %v", err)
		}
		c.TLSConfig = tlsConf
		if *dial != "" {
			addr := *dial
			c.SetURLDialer(func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			})
		}
		if err := c.Connect(ctx); err != nil {
			log.Fatalf("derpload: client %d: %v", i, err)
		}
		clients[i] = c
	}
	cancel()
	cipher := ""
	if tlsConf != nil {
		if st, ok := clients[0].TLSConnectionState(); ok {
			cipher = tls.CipherSuiteName(st.CipherSuite)
		}
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	// Receivers: the odd clients. Every packet is counted; the window's
	// figure is the difference of two samples.
	for i := 1; i < *n; i += 2 {
		c := clients[i]
		go func() {
			for {
				m, err := c.Recv()
				if err != nil {
					return
				}
				if p, ok := m.(derp.ReceivedPacket); ok {
					delivered.Add(uint64(len(p.Data)))
					packets.Add(1)
				}
			}
		}()
	}
	// Senders: the even clients, each to the next one.
	for i := 0; i < *n; i += 2 {
		c, dst := clients[i], keys[i+1].Public()
		wg.Add(1)
		go func() {
			defer wg.Done()
			pkt := make([]byte, *size)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := c.Send(dst, pkt); err != nil {
					sendErrors.Add(1)
					return
				}
				sent.Add(uint64(len(pkt)))
			}
		}()
	}
	time.Sleep(*warmup)
	var c0, c1 uint64
	var cpuErr error
	if *serverPid != 0 {
		c0, cpuErr = cpuTicks(*serverPid)
	}
	d0, s0, p0 := delivered.Load(), sent.Load(), packets.Load()
	t0 := time.Now()
	time.Sleep(*window)
	d1, s1, p1 := delivered.Load(), sent.Load(), packets.Load()
	secs := time.Since(t0).Seconds()
	if *serverPid != 0 && cpuErr == nil {
		c1, cpuErr = cpuTicks(*serverPid)
	}
	if cpuErr != nil {
		log.Fatalf("derpload: server CPU: %v", cpuErr)
	}
	close(stop)
	for _, c := range clients {
		c.Close()
	}
	wg.Wait()
	r := report{
		Generator:     "derpload (tailscale.com derphttp, Go crypto/tls)",
		URL:           *url,
		Peers:         *n,
		Size:          *size,
		WindowSeconds: secs,
		DeliveredMbps: float64(d1-d0) * 8 / secs / 1e6,
		SentMbps:      float64(s1-s0) * 8 / secs / 1e6,
		Packets:       p1 - p0,
		Cipher:        cipher,
		SendErrors:    sendErrors.Load(),
	}
	if *serverPid != 0 {
		cpu := float64(c1-c0) / ticksPerSecond
		cores := cpu / secs
		r.ServerCores = &cores
		if gbit := float64(d1-d0) * 8 / 1e9; gbit > 0 {
			perGbit := cpu / gbit
			r.ServerCoreSPerGbit = &perGbit
		}
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
}

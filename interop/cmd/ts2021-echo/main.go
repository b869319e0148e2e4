// Command ts2021-echo is the control server's side of Tailscale's Noise
// channel (tailscale.com/control/controlbase) for Ferry's own client to
// talk to: it listens on loopback, prints "<address> <server machine
// public key>" on one line, accepts one connection, runs the server
// handshake on it (the client sends its initiation straight away, with no
// HTTP upgrade) and then echoes every plaintext byte it reads until the
// client closes. Go's record layer splits what it writes back into frames
// of at most 4077 plaintext bytes, so the client sees Go's framing.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"tailscale.com/control/controlbase"
	"tailscale.com/types/key"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "ts2021-echo:", err)
		os.Exit(1)
	}
}

func run() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	priv := key.NewMachine()
	pub, err := priv.Public().MarshalText()
	if err != nil {
		return err
	}
	fmt.Printf("%s %s\n", ln.Addr(), pub)
	// Exit on our own if the test never connects.
	go func() {
		time.Sleep(2 * time.Minute)
		fmt.Fprintln(os.Stderr, "ts2021-echo: no client within 2 minutes")
		os.Exit(2)
	}()
	raw, err := ln.Accept()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := controlbase.Server(ctx, raw, priv, nil)
	if err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	defer conn.Close()
	fmt.Fprintf(os.Stderr, "ts2021-echo: client %v, protocol version %d\n", conn.Peer(), conn.ProtocolVersion())
	if _, err := io.Copy(conn, conn); err != nil {
		return fmt.Errorf("echo: %w", err)
	}
	return nil
}

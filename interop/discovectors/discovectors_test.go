// Package discovectors checks Ferry's disco codec against Tailscale's
// (tailscale.com/disco): every message below is marshalled by Tailscale's
// code and must equal, byte for byte, the line of the same name in
// ../testdata/disco-vectors.txt; the Rust tests (crates/proto, module
// disco) assert that Ferry writes exactly those lines and reads them back.
// Here each line is also parsed by Tailscale's code into the same message,
// and the sealed packets are opened with Tailscale's disco box, so bytes
// Ferry writes are bytes Tailscale reads.
//
// FERRY_WRITE_VECTORS=1 rewrites the file from Tailscale's output.
package discovectors

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"go4.org/mem"
	"golang.org/x/crypto/nacl/box"
	"tailscale.com/disco"
	"tailscale.com/types/key"
)

const vectorFile = "../testdata/disco-vectors.txt"

// seq returns n bytes start, start+1, ...
func seq(start byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = start + byte(i)
	}
	return b
}

// clamped is the X25519 private key from 32 bytes start, start+1, ...
func clamped(start byte) []byte {
	b := seq(start, 32)
	b[0] &= 248
	b[31] = (b[31] & 127) | 64
	return b
}

func discoPrivate(start byte) key.DiscoPrivate {
	return key.DiscoPrivateFromRaw32(mem.B(clamped(start)))
}

type vector struct {
	name string
	msg  disco.Message
	// sealed: the packet from `from` to `to` with the nonce 24 bytes
	// starting at nonce; otherwise the plaintext.
	sealed   bool
	from, to byte // the keys' first bytes, for discoPrivate
	nonce    byte
}

func vectors() []vector {
	a, b, s := discoPrivate(0x01), discoPrivate(0x21), discoPrivate(0x41)
	var tx [12]byte
	copy(tx[:], seq(0, 12))
	var challenge [32]byte
	copy(challenge[:], seq(0x80, 32))
	pair := key.NewSortedPairOfDiscoPublic(a.Public(), b.Public()).Get()
	endpoint := disco.UDPRelayEndpoint{
		ServerDisco:         s.Public(),
		ClientDisco:         pair,
		LamportID:           0x0102030405060708,
		VNI:                 0xabcdef,
		BindLifetime:        30 * time.Second,
		SteadyStateLifetime: 5 * time.Minute,
		AddrPorts: []netip.AddrPort{
			netip.MustParseAddrPort("192.0.2.10:40000"),
			netip.MustParseAddrPort("[2001:db8::10]:40000"),
		},
	}
	common := func(ch [32]byte) disco.BindUDPRelayEndpointCommon {
		return disco.BindUDPRelayEndpointCommon{
			VNI: 0x123456, Generation: 7, RemoteKey: b.Public(), Challenge: ch,
		}
	}
	bind := &disco.BindUDPRelayEndpoint{BindUDPRelayEndpointCommon: common([32]byte{})}
	response := &disco.AllocateUDPRelayEndpointResponse{Generation: 0x01020304, UDPRelayEndpoint: endpoint}
	return []vector{
		{name: "ping", msg: &disco.Ping{TxID: tx, NodeKey: key.NodePublicFromRaw32(mem.B(seq(0xa0, 32))), Padding: 3}},
		{name: "ping_no_key", msg: &disco.Ping{TxID: tx}},
		{name: "pong", msg: &disco.Pong{TxID: tx, Src: netip.MustParseAddrPort("192.0.2.1:41641")}},
		{name: "pong_v6", msg: &disco.Pong{TxID: tx, Src: netip.MustParseAddrPort("[2001:db8::1]:12345")}},
		{name: "call_me_maybe", msg: &disco.CallMeMaybe{MyNumber: []netip.AddrPort{
			netip.MustParseAddrPort("192.0.2.1:41641"),
			netip.MustParseAddrPort("[2001:db8::2]:41642"),
		}}},
		{name: "call_me_maybe_empty", msg: &disco.CallMeMaybe{}},
		{name: "bind", msg: bind},
		{name: "bind_challenge", msg: &disco.BindUDPRelayEndpointChallenge{BindUDPRelayEndpointCommon: common(challenge)}},
		{name: "bind_answer", msg: &disco.BindUDPRelayEndpointAnswer{BindUDPRelayEndpointCommon: common(challenge)}},
		{name: "call_me_maybe_via", msg: &disco.CallMeMaybeVia{UDPRelayEndpoint: endpoint}},
		{name: "allocate_request", msg: &disco.AllocateUDPRelayEndpointRequest{
			ClientDisco: [2]key.DiscoPublic{b.Public(), a.Public()}, Generation: 0x01020304,
		}},
		{name: "allocate_response", msg: response},
		{name: "sealed_bind", msg: bind, sealed: true, from: 0x01, to: 0x41, nonce: 0x00},
		{name: "sealed_allocate_response", msg: response, sealed: true, from: 0x41, to: 0x01, nonce: 0x30},
	}
}

// sealWithNonce is Tailscale's disco packet (disco.Magic ‖ sender ‖ box)
// with a fixed nonce instead of a random one.
func sealWithNonce(v vector) []byte {
	var nonce [24]byte
	copy(nonce[:], seq(v.nonce, 24))
	var shared, peer, priv [32]byte
	copy(peer[:], discoPrivate(v.to).Public().AppendTo(nil))
	copy(priv[:], clamped(v.from))
	box.Precompute(&shared, &peer, &priv)
	out := []byte(disco.Magic)
	out = discoPrivate(v.from).Public().AppendTo(out)
	return box.SealAfterPrecomputation(append(out, nonce[:]...), v.msg.AppendMarshal(nil), &nonce, &shared)
}

func readVectors(t *testing.T) map[string][]byte {
	f, err := os.Open(vectorFile)
	if err != nil {
		t.Fatalf("%v (FERRY_WRITE_VECTORS=1 writes it)", err)
	}
	defer f.Close()
	got := map[string][]byte{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, h, ok := strings.Cut(line, " ")
		if !ok {
			t.Fatalf("bad line %q", line)
		}
		b, err := hex.DecodeString(h)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got[name] = b
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

func TestDiscoVectors(t *testing.T) {
	vs := vectors()
	if os.Getenv("FERRY_WRITE_VECTORS") == "1" {
		var sb strings.Builder
		sb.WriteString("# Disco messages as tailscale.com/disco marshals them (written by\n")
		sb.WriteString("# interop/discovectors with FERRY_WRITE_VECTORS=1; checked by it and by\n")
		sb.WriteString("# the Rust tests of crates/proto's disco module). Plaintexts, except the\n")
		sb.WriteString("# sealed_* lines: whole packets with a fixed nonce.\n")
		for _, v := range vs {
			b := v.msg.AppendMarshal(nil)
			if v.sealed {
				b = sealWithNonce(v)
			}
			fmt.Fprintf(&sb, "%s %x\n", v.name, b)
		}
		if err := os.WriteFile(vectorFile, []byte(sb.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	file := readVectors(t)
	if len(file) != len(vs) {
		t.Errorf("%s has %d vectors, want %d", vectorFile, len(file), len(vs))
	}
	for _, v := range vs {
		t.Run(v.name, func(t *testing.T) {
			want, ok := file[v.name]
			if !ok {
				t.Fatalf("missing from %s", vectorFile)
			}
			plain := want
			if v.sealed {
				if got := sealWithNonce(v); !reflect.DeepEqual(got, want) {
					t.Fatalf("Tailscale seals\n%x\nthe file has\n%x", got, want)
				}
				src, ok := disco.Source(want)
				from := discoPrivate(v.from).Public()
				if !ok || !reflect.DeepEqual(src, from.AppendTo(nil)) {
					t.Fatalf("sender %x, want %v", src, from)
				}
				sender := key.DiscoPublicFromRaw32(mem.B(src))
				opened, ok := discoPrivate(v.to).Shared(sender).Open(want[len(disco.Magic)+32:])
				if !ok {
					t.Fatal("Tailscale's disco box does not open it")
				}
				plain = opened
			}
			if got := v.msg.AppendMarshal(nil); !reflect.DeepEqual(got, plain) {
				t.Fatalf("Tailscale marshals\n%x\nthe file has\n%x", got, plain)
			}
			parsed, err := disco.Parse(plain)
			if err != nil {
				t.Fatalf("Tailscale does not parse it: %v", err)
			}
			if !reflect.DeepEqual(parsed, v.msg) {
				t.Fatalf("Tailscale parses\n%#v\nwant\n%#v", parsed, v.msg)
			}
		})
	}
}

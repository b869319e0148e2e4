module ferry.invalid/interop/derper104

go 1.27.4

require (
	ferry.invalid/interop/testcert v0.0.0
	tailscale.com v1.104.7
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/akutz/memconn v0.1.0 // indirect
	github.com/axiomhq/hyperloglog v0.2.6 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/coder/websocket v1.8.15 // indirect
	github.com/creachadair/msync v0.10.1 // indirect
	github.com/dblohm7/wingoes v0.0.0-20260526185140-fb298caac7ca // indirect
	github.com/dgryski/go-metro v0.0.0-20250106013310-edb8663e5e33 // indirect
	github.com/fxamacker/cbor/v2 v2.9.3 // indirect
	github.com/go-json-experiment/json v0.0.0-20260820222146-c27c302e5fc3 // indirect
	github.com/go4org/hashtriemap v0.0.0-20260925222741-44e5305f85d9 // indirect
	github.com/golang/groupcache v0.0.0-20241129210726-2c02b8208cf8 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/hdevalence/ed25519consensus v0.2.0 // indirect
	github.com/jsimonetti/rtnetlink v1.4.2 // indirect
	github.com/kamstrup/intmap v0.5.2 // indirect
	github.com/mdlayher/netlink v1.11.2 // indirect
	github.com/mdlayher/socket v0.7.0 // indirect
	github.com/mitchellh/go-ps v1.0.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/prometheus/client_golang v1.24.1 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.71.0 // indirect
	github.com/prometheus/procfs v0.21.1 // indirect
	github.com/tailscale/go-winio v0.0.0-20231025203758-c4f33415bf55 // indirect
	github.com/tailscale/setec v0.0.0-20260824224040-f8d7a936837c // indirect
	github.com/x448/float16 v0.8.4 // indirect
	go4.org/mem v0.0.0-20240501181205-ae6ca9944745 // indirect
	go4.org/netipx v0.0.0-20260823151212-3075585bcbeb // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/exp v0.0.0-20260908205506-85c1c2202aba // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	golang.org/x/time v0.16.0 // indirect
	golang.zx2c4.com/wireguard/windows v1.0.1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

// Versions the Go module proxy serves, in place of those tailscale.com
// v1.104.7 pins that it refuses: setec as tailscale.com v1.102.5 pins it
// (derper only uses it to fetch secrets from a setec server);
// wireguard-go and gliderssh as v1.104.0 pins them; gvisor's newest
// served. .ci/setup.d/10-derper.sh builds cmd/derper with these.
replace (
	github.com/tailscale/gliderssh => github.com/tailscale/gliderssh v0.3.4-0.20260716005906-1a0f895faf28
	github.com/tailscale/setec => github.com/tailscale/setec v0.0.0-20251203133219-2ab774e4129a
	github.com/tailscale/wireguard-go => github.com/tailscale/wireguard-go v0.0.0-20260928213032-417aef361226
	gvisor.dev/gvisor => gvisor.dev/gvisor v0.0.0-20260905035102-160fafc42237
)

tool tailscale.com/cmd/derper

// The test suites' certificates, shared with the interop module.
replace ferry.invalid/interop/testcert => ../testcert

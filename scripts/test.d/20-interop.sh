# The Go interop suite: Tailscale's own client code (derphttp, derpprobe,
# stun) against ferry and derper side by side — once with ferry on epoll,
# once with its default back end (io_uring where the kernel allows it).
# Every go test run goes through expect_go_test (scripts/lib/expect.sh):
# it fails unless the tests it names passed (a -run pattern that matches
# nothing passes with "no tests to run"), and lists every skip with its
# reason (the kernel-TLS test runs only in the VM, step 55; the e2e tests
# only in step 50; the derper-only halves skip in the ferry-only pass).
# The interop module's clients are tailscale.com v1.102.5 (older clients
# stay covered); derper, and the clients of interop/reference (Go 1.27),
# are v1.104.7.
set -euo pipefail
. scripts/lib/expect.sh
cargo build --locked -p ferry
export FERRY_BIN=${CARGO_TARGET_DIR:-$PWD/target}/debug/ferry
# Which back end --io auto must pick here: io_uring where the engine's
# probe says it runs (under CI=true it must: step 15 fails otherwise), and
# the suite checks every ferry it starts logged that one.
expect=epoll
if cargo run -q --locked -p ferry-engine --example uring_probe >/dev/null 2>&1; then expect=uring; fi
cd interop
# The full passes (./...) select nothing by name: every test runs, and at
# least one must pass. The WebSocket runs select one test: it must pass
# for each server.
echo "-- ferry --io epoll (and derper)"
FERRY_ARGS="--io epoll" expect_go_test interop-epoll "" ./... -count=1 -timeout 10m
# DERP over WebSocket with Tailscale's client built with its WebSocket
# support (a build tag; the test switches it on per client).
FERRY_ARGS="--io epoll" expect_go_test interop-websocket-epoll "TestWebSocket/ferry TestWebSocket/derper" \
  -tags ts_debug_websockets -run '^TestWebSocket$' . -count=1 -timeout 5m
echo "-- ferry --io auto (expecting $expect)"
export FERRY_EXPECT_BACKEND=$expect
FERRY_ARGS="--io auto" INTEROP_SERVERS=ferry expect_go_test interop-auto "" ./... -count=1 -timeout 10m
FERRY_ARGS="--io auto" INTEROP_SERVERS=ferry expect_go_test interop-websocket-auto "TestWebSocket/ferry" \
  -tags ts_debug_websockets -run '^TestWebSocket$' . -count=1 -timeout 5m
# tailscale.com v1.104.7's own client (interop/reference, built with the
# Go toolchain its go.mod names) against ferry and derper v1.104.7: app
# names accepted, refused and announced to a watcher, and a region of one
# ferry and one derper node with named clients (about 2 s of tests).
# The suites' shared test certificates (a module of their own).
(cd testcert && expect_go_test interop-testcert "TestWriteLocalhost" . -count=1 -timeout 2m)
echo "-- Tailscale v1.104.7 clients (interop/reference)"
(
  cd reference
  export GOTOOLCHAIN=go$(sed -n 's/^go \([0-9.]*\)$/\1/p' go.mod)
  expect_go_test interop-v1.104.7 "TestAppNames/derper TestAppNames/ferry TestMixedRegionAppNames" \
    . -count=1 -timeout 5m
)

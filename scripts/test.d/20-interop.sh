# The Go interop suite: Tailscale's own client code (derphttp, derpprobe,
# stun) against ferry and derper side by side — once with ferry on epoll,
# once with its default back end (io_uring where the kernel allows it).
set -euo pipefail
cargo build --locked -p ferry
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
cd interop
echo "-- ferry --io epoll (and derper)"
FERRY_BIN="$target_dir/debug/ferry" FERRY_ARGS="--io epoll" go test ./... -count=1 -timeout 10m
# DERP over WebSocket with Tailscale's client built with its WebSocket
# support (a build tag; the test switches it on per client).
FERRY_BIN="$target_dir/debug/ferry" FERRY_ARGS="--io epoll" go test -tags ts_debug_websockets -run TestWebSocket . -count=1 -timeout 5m
# Which back end --io auto must pick here: io_uring where the engine's
# probe says it runs (under CI=true it must: step 15 fails otherwise), and
# the suite checks every ferry it starts logged that one.
expect=epoll
if (cd .. && cargo run -q --locked -p ferry-engine --example uring_probe >/dev/null 2>&1); then expect=uring; fi
echo "-- ferry --io auto (expecting $expect)"
export FERRY_EXPECT_BACKEND=$expect
FERRY_BIN="$target_dir/debug/ferry" FERRY_ARGS="--io auto" INTEROP_SERVERS=ferry go test ./... -count=1 -timeout 10m
FERRY_BIN="$target_dir/debug/ferry" FERRY_ARGS="--io auto" INTEROP_SERVERS=ferry go test -tags ts_debug_websockets -run TestWebSocket . -count=1 -timeout 5m

# The static binary: `cargo build --release --target
# x86_64-unknown-linux-musl -p ferry` must build and run. Checks that the
# result is statically linked, runs its --version, and carries one real
# relay exchange through it: ferry-bench's latency run (the debug build
# the earlier steps made) pings two DERP clients through the static ferry
# for a second and must get every echo back. Its own target directory
# (target/<triple>/release) leaves the other steps' builds alone.
set -euo pipefail
. scripts/lib/expect.sh
triple=x86_64-unknown-linux-musl
skip() { expect_skip "static musl binary (step 13)" "$1" ".ci/setup.d/13-musl.sh installs it"; }
rustup target list --installed | grep -x "$triple" >/dev/null || skip "the Rust target $triple is not installed"
command -v musl-gcc >/dev/null || skip "musl-gcc (Debian: musl-tools) is not installed"
for tool in jq file readelf; do
  command -v "$tool" >/dev/null || skip "$tool is not installed"
done

start=$SECONDS
cargo build --locked --release --target "$triple" -p ferry
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
bin="$target_dir/$triple/release/ferry"
echo "static build: $((SECONDS - start)) s"
# No interpreter and no libraries (a static PIE, which ldd calls
# "statically linked").
file "$bin" | grep -E 'static-pie linked|statically linked' >/dev/null || { file "$bin" >&2; echo "not a static binary" >&2; exit 1; }
[ "$(readelf -d "$bin" | grep -c NEEDED)" = 0 ] || { readelf -d "$bin" >&2; echo "the binary needs shared libraries" >&2; exit 1; }
"$bin" --version | grep -E '^ferry [0-9]' || { echo "--version printed nothing useful" >&2; exit 1; }

work=$(mktemp -d)
pid=
cleanup() {
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
FERRY_LOG=info "$bin" -a 127.0.0.1:0 --stun-port 0 --workers 1 -c "$work/ferry.key" 2>"$work/log" &
pid=$!
url=
for _ in $(seq 100); do
  url=$(sed -n 's/.*ferry relay running.* url=\([^ ]*\).*/\1/p' "$work/log")
  [ -n "$url" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/log" >&2; echo "the static ferry exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { cat "$work/log" >&2; echo "the static ferry did not start" >&2; exit 1; }
grep -m 1 -o 'backend="[a-z]*"' "$work/log"
cargo run --locked -q -p ferry-bench -- latency -s "${url%/derp}" -q \
  --warmup 0s -d 1s --drain 2s -o "$work/latency.json"
jq -e '.result.pings_sent > 0 and .result.ping_loss == 0' "$work/latency.json" >/dev/null || {
  jq -c .result "$work/latency.json" >&2
  echo "pings through the static ferry were lost" >&2
  exit 1
}
echo "through the static ferry: $(jq -r '"\(.result.pongs_received) of \(.result.pings_sent) pings echoed, median round trip \(.result.rtt_us.p50) us"' "$work/latency.json")"
kill -TERM "$pid"
wait "$pid"
pid=
grep -q 'INFO stopped' "$work/log" || { cat "$work/log" >&2; exit 1; }
echo "static ferry: $((SECONDS - start)) s in all"

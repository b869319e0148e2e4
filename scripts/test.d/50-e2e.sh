# End to end: real tailscaled nodes, logged in to a real Headscale, talking
# through ferry (TLS and plain HTTP) and derper in network namespaces with
# direct UDP between them blocked (interop/e2e). Needs root; without it the
# test skips and says why. tailscaled, tailscale, derper and Headscale
# come from set-up (.ci/setup.d/50-e2e.sh builds them into interop/bin);
# run by hand without set-up, the test builds what is missing first
# (about 6 minutes).
set -euo pipefail
. scripts/lib/expect.sh
cargo build --locked -p ferry
# Ferry's tailnet control client against the Headscale set-up built
# (loopback, no root): ignored in step 10's workspace run, which comes
# before that binary exists; without it the test skips (a failure under
# CI=true). At least one test must run: a renamed or no longer ignored
# test would otherwise pass here by selecting nothing.
expect_run_libtest 1 cargo test --locked -p ferry-tailnet --test headscale -- --ignored
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
cd interop
# Namespaces named fe-<pid>-* belong to a test process; if it was killed
# (go test's -timeout does not run cleanups), delete them and whatever runs
# inside them once it is gone. The next run does the same on start.
reap() {
  for ns in $(ip netns list 2>/dev/null | awk '/^fe-[0-9]+-/ {print $1}'); do
    pid=${ns#fe-}; pid=${pid%%-*}
    kill -0 "$pid" 2>/dev/null && continue
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns delete "$ns" 2>/dev/null || true
  done
}
trap reap EXIT
# The four tests by name: each must pass (a renamed one would otherwise
# leave "no tests to run"), their output streamed as it comes; a skip
# (not root, a tool missing: the test says which) passes only without CI.
tests="TestTailscaleThroughRelay TestAdmission TestMeshRegion TestPeerRelay"
FERRY_E2E=1 FERRY_BIN="$target_dir/debug/ferry" \
  expect_go_test -v -k e2e "$tests" ./e2e -run "^(${tests// /|})\$" -count=1 -timeout 15m
# CI's machine has root, namespaces and the tools (.ci/setup.d): a skip
# there is a failure, not a pass.
if [ "${CI:-}" = true ] && [ "$EXPECT_SKIPS" != 0 ]; then
  echo "CI=true: the end-to-end test must run on this machine ($EXPECT_SKIPS skipped)" >&2
  exit 1
fi

# The binary's and the SDK's tests again, on epoll (FERRY_TEST_IO=epoll:
# the variable the test support reads, never the binary; 10-rust.sh ran
# them on the default back end, io_uring here), so that both back ends
# always pass the same suite. The engine's and the relay's tests are
# compiled per back end and ran on both in 10-rust.sh. Where io_uring
# cannot run, --io auto selects epoll, which 10-rust.sh then covered: the
# step says why and skips (under CI=true, whose kernel has io_uring, that
# is a failure).
set -euo pipefail
. scripts/lib/expect.sh
set +e
probe=$(cargo run -q --locked -p ferry-engine --example uring_probe)
rc=$?
set -e
case $rc in
  0) echo "$probe" ;;
  2) expect_skip "io_uring back end (step 15)" "${probe#io_uring: } (--io auto selects epoll on this machine; 10-rust.sh tested it)" \
       "CI's kernel runs io_uring" ;;
  *) echo "the io_uring probe did not run (exit $rc)"; exit "$rc" ;;
esac
FERRY_TEST_IO=epoll cargo test --locked -p ferry -p ferry-client

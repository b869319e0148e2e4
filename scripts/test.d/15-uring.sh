# The engine's and the relay's tests again, on io_uring (10-rust.sh runs
# them on epoll), so both back ends always pass the same suite. Where
# io_uring cannot run, say why and stop: --io auto then selects epoll,
# which 10-rust.sh covered.
set -euo pipefail
set +e
probe=$(cargo run -q --locked -p ferry-engine --example uring_probe)
rc=$?
set -e
case $rc in
  0) echo "$probe" ;;
  2)
    echo "SKIPPED: the io_uring back end is not tested here. ${probe#io_uring: }"
    echo "(--io auto selects epoll on this machine; 10-rust.sh tested it.)"
    # CI runs on a kernel with io_uring: there a skip is a failure.
    if [ "${CI:-}" = true ]; then
      echo "CI=true: the io_uring tests must run on this machine" >&2
      exit 1
    fi
    exit 0
    ;;
  *) echo "the io_uring probe did not run (exit $rc)"; exit "$rc" ;;
esac
FERRY_IO=uring cargo test --locked -p ferry-engine -p ferry-relay

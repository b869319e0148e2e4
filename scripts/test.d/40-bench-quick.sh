# Smoke test of the benchmark suite (bench/run.sh quick): Ferry, derper,
# tuned derper and the ceiling through every suite for a second or so each,
# with the debug builds the earlier steps already made. It checks that the
# tool works and the numbers are sane (packets delivered, loss within
# [0, 1], percentiles ordered, connections held), never a speed target.
set -euo pipefail
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bash bench/run.sh quick --profile dev --out "$out"
test -s "$out/results.md"
test -s "$out/summary.json"

# The soaks (bench/run.sh soak), as smoke checks of about 40 s together:
# the DERP soak with 20 peers and the UDP relay's (raw datagrams through
# the bounce, in namespaces) at fixed low rates, debug builds, 8 s of load
# sampled every second, then 3 s idle. It checks that the summary has its
# fields with sane values (RSS and descriptors seen, a sample per second,
# latency measured, nothing lost at that rate), never a figure.
soak_check() { # soak_check DIR JQ-FILTER: the summary passes the filter
  if ! jq -e "$2" "$1/soak.json" >/dev/null; then
    echo "soak smoke check: unexpected summary in $1/soak.json" >&2
    jq '.summary' "$1/soak.json" >&2
    exit 1
  fi
}
common='.summary | .rss_start > 0 and .rss_end_of_load > 0 and .rss_after_idle > 0 and .samples >= 7
  and .fds_start > 0 and .fds_after_idle > 0 and .loss == 0 and .delivered_mbps > 0
  and (.latency_p50_first_last_us | all(. > 0))'
timeout 120 bash bench/run.sh soak --profile dev --peers 20 --rate 20 --warmup 1s --duration 8s --sample 1s \
  --idle 3s --out "$out/soak-derp"
soak_check "$out/soak-derp" "$common"
. crates/udp/tests/netns/lib.sh
fu_skip_or_fail "UDP relay soak smoke check" "$(fu_why_not jq taskset)"
timeout 120 bash bench/run.sh soak --relay udp --profile dev --pps 2000 --warmup 1s --duration 8s \
  --sample 1s --idle 3s --out "$out/soak-udp"
soak_check "$out/soak-udp" "$common and .delivered_packets == .sent_packets and .probe_sent > 0 and .probe_lost == 0
  and (.drops_at_end | length > 0)"
echo "soak smoke checks: ok"

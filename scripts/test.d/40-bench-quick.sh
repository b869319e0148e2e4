# Smoke test of the benchmark suite (bench/run.sh quick): Ferry, derper,
# tuned derper and the ceiling through every suite for a second or so each,
# with the debug builds the earlier steps already made. It checks that the
# tool works and the numbers are sane (packets delivered, loss within
# [0, 1], percentiles ordered, connections held), never a speed target.
set -euo pipefail
# The results layout every suite writes (bench/ferrybench/layout.py): its
# writers on JSON shaped like each suite's, --rerender of a stored DERP
# run, the stored results' names (about 2 s, no benchmark).
python3 -m unittest discover -s bench/tests
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bash bench/run.sh quick --profile dev --out "$out"
# The layout every suite writes (bench/ferrybench/layout.py).
test -s "$out/results.md"
test -s "$out/summary.json"
jq -e '.suite == "derp" and has("commit") and (.pinning | type == "string")' "$out/summary.json" >/dev/null
test -n "$(ls "$out/raw")"

# The soaks (bench/run.sh soak), as smoke checks of about 40 s together:
# the DERP soak with 20 peers and the UDP relay's (raw datagrams through
# the bounce, in namespaces) at fixed low rates, debug builds, 8 s of load
# sampled every second, then 3 s idle. Besides the plumbing (RSS and
# descriptors seen, a sample per second, latency measured, nothing lost at
# that rate), each asserts what a leak would break, with these bounds:
#
# - Descriptors: one more per connection (DERP: 20 peers) or bounce
#   session (UDP: a socket each, 8 flows and the probe) under load, and
#   back to exactly the count before the load after idle (the DERP peers
#   have closed; the bounce's sessions idle out after 2 s, --bounce-idle,
#   a tick of 250 ms later, before the last idle sample). One leaked
#   descriptor fails it.
# - RSS after idle against RSS before the load: DERP at most 1.25 times,
#   UDP at most 1.10 times. Measured on 2026-11-28 (debug builds, loaded
#   2-core machine): DERP 1.09-1.12 (25-30 MiB), UDP 1.02 (16 MiB): each
#   bound is over twice the growth seen. The load moves about 16,000
#   packets of 1400 bytes (DERP) and 18,000 datagrams (UDP): keeping each
#   packet's buffer would grow RSS by 22-25 MiB, about 1.8 times.
# - DERP's heap in use (ferry_heap_in_use_bytes, the allocator's own
#   count, which RSS hides behind freed-but-kept pages) after idle at most
#   2 MiB over its value before the load. Measured: 0.56-0.69 MiB over
#   (pools and tables sized for 20 peers). 2 MiB is about 130 bytes per
#   packet, or 100 KiB per connection, kept.
# - UDP: every session opened was closed by its idle timeout (opened =
#   expired, none left), and one per flow and the probe were open at the
#   end of the load.
# A gauge that is not in the summary is an error, never read as 0.
# The soaks' binaries (ferry, and the load generators of crates/bench:
# ferry-bench, udp_gen) are built first, outside the time limits, which
# bound the runs.
cargo build --locked -q -p ferry -p ferry-bench
soak_check() { # soak_check DIR JQ-FILTER: the layout is there, the summary passes the filter
  test -s "$1/results.md"
  jq -e '.suite == "soak" and (.series | length == 1)' "$1/summary.json" >/dev/null
  if ! jq -e "$2" "$1/raw/soak.json" >/dev/null; then
    echo "soak smoke check: unexpected summary in $1/raw/soak.json" >&2
    jq '{summary, start_gauges: .start.gauges, idle_last: .idle[-1], load_last_gauges: .bench.samples[-1].gauges}' "$1/raw/soak.json" >&2
    exit 1
  fi
}
# num(PATH): the value there, or an error naming it.
num='def num(f; name): (f | if type == "number" then . else error("\(name) is missing") end);'
common='.summary as $s | ($s.rss_start > 0 and $s.rss_end_of_load > 0 and $s.samples >= 7
  and $s.fds_start > 0 and $s.loss == 0 and $s.delivered_mbps > 0
  and ($s.latency_p50_first_last_us | all(. > 0))
  and num($s.rss_after_idle; "rss_after_idle") <= $factor * $s.rss_start
  and num($s.fds_after_idle; "fds_after_idle") == $s.fds_start)'
timeout 120 bash bench/run.sh soak --no-build --profile dev --peers 20 --rate 20 --warmup 1s --duration 8s --sample 1s \
  --idle 3s --out "$out/soak-derp"
soak_check "$out/soak-derp" "$num 1.25 as \$factor | $common
  and .summary.fds_end_of_load >= .summary.fds_start + 20
  and num(.idle[-1].gauges.ferry_heap_in_use_bytes; \"ferry_heap_in_use_bytes after idle\")
      <= num(.start.gauges.ferry_heap_in_use_bytes; \"ferry_heap_in_use_bytes before the load\") + 2 * 1048576"
echo "DERP soak: $(jq -r '.summary | "RSS \(.rss_start / 1048576 * 10 | round / 10) -> \(.rss_after_idle / 1048576 * 10 | round / 10) MiB after idle, descriptors \(.fds_start) -> \(.fds_end_of_load) -> \(.fds_after_idle)"' "$out/soak-derp/raw/soak.json")"
. scripts/lib/netns.sh
fu_skip_or_fail "UDP relay soak smoke check" "$(fu_why_not jq taskset)"
timeout 120 bash bench/run.sh soak --no-build --relay udp --profile dev --pps 2000 --warmup 1s --duration 8s \
  --sample 1s --idle 3s --bounce-idle 2s --out "$out/soak-udp"
soak_check "$out/soak-udp" "$num 1.10 as \$factor | $common
  and .summary.delivered_packets == .summary.sent_packets and .summary.probe_sent > 0 and .summary.probe_lost == 0
  and (.summary.drops_at_end | length > 0)
  and num(.bench.samples[-1].gauges.ferry_udp_sessions; \"ferry_udp_sessions under load\") == .config.flows + 1
  and .summary.fds_end_of_load >= .summary.fds_start + .config.flows + 1
  and num(.idle[-1].gauges.ferry_udp_sessions; \"ferry_udp_sessions after idle\") == 0
  and num(.idle[-1].gauges.ferry_udp_sessions_expired_total; \"ferry_udp_sessions_expired_total\")
      == num(.idle[-1].gauges.ferry_udp_sessions_opened_total; \"ferry_udp_sessions_opened_total\")"
echo "UDP soak: $(jq -r '.summary | "RSS \(.rss_start / 1048576 * 10 | round / 10) -> \(.rss_after_idle / 1048576 * 10 | round / 10) MiB after idle, descriptors \(.fds_start) -> \(.fds_end_of_load) -> \(.fds_after_idle)"' "$out/soak-udp/raw/soak.json")"
echo "soak smoke checks: ok"

#!/usr/bin/env bash
# Relay sessions across a region's nodes: the namespace region of
# crates/ferry/tests/netns/fleet.sh (two meshed Ferry nodes, a `ferry
# link` with wireguard-go on each), run N times, its figures gathered:
#
#   alloc_s        links started -> A's path is the cross-node relay session
#                  (polled every 0.1 s through `ferry link status`)
#   ping_gap_s     hosting node SIGKILLed: longest gap between answers of
#                  a ping every 50 ms through the tunnel
#   tcp_stall_s    the same kill: longest run of empty 0.1 s intervals of
#                  an iperf3 TCP transfer (50 Mbit/s) through the tunnel
#   relay_again_s  the kill -> the tunnel's bytes reach the surviving
#                  node's relay port (nftables counter, polled every 0.1 s)
#
#   sudo bash bench/link/fleet.sh [-n N] [--out FILE] [--no-build]
#
# Prints each figure's median, min, max and the spread between the 25th
# and 75th percentiles over the N runs (default 7), and writes them as one
# JSON document to FILE (with --out). Builds the release binary unless
# --no-build or FERRY_BIN names one. Each run takes about 20 s.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
n=7 out="" build=1
while [ $# -gt 0 ]; do
  case $1 in
    -n) n=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-build) build=""; shift ;;
    *) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
case $n in '' | *[!0-9]* | 0) echo "-n: a positive count" >&2; exit 2 ;; esac
if [ -z "${FERRY_BIN:-}" ]; then
  if [ -n "$build" ]; then (cd "$root" && cargo build --release --locked -q -p ferry); fi
  export FERRY_BIN="${CARGO_TARGET_DIR:-$root/target}/release/ferry"
fi
figures=$(mktemp /tmp/fleet-bench.XXXXXX)
trap 'rm -f "$figures" "$figures.run"' EXIT
for i in $(seq 1 "$n"); do
  : >"$figures.run"
  if ! FLEET_RESULTS="$figures.run" FLEET_CASES="fleet-session fleet-kill-host" \
      timeout 300 bash "$root/crates/ferry/tests/netns/fleet.sh" >"$figures.log" 2>&1; then
    cat "$figures.log" >&2; rm -f "$figures.log"
    echo "run $i of $n failed" >&2; exit 1
  fi
  rm -f "$figures.log"
  echo "run $i of $n: $(tr '\n' ' ' <"$figures.run")"
  cat "$figures.run" >>"$figures"
done
python3 - "$figures" "$n" "$out" <<'PY'
import json, statistics, sys
path, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
runs = {}
for line in open(path):
    k, v = line.split()
    runs.setdefault(k, []).append(float(v))
def q(xs, p):
    xs = sorted(xs)
    i = (len(xs) - 1) * p
    lo, hi = int(i), min(int(i) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)
summary = {}
print(f"{'figure':<15} {'median':>8} {'min':>8} {'max':>8} {'p25-p75':>8}  (seconds, {n} runs)")
for k in ["alloc_s", "ping_gap_s", "tcp_stall_s", "relay_again_s"]:
    xs = runs.get(k)
    if not xs or len(xs) != n:
        sys.exit(f"{k}: {len(xs or [])} values for {n} runs")
    s = {"median": statistics.median(xs), "min": min(xs), "max": max(xs),
         "p25": q(xs, 0.25), "p75": q(xs, 0.75), "runs": xs}
    summary[k] = s
    print(f"{k:<15} {s['median']:>8.2f} {s['min']:>8.2f} {s['max']:>8.2f} {s['p75'] - s['p25']:>8.2f}")
if out:
    with open(out, "w") as f:
        json.dump({"suite": "link-fleet", "runs": n, "figures": summary}, f, indent=1)
    print(f"written to {out}")
PY

#!/usr/bin/env bash
# SDK benchmark: datagram goodput and round trip between two
# SDK endpoints (endpoint_bench, crates/bench/src/bin/endpoint_bench.rs) on this machine,
# per path — direct UDP, a relay session, DERP — through a Ferry relay run
# as its own process. The relay is pinned to CPU 0, the endpoints to CPU 1.
#
#   bash bench/sdk/run.sh                       # 5 repeats of 5 s per path
#   bash bench/sdk/run.sh --seconds 1 --repeats 1 --rtt 200   # smoke run
#   bash bench/sdk/run.sh --rate 500 --paths "relay derp"     # paced at 500 Mbit/s
#   bash bench/sdk/run.sh --batch 64            # send_batch/recv_batch, 64 a call
#
# Writes the runs, their medians and spread as JSON and a Markdown table
# into bench/results/<date>-sdk-<time>/ (raw/sdk.json; results.md: the
# table, then summary.json's figures; bench/README.md, "Results"), or to
# --out FILE (and FILE's name with .md) only.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
seconds=5 repeats=5 size=1200 rate=0 rtt=2000 batch=0 paths="direct relay derp" out="" build=1
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --rtt) rtt=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --paths) paths=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-build) build=""; shift ;;
    *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
for tool in taskset python3; do
  command -v "$tool" >/dev/null || { echo "bench/sdk: $tool is missing" >&2; exit 1; }
done
target=${CARGO_TARGET_DIR:-$root/target}
if [ -n "$build" ]; then
  (cd "$root" && cargo build --release --locked -q -p ferry && cargo build --release --locked -q -p ferry-bench --bin endpoint_bench)
fi
ferry=${FERRY_BIN:-$target/release/ferry}
bench=$target/release/endpoint_bench
for b in "$ferry" "$bench"; do [ -x "$b" ] || { echo "bench/sdk: no binary at $b (drop --no-build)" >&2; exit 1; }; done
. "$root/bench/lib/results.sh"
dir=""
if [ -z "$out" ]; then
  dir=$(bench_results_dir sdk "$(date -u +%H%M%SZ)")
  out="$dir/raw/sdk.json"
fi
tmp=$(mktemp -d /tmp/ferry-sdk-bench.XXXXXX)
relay_pid=""
cleanup() { [ -z "$relay_pid" ] || kill "$relay_pid" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# A free loopback port (the kernel's pick; released just before use).
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
taskset -c 0 "$ferry" -a "127.0.0.1:$port" --stun=false --relay-port 0 -c "$tmp/relay.key" >"$tmp/relay.log" 2>&1 &
relay_pid=$!
end=$((SECONDS + 20))
until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
  kill -0 "$relay_pid" 2>/dev/null || { echo "bench/sdk: the relay exited:" >&2; tail -n 20 "$tmp/relay.log" >&2; exit 1; }
  [ $SECONDS -lt $end ] || { echo "bench/sdk: the relay is not listening on $port after 20 s" >&2; exit 1; }
  sleep 0.1
done
url=http://127.0.0.1:$port/derp
offer="as fast as send takes them"; [ "$rate" = 0 ] || offer="$rate Mbit/s, paced"
batch_args=()
[ "$batch" = 0 ] || { offer="$offer, send_batch/recv_batch of $batch"; batch_args=(--batch "$batch"); }
echo "relay: $url (pid $relay_pid, CPU 0); endpoints on CPU 1; $repeats x $seconds s per path, $size-byte datagrams, offered $offer"

: >"$tmp/runs.jsonl"
for r in $(seq 1 "$repeats"); do
  # Paths interleaved within a repeat, so drifts of the machine hit all.
  for p in $paths; do
    if line=$(taskset -c 1 "$bench" --url "$url" --path "$p" --seconds "$seconds" --size "$size" \
        --rate "$rate" --rtt "$rtt" ${batch_args[@]+"${batch_args[@]}"} --json 2>"$tmp/err"); then
      echo "$line" | python3 -c 'import json, sys; d = json.load(sys.stdin); d["repeat"] = int(sys.argv[1]); print(json.dumps(d))' "$r" >>"$tmp/runs.jsonl"
      echo "  repeat $r $p: $line"
    else
      why=$(tail -n 3 "$tmp/err" | tr '\n' ' ')
      python3 -c 'import json, sys; print(json.dumps({"path": sys.argv[1], "repeat": int(sys.argv[2]), "error": sys.argv[3]}))' "$p" "$r" "$why" >>"$tmp/runs.jsonl"
      echo "  repeat $r $p: failed: $why"
    fi
  done
done

python3 - "$tmp/runs.jsonl" "$out" "$seconds" "$repeats" "$size" "$rate" "$paths" "$("$ferry" --version 2>/dev/null || echo unknown)" <<'PY'
import json, platform, statistics, sys, datetime, os
runs_file, out, seconds, repeats, size, rate, paths, ferry = sys.argv[1:]
runs = [json.loads(l) for l in open(runs_file) if l.strip()]
metrics = ["goodput_mbit_s", "offered_mbit_s", "loss_percent", "refused_at_send", "rtt_p50_us", "rtt_p99_us", "cores_per_gbit_s"]
summary = []
for p in paths.split():
    ok = [r for r in runs if r["path"] == p and "error" not in r]
    s = {"path": p, "runs": len(ok), "failed": sum(1 for r in runs if r["path"] == p and "error" in r)}
    for m in metrics:
        v = [r[m] for r in ok]
        s[m] = {"median": statistics.median(v), "min": min(v), "max": max(v)} if v else None
    summary.append(s)
doc = {
    "at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "ferry": ferry, "kernel": platform.release(), "cpus": os.cpu_count(),
    "seconds": float(seconds), "repeats": int(repeats), "size": int(size), "rate_mbit_s": float(rate),
    "placement": "relay (ferry) on CPU 0, both endpoints on CPU 1",
    "summary": summary, "runs": runs,
}
json.dump(doc, open(out, "w"), indent=1)
def cell(s, m, fmt):
    v = s[m]
    if v is None:
        return "-"
    return f"{fmt.format(v['median'])} ({fmt.format(v['min'])}–{fmt.format(v['max'])})"
lines = [
    f"SDK endpoints, {size}-byte datagrams, {seconds} s per run, median (min–max) of {repeats} repeats; "
    + ("offered as fast as `send` takes them" if float(rate) == 0 else f"offered {rate} Mbit/s paced") + ".",
    "",
    "| path | goodput Mbit/s | offered Mbit/s | loss % | refused at send | RTT p50 µs | RTT p99 µs | cores per Gbit/s | runs (failed) |",
    "|---|---|---|---|---|---|---|---|---|",
]
for s in summary:
    lines.append("| " + " | ".join([s["path"], cell(s, "goodput_mbit_s", "{:.1f}"), cell(s, "offered_mbit_s", "{:.1f}"),
        cell(s, "loss_percent", "{:.2f}"), cell(s, "refused_at_send", "{:.0f}"), cell(s, "rtt_p50_us", "{:.0f}"),
        cell(s, "rtt_p99_us", "{:.0f}"), cell(s, "cores_per_gbit_s", "{:.3f}"), f"{s['runs']} ({s['failed']})"]) + " |")
for r in runs:
    if "error" in r:
        lines.append(f"\nrepeat {r['repeat']} {r['path']} failed: {r['error']}")
md = "\n".join(lines) + "\n"
open(out[:-5] + ".md" if out.endswith(".json") else out + ".md", "w").write(md)
print(md)
print(f"results in {out}")
PY
if [ -n "$dir" ]; then
  bench_results_finish "$dir" "relay (ferry) on CPU 0, both endpoints on CPU 1"
  { cat "$dir/raw/sdk.md"; echo; cat "$dir/results.md"; } >"$dir/results.md.new"
  mv "$dir/results.md.new" "$dir/results.md"
  rm "$dir/raw/sdk.md"
fi

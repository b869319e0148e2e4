#!/usr/bin/env bash
# The UDP relay's own packet rate per core: bounce, receiver-index hub and
# relay sessions, Ferry against socat and the kernel (nftables DNAT), in the same
# namespaces, in one run, interleaved, with a load generator on its own
# core that is not the bottleneck. See README.md ("Packet rate").
#
#   bash bench/udp/pps.sh [-r REPEATS] [-d SECONDS] [-relays "ferry socat nft"]
#                         [-cases "bounce bounce-gso hub hub-gso session session-gso"] [-flows N]
#                         [-procs N] [-size BYTES] [-pps RATE] [-tag TAG | -out FILE]
#                         [-profile debug]
#                         [-flood-pps RATE] [-flood-kind answer|bind] [-flood-from PREFIX]
#
# -pps caps the offered rate (all generator processes together; default:
# as fast as the kernel takes it), to find a relay's lossless rate below
# overload.
# Cases session-flood and session-gso-flood (Ferry only, not in the
# default set) are session and session-gso with a bind flood beside them:
# `udp_gen flood` sends the session port bind messages no client made
# (-flood-kind answer: answers with forged cookies, the default; bind:
# binds for the live sessions, each challenged) at -flood-pps (default
# 290000, 0 = as fast as it goes) from every address of -flood-from
# (default 10.77.24.0/24: 254 sources, added to A), also on CPU 1.
# Compare the session rows with and without the flood at a -pps the
# relay delivers in full, e.g.
#   bash bench/udp/pps.sh -relays ferry -cases "session session-flood" -pps 100000 -r 5
# -profile debug builds and runs the debug binaries (the suite's smoke check
# in scripts/test.d/30-udp.sh); figures come from the release build only.
# Relay (and all receive processing in its namespace, with RPS) on CPU 0,
# generator and sink (and their namespaces' receive processing) on CPU 1.
# Results: a Markdown table on standard output, every sample in
# bench/results/<date>-pps-<tag>/raw/pps.json (-tag, default the time of
# day), with summary.json and results.md beside it (bench/README.md,
# "Results"); -out FILE writes only the samples, to FILE. Needs root, nft,
# socat, jq, taskset.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
repeats=3 secs=5 relays="ferry socat nft" cases="bounce bounce-gso hub hub-gso session session-gso"
flows=8 procs=1 size=1400 rate=0 out="" tag="" profile=release
flood_pps=290000 flood_kind=answer flood_from=10.77.24.0/24
while [ $# -gt 0 ]; do
  case $1 in
    -r) repeats=$2; shift 2 ;;
    -d) secs=$2; shift 2 ;;
    -relays) relays=$2; shift 2 ;;
    -cases) cases=$2; shift 2 ;;
    -flows) flows=$2; shift 2 ;;
    -procs) procs=$2; shift 2 ;;
    -size) size=$2; shift 2 ;;
    -pps) rate=$2; shift 2 ;;
    -out) out=$2; shift 2 ;;
    -tag) tag=$2; shift 2 ;;
    -profile) profile=$2; shift 2 ;;
    -flood-pps) flood_pps=$2; shift 2 ;;
    -flood-kind) flood_kind=$2; shift 2 ;;
    -flood-from) flood_from=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ $((flows % procs)) = 0 ] || { echo "-flows must be a multiple of -procs" >&2; exit 2; }

. scripts/lib/netns.sh
. bench/lib/results.sh
. bench/udp/common.sh
why=$(fu_why_not nft socat jq taskset)
[ -z "$why" ] || { echo "cannot run the UDP packet-rate benchmark: $why" >&2; exit 1; }
[ "$(nproc)" -ge 2 ] || { echo "needs two CPUs (relay on 0, load on 1)" >&2; exit 1; }

case $profile in
  release) build=(--release) ;;
  debug) build=() ;;
  *) echo "-profile: release or debug" >&2; exit 2 ;;
esac
cargo build "${build[@]}" --locked -q -p ferry
cargo build "${build[@]}" --locked -q -p ferry-bench --bin udp_gen --bin session_pps
bin=${CARGO_TARGET_DIR:-$root/target}/$profile
ferry=$bin/ferry
gen=$bin/udp_gen
sessions=$bin/session_pps
dir=""
if [ -z "$out" ]; then
  dir=$(bench_results_dir pps "${tag:-$(date -u +%H%M%SZ)}")
  out="$dir/raw/pps.json"
fi

fu_init
T=$FU_TMP
trap fu_cleanup EXIT
bench_topology "fu-$FU_RUN-pps" 21 22
fu_route $A 10.77.22.0/24 10.77.21.1
fu_route $B 10.77.21.0/24 10.77.22.1
relay_ip=10.77.21.1 sink_ip=10.77.22.2 gen_ip=10.77.21.2
case " $cases " in
  *-flood*)
    # The flood's sources: every address of -flood-from, on A.
    command -v python3 >/dev/null || { echo "the flood cases need python3 (to list -flood-from)" >&2; exit 1; }
    python3 -c 'import ipaddress, sys; [print(f"addr add {a}/32 dev va-r") for a in ipaddress.ip_network(sys.argv[1]).hosts()]' "$flood_from" \
      | ip -n $A -batch -
    fu_route $R "$flood_from" "$gen_ip"
    ;;
esac

# CPU 0 is the relay's: its process is pinned there and R's receive
# processing (socket delivery for Ferry and socat, forwarding for nft) is
# steered there with RPS, so CPU 0's busy time is the whole cost of
# relaying. Generator and sink, and A's and B's receive processing, get
# CPU 1.
ip netns exec $R sh -c 'for q in /sys/class/net/v*/queues/rx-0/rps_cpus; do echo 1 > $q; done'
ip netns exec $A sh -c 'for q in /sys/class/net/v*/queues/rx-0/rps_cpus; do echo 2 > $q; done'
ip netns exec $B sh -c 'for q in /sys/class/net/v*/queues/rx-0/rps_cpus; do echo 2 > $q; done'
hz=$(getconf CLK_TCK)
# Busy jiffies of CPU 0 (user, nice, system, irq, softirq, steal), and the
# relay processes' own (user + system).
cpu0_busy() { awk '$1 == "cpu0" { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
procs_busy() {
  local t=0 p
  for p in $(ip netns pids $R); do
    t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null || echo 0)))
  done
  echo $t
}
# Packets the kernel dropped at a CPU's backlog (softnet_stat, column 2),
# all CPUs, and UDP receive-buffer drops in a namespace.
backlog_drops() {
  local s=0 processed dropped rest
  while read -r processed dropped rest; do s=$((s + 16#$dropped)); done </proc/net/softnet_stat
  echo $s
}

cat >"$T/ferry.toml" <<EOF
pin = true
workers = 1
[[bounce]]
listen = ["$relay_ip:5000"]
target = "$sink_ip:6000"
[hub]
listen = ["0.0.0.0:5001"]
EOF
"$gen" hub-config --flows "$flows" --sink "$sink_ip:6000" >>"$T/ferry.toml"

relay_pids=()
start_relay() {
  relay_pids=()
  case $1 in
    ferry)
      fu_bg $R "$T/ferry.log" taskset -c 0 "$ferry" udp-relay --config "$T/ferry.toml" --log warn
      relay_pids+=("$FU_LAST_PID")
      # Relay sessions: a DERP server (plain HTTP on 8080) with its
      # session port 5002, one shard, also on CPU 0.
      fu_bg $R "$T/ferry-derp.log" taskset -c 0 "$ferry" -a "$relay_ip:8080" --stun=false \
        -c "$T/derp.key" --workers 1 --relay-port 5002
      relay_pids+=("$FU_LAST_PID") ;;
    socat)
      # As people bounce with it: a child per client (flow), all on CPU 0.
      fu_bg $R "$T/socat.log" taskset -c 0 socat -b 65536 UDP4-LISTEN:5000,bind=$relay_ip,fork,reuseaddr UDP4:$sink_ip:6000
      relay_pids+=("$FU_LAST_PID") ;;
    nft)
      ip netns exec $R sysctl -qw net.ipv4.ip_forward=1
      ip netns exec $R nft -f - <<EOF
table ip fu_pps {
  chain pre {
    type nat hook prerouting priority dstnat;
    ip daddr $relay_ip udp dport { 5000, 5001, 5002 } dnat to $sink_ip:6000
  }
  chain post {
    type nat hook postrouting priority srcnat;
    ip daddr $sink_ip masquerade
  }
}
EOF
      ;;
  esac
  # Until the relay's ports are bound (nft binds none).
  local end=$((SECONDS + 10))
  if [ "$1" != nft ]; then
    until ip netns exec $R ss -Huln | grep -E ':5000\b' >/dev/null \
      && { [ "$1" != ferry ] || ip netns exec $R ss -Huln | grep -E ':5002\b' >/dev/null; }; do
      [ $SECONDS -lt $end ] || { echo "$1 did not bind :5000" >&2; cat "$T"/*.log >&2; return 1; }
      sleep 0.05
    done
  fi
}

stop_relay() {
  bench_stop_relay $R fu_pps "${relay_pids[@]}"
}

# measure RELAY CASE: one sample, printed as a JSON object.
measure() {
  local relay=$1 case=$2 port=5000 shape=raw gso=0 answer="" sink_ns=$B sink_at=$sink_ip vni=() sess_pid=""
  local flood=0 flood_pid="" flood_json=null
  case $case in *-flood) flood=1 case=${case%-flood} ;; esac
  case $case in
    bounce) ;;
    bounce-gso) gso=46 ;;
    hub) port=5001 shape=hub answer=--answer ;;
    hub-gso) port=5001 shape=hub answer=--answer gso=46 ;;
    session | session-gso)
      port=5002
      [ "$case" = session ] || gso=46
      # nft forwards the same bytes to B as plain DNAT. For Ferry, A's
      # clients allocate a session per flow over DERP and bind its two
      # slots from A: the generator's port and the sink's, which then runs
      # in A (a session's slots are bound from where the binder runs).
      if [ "$relay" = ferry ]; then
        shape=session sink_ns=$A sink_at=$gen_ip vni=(--vni-file "$T/sessions")
        rm -f "$T/sessions"
        fu_bg $A "$T/sessions.log" taskset -c 1 "$sessions" --derp "http://$relay_ip:8080/derp" \
          --from "$gen_ip" --sink "$gen_ip:6000" --flows "$flows" --seconds $((secs + 30)) --out "$T/sessions"
        sess_pid=$FU_LAST_PID
        local until=$((SECONDS + 20))
        until [ -s "$T/sessions" ]; do
          [ $SECONDS -lt $until ] && kill -0 "$sess_pid" 2>/dev/null \
            || { echo "relay sessions not bound" >&2; cat "$T/sessions.log" "$T/ferry-derp.log" >&2; return 1; }
          sleep 0.05
        done
      fi ;;
    *) echo "unknown case $case" >&2; return 1 ;;
  esac
  fu_bg $sink_ns "$T/sink.log" taskset -c 1 "$gen" sink --listen "$sink_at:6000" --ports "$flows" --seconds $((secs + 15)) $answer
  local sink_pid=$FU_LAST_PID end=$((SECONDS + 10))
  until ip netns exec $sink_ns ss -Huln | grep -E ":$((6000 + flows - 1))\b" >/dev/null; do
    [ $SECONDS -lt $end ] || { echo "sink did not bind" >&2; return 1; }
    sleep 0.05
  done
  local load0 b0 p0 d0 r0 t0 b1 p1 d1 r1 t1 i gens=()
  load0=$(cut -d' ' -f1 /proc/loadavg)
  b0=$(cpu0_busy) p0=$(procs_busy) d0=$(backlog_drops) r0=$(bench_rcvbuf_errors $R)
  t0=$(date +%s.%N)
  if [ $flood = 1 ]; then
    fu_bg $A "$T/flood.json" taskset -c 1 "$gen" flood --to "$relay_ip:$port" --from "$flood_from" \
      --kind "$flood_kind" "${vni[@]}" --pps "$flood_pps" --seconds "$secs"
    flood_pid=$FU_LAST_PID
  fi
  for i in $(seq 0 $((procs - 1))); do
    ip netns exec $A taskset -c 1 "$gen" send --to "$relay_ip:$port" --flows $((flows / procs)) \
      --first-flow $((i * flows / procs)) --size "$size" --gso "$gso" --shape "$shape" "${vni[@]}" --pps $((rate / procs)) --seconds "$secs" >"$T/send$i.json" &
    gens+=($!)
  done
  local failed=0
  for i in "${gens[@]}"; do wait "$i" || failed=1; done
  if [ -n "$flood_pid" ]; then
    wait "$flood_pid" || failed=1
    flood_json=$(tail -n 1 "$T/flood.json")
  fi
  b1=$(cpu0_busy) p1=$(procs_busy) d1=$(backlog_drops) r1=$(bench_rcvbuf_errors $R)
  t1=$(date +%s.%N)
  wait "$sink_pid" || true
  [ -z "$sess_pid" ] || fu_stop "$sess_pid"
  [ $failed = 0 ] || { echo "a generator failed ($relay $case)" >&2; cat "$T"/send*.json >&2; return 1; }
  local sink offered
  sink=$(tail -n 1 "$T/sink.log")
  offered=$(cat "$T"/send*.json | jq -s '[.[].pps] | add')
  [ $flood = 0 ] || case=$case-flood
  jq -cn --arg relay "$relay" --arg case "$case" --argjson sink "$sink" --argjson offered "$offered" --argjson flood "$flood_json" \
    --argjson cpu0 "$(awk -v a="$b0" -v b="$b1" -v t0="$t0" -v t1="$t1" -v hz="$hz" 'BEGIN { printf "%.3f", (b - a) / hz / (t1 - t0) }')" \
    --argjson proc "$(awk -v a="$p0" -v b="$p1" -v t0="$t0" -v t1="$t1" -v hz="$hz" 'BEGIN { printf "%.3f", (b - a) / hz / (t1 - t0) }')" \
    --argjson backlog "$((d1 - d0))" --argjson rcvbuf "$((r1 - r0))" --argjson load0 "$load0" \
    --argjson load1 "$(cut -d' ' -f1 /proc/loadavg)" --argjson flows "$flows" --argjson procs "$procs" --argjson size "$size" --argjson cap "$rate" \
    '{relay: $relay, case: $case, flows: $flows, generator_processes: $procs, size: $size, offered_cap_pps: $cap,
      offered_pps: $offered, pps: $sink.pps, delivered_fraction: (if $offered > 0 then $sink.pps / $offered else null end),
      cpu0_busy: $cpu0, relay_process_cpu: $proc,
      pps_per_core: (if $cpu0 > 0.05 then $sink.pps / $cpu0 else null end),
      backlog_drops: $backlog, relay_rcvbuf_drops: $rcvbuf, sink: $sink, flood: $flood,
      loadavg_before: $load0, loadavg_after: $load1}'
}

echo "[" >"$out"
first=1
for rep in $(seq 1 "$repeats"); do
  for relay in $relays; do
    start_relay "$relay"
    for case in $cases; do
      # socat has no hub and no sessions; nft forwards the hub's and the
      # sessions' packets as plain DNAT.
      if [ "$relay" = socat ] && [ "${case#bounce}" = "$case" ]; then continue; fi
      # A bind flood means something to Ferry's session port alone.
      if [ "$relay" != ferry ] && [ "${case%-flood}" != "$case" ]; then continue; fi
      line=$(measure "$relay" "$case")
      echo "   $rep $line" >&2
      if [ $first = 1 ]; then first=0; else echo "," >>"$out"; fi
      echo "$line" >>"$out"
    done
    stop_relay
  done
done
echo "]" >>"$out"

model=$(lscpu | awk -F: '/Model name/ { gsub(/^ +/, "", $2); print $2; exit }')
echo
echo "UDP relay packet rate, $(date -u +%Y-%m-%d), $model, $(nproc) CPUs, Linux $(uname -r); $repeats × ${secs}s per case, interleaved; ${size} B datagrams, $flows flows from $procs generator process(es)."
echo "Relay and its namespace's receive processing on CPU 0, generator and sink on CPU 1. pps = what the sink counted; per core = pps ÷ CPU 0 busy. Medians (min–max)."
echo
echo "| Case | Relay | offered pps | delivered pps | delivered % | CPU 0 busy | relay process CPU | pps per core |"
echo "|---|---|---|---|---|---|---|---|"
for case in $cases; do
  for relay in $relays; do
    jq -r --arg r "$relay" --arg c "$case" '
      def med: sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
      def cell(f; fmt): [.[] | select(.relay == $r and .case == $c) | f | select(. != null)] as $v
        | if ($v | length) == 0 then "n/a"
          else "\($v | med | fmt) (\($v | min | fmt)–\($v | max | fmt))" end;
      def i: floor | tostring;
      def p2: . * 100 | floor / 100 | tostring;
      def pct: . * 1000 | floor / 10 | tostring;
      if [.[] | select(.relay == $r and .case == $c)] | length == 0 then empty else
      "| \($c) | \($r) | \(cell(.offered_pps; i)) | \(cell(.pps; i)) | \(cell(.delivered_fraction; pct)) | \(cell(.cpu0_busy; p2)) | \(cell(.relay_process_cpu; p2)) | \(cell(.pps_per_core; i)) |" end
    ' "$out"
  done
done
echo
echo "load average during the samples: $(jq -r '[.[] | .loadavg_before, .loadavg_after] | "\(min)–\(max)"' "$out") (other work on the machine shows here)"
if [ -n "$dir" ]; then
  bench_results_finish "$dir" "relay and its namespace's receive processing (RPS) on CPU 0; generator, sink and their namespaces' receive processing on CPU 1"
  echo "samples: $out; summary.json and results.md in $dir"
else
  echo "samples: $out"
fi

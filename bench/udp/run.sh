#!/usr/bin/env bash
# UDP relay benchmark: stock WireGuard (wireguard-go) through Ferry's static
# bounce, through socat, and through a kernel nftables DNAT relay (the
# ceiling), in the same namespaces, in one run, interleaved. See README.md.
#
#   bash bench/udp/run.sh [-r REPEATS] [-d SECONDS] [-relays "ferry socat nft"]
#
# Per relay and repeat: iperf3 TCP and UDP through the WireGuard tunnel,
# and raw 1400-byte datagrams from a load generator (packets per second at
# the sink, and the relay's CPU time for packets per second per core).
# Results: a Markdown table on standard output, every sample in
# bench/results/<date>-udp-<time>/raw/udp.json, with summary.json and
# results.md beside it (bench/README.md, "Results"). Needs root, wg, wireguard-go, iperf3,
# socat, nft, jq, taskset.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
repeats=3 secs=10 relays="ferry socat nft"
while [ $# -gt 0 ]; do
  case $1 in
    -r) repeats=$2; shift 2 ;;
    -d) secs=$2; shift 2 ;;
    -relays) relays=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

. scripts/lib/netns.sh
. bench/udp/common.sh
. bench/lib/results.sh
why=$(fu_why_not wg iperf3 socat nft jq taskset)
if [ -z "$why" ] && ! fu_wireguard_go >/dev/null; then why="wireguard-go not found"; fi
[ -z "$why" ] || { echo "cannot run the UDP benchmark: $why" >&2; exit 1; }

cargo build --release --locked -q -p ferry
cargo build --release --locked -q -p ferry-bench --bin udp_gen
ferry=$root/target/release/ferry
load=$root/target/release/udp_gen
dir=$(bench_results_dir udp "$(date -u +%H%M%SZ)")
out="$dir/raw/udp.json"

fu_init
T=$FU_TMP
trap fu_cleanup EXIT
bench_topology "fu-$FU_RUN-bench" 11 12
fu_key a; fu_key b
fu_wg $A "fu${FU_RUN}a" "$T/a.key" 51820 10.77.110.1/24
fu_wg $B "fu${FU_RUN}b" "$T/b.key" 51820 10.77.110.2/24
fu_wg_peer $B "fu${FU_RUN}b" "$(fu_pub a)" 10.77.110.1/32
fu_wg_peer $A "fu${FU_RUN}a" "$(fu_pub b)" 10.77.110.2/32 10.77.11.1:51820
fu_bg $B "$T/iperf.log" iperf3 -s -B 10.77.110.2

# One core is the relay's: its process is pinned there. For the packet
# rate measurements, receive processing in R (socket delivery for Ferry and
# socat, forwarding for nftables) is also steered there with RPS, so that
# core's busy time is the whole cost of relaying, while the load generator
# and sink (and their receive processing) get core 0. The tunnel
# measurements run without RPS, as a host would.
cpus=$(nproc)
relay_cpu=$((cpus - 1))
relay_mask=$(printf '%x' $((1 << relay_cpu)))
rps() { # rps on|off
  local r=0 o=0
  if [ "$1" = on ]; then r=$relay_mask o=1; fi
  ip netns exec $R sh -c "echo $r > /sys/class/net/vr-a/queues/rx-0/rps_cpus; echo $r > /sys/class/net/vr-b/queues/rx-0/rps_cpus"
  ip netns exec $A sh -c "echo $o > /sys/class/net/va-r/queues/rx-0/rps_cpus"
  ip netns exec $B sh -c "echo $o > /sys/class/net/vb-r/queues/rx-0/rps_cpus"
}
# Busy jiffies of the relay's core (user, nice, system, irq, softirq, steal).
core_busy() { awk -v c="cpu$relay_cpu" '$1 == c { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
cat >"$T/ferry.toml" <<EOF
pin = true
[[bounce]]
listen = ["10.77.11.1:51820"]
target = "10.77.12.2:51820"
[[bounce]]
listen = ["10.77.11.1:5000"]
target = "10.77.12.2:6000"
EOF

relay_pids=()
start_relay() {
  relay_pids=()
  case $1 in
    ferry)
      fu_bg $R "$T/ferry.log" taskset -c "$relay_cpu" "$ferry" udp-relay --config "$T/ferry.toml" --workers 1 --log warn
      relay_pids+=("$FU_LAST_PID") ;;
    socat)
      # One socat per port; with fork, a child per client (one client here).
      fu_bg $R "$T/socat1.log" taskset -c "$relay_cpu" socat -b 65536 UDP4-LISTEN:51820,bind=10.77.11.1,fork,reuseaddr UDP4:10.77.12.2:51820
      relay_pids+=("$FU_LAST_PID")
      fu_bg $R "$T/socat2.log" taskset -c "$relay_cpu" socat -b 65536 UDP4-LISTEN:5000,bind=10.77.11.1,fork,reuseaddr UDP4:10.77.12.2:6000
      relay_pids+=("$FU_LAST_PID") ;;
    nft)
      ip netns exec $R sysctl -qw net.ipv4.ip_forward=1
      ip netns exec $R nft -f - <<'EOF'
table ip fu_bench {
  chain pre {
    type nat hook prerouting priority dstnat;
    ip daddr 10.77.11.1 udp dport 51820 dnat to 10.77.12.2:51820
    ip daddr 10.77.11.1 udp dport 5000 dnat to 10.77.12.2:6000
  }
  chain post {
    type nat hook postrouting priority srcnat;
    ip daddr 10.77.12.2 masquerade
  }
}
EOF
      ;;
  esac
  sleep 0.5
}

stop_relay() {
  bench_stop_relay $R fu_bench "${relay_pids[@]}"
  sleep 0.5
}


# Until the tunnel works through the current relay (WireGuard roams to the
# relay's new source port after authenticated data).
wait_tunnel() {
  local end=$((SECONDS + 30))
  while [ $SECONDS -lt $end ]; do
    ip netns exec $A ping -c 1 -W 1 10.77.110.2 >/dev/null 2>&1 && return 0
  done
  echo "tunnel did not come up through $1" >&2
  return 1
}

echo "[" >"$out"
first=1
record() { # record JSON
  if [ $first = 1 ]; then first=0; else echo "," >>"$out"; fi
  echo "$1" >>"$out"
}

for rep in $(seq 1 "$repeats"); do
  for relay in $relays; do
    echo "== repeat $rep: $relay" >&2
    start_relay "$relay"
    wait_tunnel "$relay"
    tcp=$(ip netns exec $A timeout $((secs + 20)) iperf3 -c 10.77.110.2 -t "$secs" -J)
    tcp_mbits=$(jq '.end.sum_received.bits_per_second / 1e6' <<<"$tcp")
    tcp_retr=$(jq '.end.sum_sent.retransmits' <<<"$tcp")
    sleep 1
    # Where UDP loss happens: the relay namespace's receive-buffer drops
    # (ferry, socat) or the WireGuard receiver's (B).
    rbe0=$(bench_rcvbuf_errors $R) bbe0=$(bench_rcvbuf_errors $B)
    udp=$(ip netns exec $A timeout $((secs + 20)) iperf3 -c 10.77.110.2 -u -b 200M -l 1360 -t "$secs" -J)
    udp_mbits=$(jq '.end.sum.bits_per_second / 1e6 * (1 - .end.sum.lost_percent / 100)' <<<"$udp")
    udp_loss=$(jq '.end.sum.lost_percent' <<<"$udp")
    relay_drops=$(($(bench_rcvbuf_errors $R) - rbe0)) receiver_drops=$(($(bench_rcvbuf_errors $B) - bbe0))
    sleep 1
    rps on
    fu_bg $B "$T/sink.log" taskset -c 0 "$load" sink --listen 10.77.12.2:6000 --seconds $((secs + 10))
    sink_pid=$FU_LAST_PID
    sleep 0.3
    load0=$(cut -d' ' -f1 /proc/loadavg)
    busy0=$(core_busy)
    t0=$(date +%s.%N)
    ip netns exec $A taskset -c 0 "$load" send --to 10.77.11.1:5000 --flows 1 --size 1400 --seconds "$secs" >"$T/send.json"
    busy1=$(core_busy)
    t1=$(date +%s.%N)
    wait "$sink_pid" || true
    sink=$(tail -n 1 "$T/sink.log")
    pps=$(jq '.pps' <<<"$sink")
    cores=$(awk -v a="$busy0" -v b="$busy1" -v t0="$t0" -v t1="$t1" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.3f", (b - a) / hz / (t1 - t0) }')
    sent_pps=$(jq '.pps' "$T/send.json")
    # The same with trains of 1400-byte datagrams sent with GSO, the way
    # wireguard-go sends.
    fu_bg $B "$T/sink2.log" taskset -c 0 "$load" sink --listen 10.77.12.2:6000 --seconds $((secs + 10))
    sink_pid=$FU_LAST_PID
    sleep 0.3
    busy0=$(core_busy)
    t0=$(date +%s.%N)
    ip netns exec $A taskset -c 0 "$load" send --to 10.77.11.1:5000 --flows 1 --size 1400 --seconds "$secs" --gso 46 >"$T/send2.json"
    busy1=$(core_busy)
    t1=$(date +%s.%N)
    wait "$sink_pid" || true
    gso_pps=$(tail -n 1 "$T/sink2.log" | jq '.pps')
    gso_cores=$(awk -v a="$busy0" -v b="$busy1" -v t0="$t0" -v t1="$t1" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.3f", (b - a) / hz / (t1 - t0) }')
    load1=$(cut -d' ' -f1 /proc/loadavg)
    rps off
    stop_relay
    line=$(jq -cn --arg relay "$relay" --argjson rep "$rep" --argjson tcp "$tcp_mbits" --argjson retr "$tcp_retr" \
      --argjson udp "$udp_mbits" --argjson loss "$udp_loss" --argjson pps "$pps" --argjson sent "$sent_pps" \
      --argjson cores "$cores" --argjson gpps "$gso_pps" --argjson gcores "$gso_cores" \
      --argjson load0 "$load0" --argjson load1 "$load1" \
      --argjson rdrops "$relay_drops" --argjson bdrops "$receiver_drops" \
      '{relay: $relay, repeat: $rep, tcp_mbits: $tcp, tcp_retransmits: $retr, udp_mbits: $udp, udp_loss_percent: $loss,
        udp_drops_at_relay: $rdrops, udp_drops_at_wireguard_receiver: $bdrops,
        pps_1400: $pps, offered_pps: $sent, relay_core_busy: $cores,
        pps_per_core: (if $cores > 0.05 then ($pps / $cores) else null end),
        gso_pps_1400: $gpps, gso_relay_core_busy: $gcores,
        gso_pps_per_core: (if $gcores > 0.05 then ($gpps / $gcores) else null end),
        loadavg_before: $load0, loadavg_after: $load1}')
    echo "   $line" >&2
    record "$line"
  done
done
echo "]" >>"$out"

# The table: medians over the repeats, with the range.
model=$(lscpu | awk -F: '/Model name/ { gsub(/^ +/, "", $2); print $2; exit }')
echo
echo "UDP relay benchmark, $(date -u +%Y-%m-%d), $model, $cpus CPUs, Linux $(uname -r); $repeats × ${secs}s per relay, interleaved."
echo "WireGuard: wireguard-go $("$(fu_wireguard_go)" --version 2>&1 | awk '{ print $2; exit }') on both ends. Relay process on CPU $relay_cpu; for the pps columns R's receive processing too (RPS), load generator and sink on CPU 0. Medians (min–max)."
echo
echo "| Relay | iperf3 TCP Mbit/s | TCP retransmits | iperf3 UDP Mbit/s received | UDP loss % | pps, 1400 B datagrams | relay core busy | pps per core | pps, 1400 B GSO trains | relay core busy | pps per core |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for relay in $relays; do
  jq -r --arg r "$relay" '
    def med: sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
    def cell(f; fmt): [.[] | select(.relay == $r) | f | select(. != null)] as $v
      | if ($v | length) == 0 then "n/a"
        else "\($v | med | fmt) (\($v | min | fmt)–\($v | max | fmt))" end;
    def i: floor | tostring;
    def p1: . * 10 | floor / 10 | tostring;
    def p2: . * 100 | floor / 100 | tostring;
    "| \($r) | \(cell(.tcp_mbits; i)) | \(cell(.tcp_retransmits; i)) | \(cell(.udp_mbits; i)) | \(cell(.udp_loss_percent; p1)) | \(cell(.pps_1400; i)) | \(cell(.relay_core_busy; p2)) | \(cell(.pps_per_core; i)) | \(cell(.gso_pps_1400; i)) | \(cell(.gso_relay_core_busy; p2)) | \(cell(.gso_pps_per_core; i)) |"
  ' "$out"
done
echo
echo "load average during the samples: $(jq -r '[.[] | .loadavg_before, .loadavg_after] | "\(min)–\(max)"' "$out") (other work on the machine shows here)"
bench_results_finish "$dir" "relay process on CPU $relay_cpu, for the pps columns R's receive processing too (RPS); load generator and sink on CPU 0"
echo "samples: $out; summary.json and results.md in $dir"

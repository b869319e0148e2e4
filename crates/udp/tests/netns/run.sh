#!/usr/bin/env bash
# Stock WireGuard through `ferry udp-relay`, in network namespaces this
# script creates (fu-PID-a, -r, -b, -c; 10.77.0.0/16) and removes again,
# also on failure.
#
#   bounce: A (wireguard-go) -> R (ferry, --target by DNS name) -> B (wireguard-go)
#           ping and iperf3 through the tunnel; the relay restarted during a
#           transfer; A changing its address; the target's DNS name moving.
#   hub:    A, B, C (wireguard-go, configured with `wg`) all using R as the
#           endpoint of each other; ping between every pair, iperf3, and C
#           changing its address.
#
# Needs root, ip, wg, wireguard-go, iperf3, ping. Without them it says why
# and exits 0 (skipped). FERRY_BIN names the ferry binary (default:
# target/debug/ferry). With FU_WG=kernel every peer is the kernel's
# WireGuard module instead of wireguard-go (scripts/test.d/55-vm.sh runs it
# so in the kernel test VM).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../../.." && pwd)
. "$root/scripts/lib/netns.sh"

why=$(fu_why_not wg iperf3 ping timeout)
if [ -z "$why" ] && [ "${FU_WG:-}" != kernel ] && ! fu_wireguard_go >/dev/null; then why="wireguard-go not found (go install golang.zx2c4.com/wireguard@latest)"; fi
fu_skip_or_fail "UDP namespace tests" "$why"
ferry=$(fu_ferry_bin "$root")

fu_init
T=$FU_TMP
# This run's namespaces and WireGuard interface prefix (scripts/lib/netns.sh: names
# outside a namespace carry the pid, so two runs on one host do not meet).
A=fu-$FU_RUN-a R=fu-$FU_RUN-r B=fu-$FU_RUN-b C=fu-$FU_RUN-c W=fu$FU_RUN
# Bulk TCP through the tunnel must reach this rate. In an emulated VM
# (scripts/test.d/55-vm.sh without KVM) every packet costs far more, so
# FU_MIN_MBITS lowers it there.
min_mbits=${FU_MIN_MBITS:-20}
# The transfer across a relay restart must be moving again in its last 3
# seconds; where the restart itself takes seconds (emulation), TCP's
# retransmission back-off needs a longer transfer (FU_RESTART_SECS).
restart_secs=${FU_RESTART_SECS:-10}
started=$SECONDS
relay_pid=""
cleanup() {
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "--- FAILED (exit $rc); relay log:" >&2
    tail -n 40 "$T"/relay*.log >&2 2>/dev/null || true
    for ns in $A $B $C; do ip netns exec "$ns" wg show >&2 2>/dev/null || true; done
  fi
  rm -rf /etc/netns/$R
  fu_cleanup
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step() { echo "== [$((SECONDS - started))s] $*"; }
check() { # check DESCRIPTION COMMAND...: runs a check, says what failed
  if ! "${@:2}"; then echo "FAIL: $1" >&2; return 1; fi
  echo "   ok: $1"
}

metrics() { # prints the relay's metrics (fetched inside $R)
  ip netns exec $R timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/9101; printf "GET /metrics HTTP/1.0\r\n\r\n" >&3; cat <&3'
}
metric() { # metric 'NAME{labels}' -> value; a series that is not there is an error
  local scrape v
  scrape=$(metrics) || { echo "FAIL: no scrape of the relay's metrics" >&2; return 1; }
  v=$(awk -v k="$1" '$1 == k { print $2; exit }' <<<"$scrape")
  [ -n "$v" ] || { echo "FAIL: the relay exports no $1" >&2; return 1; }
  echo "$v"
}

start_relay() { # start_relay LOGNAME ARGS...
  local log=$1; shift
  fu_bg $R "$T/$log.log" env FERRY_LOG=info "$ferry" udp-relay --metrics-addr 127.0.0.1:9101 --workers 2 "$@"
  relay_pid=$FU_LAST_PID
  local i
  for i in $(seq 1 50); do
    if metrics >/dev/null 2>&1; then return 0; fi
    kill -0 "$relay_pid" 2>/dev/null || { cat "$T/$log.log" >&2; return 1; }
    sleep 0.1
  done
  echo "relay did not come up" >&2; cat "$T/$log.log" >&2; return 1
}

ping_ok() { # ping_ok NS DST: 5 pings, at least 4 answered
  local got
  got=$(ip netns exec "$1" ping -c 5 -i 0.2 -W 2 "$2" | awk '/received/ { print $4 }')
  [ "${got:-0}" -ge 4 ]
}

ping_until() { # ping_until NS DST SECONDS: until one ping answers
  local end=$((SECONDS + $3))
  while [ $SECONDS -lt $end ]; do
    ip netns exec "$1" ping -c 1 -W 1 "$2" >/dev/null 2>&1 && return 0
  done
  return 1
}

iperf_mbits() { # iperf_mbits NS SERVER SECONDS [extra args]: receiver Mbit/s
  ip netns exec "$1" timeout $(($3 + 15)) iperf3 -c "$2" -t "$3" -f m "${@:4}" 2>&1 |
    awk '/receiver/ { for (i = 1; i <= NF; i++) if ($i == "Mbits/sec") print $(i-1) }' | tail -n 1
}

# ---------------------------------------------------------------- topology
step "namespaces (WireGuard peers: ${FU_WG:-wireguard-go})"
fu_ns $A $R $B $C
fu_link $A 10.77.1.2/24 $R 10.77.1.1/24
fu_link $B 10.77.2.2/24 $R 10.77.2.1/24
fu_link $C 10.77.3.2/24 $R 10.77.3.1/24
# B's second address, where its DNS name will move.
ip -n $B addr add 10.77.4.2/24 dev vb-r
ip -n $R addr add 10.77.4.1/24 dev vr-b
ip netns exec $R sysctl -qw net.ipv4.ip_forward=0
mkdir -p /etc/netns/$R
printf '127.0.0.1 localhost\n10.77.2.2 fu-server.test\n' >/etc/netns/$R/hosts
for n in a b c; do fu_key "$n"; done

# ------------------------------------------------------------------ bounce
step "bounce: A -> relay -> B"
start_relay relay-bounce --listen 10.77.1.1:51820 --target fu-server.test:51820 --resolve-interval 1s
fu_wg $A ${W}bna "$T/a.key" 51820 10.77.100.1/24
fu_wg $B ${W}bnb "$T/b.key" 51820 10.77.100.2/24
fu_wg_peer $B ${W}bnb "$(fu_pub a)" 10.77.100.1/32
fu_wg_peer $A ${W}bna "$(fu_pub b)" 10.77.100.2/32 10.77.1.1:51820
fu_wait_handshake $A ${W}bna 20
check "ping A -> B through the bounce" ping_ok $A 10.77.100.2
ep=$(ip netns exec $B wg show ${W}bnb endpoints | awk '{ print $2 }')
check "B sees the relay ($ep), not A" bash -c "[[ '$ep' == 10.77.2.1:* ]]"

fu_bg $B "$T/iperf-b.log" iperf3 -s -B 10.77.100.2
sleep 0.5
mbits=$(iperf_mbits $A 10.77.100.2 3)
check "iperf3 TCP through the bounce: ${mbits:-0} Mbit/s (> $min_mbits)" awk -v m="${mbits:-0}" -v min="$min_mbits" 'BEGIN { exit !(m > min) }'

step "bounce: relay restart during a transfer"
ip netns exec $A timeout $((restart_secs + 20)) iperf3 -c 10.77.100.2 -t "$restart_secs" -i 1 -f m >"$T/iperf-restart.log" 2>&1 &
iperf_pid=$!
sleep 2
fu_stop "$relay_pid"
sleep 1
start_relay relay-bounce2 --listen 10.77.1.1:51820 --target fu-server.test:51820 --resolve-interval 1s
wait "$iperf_pid" || { cat "$T/iperf-restart.log" >&2; false; }
late=$(awk -v from=$((restart_secs - 3)) '/sec/ && !/sender|receiver/ { split($3, t, "-"); if (t[1] + 0 >= from) print $7 }' "$T/iperf-restart.log" | sort -n | tail -n 1)
check "the transfer carried on after the restart (last seconds: ${late:-0} Mbit/s)" awk -v m="${late:-0}" 'BEGIN { exit !(m > 1) }'

step "bounce: A changes its address"
ip netns exec $A wg set ${W}bna listen-port 51999
check "ping after A moved" ping_until $A 10.77.100.2 10
check "ping A -> B after the move" ping_ok $A 10.77.100.2
check "the move made a new session" test "$(metric ferry_udp_sessions_opened_total)" -ge 2

step "bounce: the target's DNS name moves"
# B's address changes (the old one goes away) and its name follows.
ip -n $B addr del 10.77.2.2/24 dev vb-r
printf '127.0.0.1 localhost\n10.77.4.2 fu-server.test\n' >/etc/netns/$R/hosts
end=$((SECONDS + 10))
until [ "$(metric ferry_udp_target_changes_total)" -ge 1 ] || [ $SECONDS -ge $end ]; do sleep 0.2; done
check "the relay noticed the move" test "$(metric ferry_udp_target_changes_total)" -ge 1
check "ping after the move" ping_until $A 10.77.100.2 10
check "ping A -> B via the new address" ping_ok $A 10.77.100.2
ep=$(ip netns exec $B wg show ${W}bnb endpoints | awk '{ print $2 }')
check "B now hears the relay from its new side ($ep)" bash -c "[[ '$ep' == 10.77.4.1:* ]]"
check "sessions moved, none rebuilt" test "$(metric ferry_udp_sessions_retargeted_total)" -ge 1
echo "   kernel UDP receive-buffer errors in $R: $(metric 'ferry_udp_kernel_udp_errors_total{counter="RcvbufErrors"}')"
fu_stop "$relay_pid"
ip -n $A link del ${W}bna; ip -n $B link del ${W}bnb

# --------------------------------------------------------------------- hub
step "hub: A, B, C through one relay"
start_relay relay-hub --listen :51830 --peer "a=$(fu_pub a)" --peer "b=$(fu_pub b)" --peer "c=$(fu_pub c)"
# Each peer reaches the hub at R's address on its own link (B's moved).
declare -A link=([a]=10.77.1.1 [b]=10.77.4.1 [c]=10.77.3.1) tun=([a]=10.77.200.1 [b]=10.77.200.2 [c]=10.77.200.3)
for n in a b c; do fu_wg "fu-$FU_RUN-$n" "${W}hub$n" "$T/$n.key" 51830 "${tun[$n]}/24"; done
for n in a b c; do
  for m in a b c; do
    [ "$n" = "$m" ] || fu_wg_peer "fu-$FU_RUN-$n" "${W}hub$n" "$(fu_pub "$m")" "${tun[$m]}/32" "${link[$n]}:51830"
  done
done
for n in a b c; do fu_wait_handshake "fu-$FU_RUN-$n" "${W}hub$n" 30; done
check "ping A -> B" ping_ok $A 10.77.200.2
check "ping A -> C" ping_ok $A 10.77.200.3
check "ping B -> C" ping_ok $B 10.77.200.3
check "ping C -> A" ping_ok $C 10.77.200.1
fu_bg $C "$T/iperf-c.log" iperf3 -s -B 10.77.200.3
sleep 0.5
mbits=$(iperf_mbits $A 10.77.200.3 3)
check "iperf3 TCP A -> C through the hub: ${mbits:-0} Mbit/s (> $min_mbits)" awk -v m="${mbits:-0}" -v min="$min_mbits" 'BEGIN { exit !(m > min) }'

step "hub: C changes its address"
ip netns exec $C wg set ${W}hubc listen-port 51999
check "ping A -> C after C moved" ping_until $A 10.77.200.3 10
check "ping A -> C" ping_ok $A 10.77.200.3
check "ping B -> C" ping_ok $B 10.77.200.3
check "the hub forwarded by index" test "$(metric 'ferry_udp_packets_total{mode="hub",direction="out"}')" -gt 1000
check "nothing dropped as malformed" test "$(metric 'ferry_udp_drops_total{reason="not_wireguard"}')" -eq 0
# For the record only: a scrape that times out on a loaded machine fails nothing.
{ metrics | grep -E '^ferry_udp_(drops_total|hub_messages_total|hub_known_peers|socket_drops_total|kernel_udp_errors_total)' | awk '$2 != 0 { print "   " $0 }'; } || true

step "all UDP relay namespace tests passed in $((SECONDS - started)) s"

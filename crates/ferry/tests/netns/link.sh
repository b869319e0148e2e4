#!/usr/bin/env bash
# Stock WireGuard over `ferry link` (DERP path), in network namespaces this
# script creates (fu-la, fu-lb, fu-lr; 10.77.11.0/24, 10.77.12.0/24,
# 10.77.110.0/24) and removes again, also on failure:
#
#   fu-la: wireguard-go (fulka) + ferry link ──TCP──┐
#                                                     fu-lr: the relay (Ferry, then derper) on :3340
#   fu-lb: wireguard-go (fulkb) + ferry link ──TCP──┘
#
# nftables in fu-la and fu-lb lets out only TCP to the relay's DERP port
# (besides loopback and the tunnel itself), so UDP between the peers cannot pass; each WireGuard's
# endpoint for the other is its local `ferry link` on 127.0.0.1:51001.
# For each relay: ping and a short iperf3 TCP run through the tunnel, the
# link's counters, `ferry link status`; with Ferry, also a relay restart
# during an iperf3 transfer that the TCP connection inside the tunnel
# survives. Prints the figures measured.
#
# Needs root, ip, nft, wg, wireguard-go, iperf3, ping and derper
# (FERRY_DERPER_BIN, interop/bin/derper or ~/go/bin/derper; built by
# .ci/setup.d/21-derper.sh). Without them it says why and exits 0, except
# under CI=true, where it fails. FERRY_BIN names the ferry binary. With
# FU_WG=kernel both peers are the kernel's WireGuard instead of
# wireguard-go, and FU_MIN_MBITS / FU_MIN_DATAGRAMS / FU_RESTART_SECS lower
# the rate and datagram count asked of the iperf3 runs and lengthen the
# transfer across the restart (as in crates/udp/tests/netns/run.sh;
# scripts/vm/guest.sh sets them in the emulated kernel test VM).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../../.." && pwd)
. "$root/crates/udp/tests/netns/lib.sh"

derper=""
for c in "${FERRY_DERPER_BIN:-}" "$root/interop/bin/derper" "$HOME/go/bin/derper"; do
  [ -n "$c" ] && [ -x "$c" ] && { derper=$c; break; }
done
why=$(fu_why_not wg nft iperf3 ping timeout)
if [ -z "$why" ] && [ "${FU_WG:-}" != kernel ] && ! fu_wireguard_go >/dev/null; then why="wireguard-go not found (go install golang.zx2c4.com/wireguard@latest)"; fi
if [ -z "$why" ] && [ -z "$derper" ]; then why="derper not found (.ci/setup.d/21-derper.sh builds interop/bin/derper, or set FERRY_DERPER_BIN)"; fi
fu_skip_or_fail "ferry link namespace tests" "$why"
ferry=$(fu_ferry_bin "$root")

fu_init
T=$FU_TMP
min_mbits=${FU_MIN_MBITS:-5} late_mbits=${FU_MIN_MBITS:-1} min_datagrams=${FU_MIN_DATAGRAMS:-1000}
restart_secs=${FU_RESTART_SECS:-10}
started=$SECONDS
cleanup() {
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "--- FAILED (exit $rc); logs:" >&2
    for f in "$T"/link-*.log "$T"/relay-*.log; do [ -f "$f" ] && { echo "-- $f" >&2; tail -n 30 "$f" >&2; }; done
    for ns in fu-la fu-lb; do ip netns exec "$ns" wg show >&2 2>/dev/null || true; done
  fi
  fu_cleanup
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step() { echo "== [$((SECONDS - started))s] $*"; }
check() { # check DESCRIPTION COMMAND...
  if ! "${@:2}"; then echo "FAIL: $1" >&2; return 1; fi
  echo "   ok: $1"
}
metrics() { # metrics NS: the link's metrics there
  ip netns exec "$1" timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/9102; printf "GET /metrics HTTP/1.0\r\n\r\n" >&3; cat <&3'
}
metric() { # metric NS 'NAME{labels}' -> value (0 when absent)
  metrics "$1" | awk -v k="$2" '$1 == k { print $2; found=1 } END { if (!found) print 0 }'
}
wait_tcp() { # wait_tcp NS ADDR PORT SECONDS
  local end=$((SECONDS + $4))
  until ip netns exec "$1" timeout 1 bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null; do
    [ $SECONDS -lt $end ] || { echo "nothing listening on $2:$3 in $1 after $4 s" >&2; return 1; }
    sleep 0.1
  done
}
wait_log() { # wait_log FILE TEXT SECONDS
  local end=$((SECONDS + $3))
  until grep -q "$2" "$1" 2>/dev/null; do
    [ $SECONDS -lt $end ] || { echo "no \"$2\" in $1 after $3 s" >&2; cat "$1" >&2; return 1; }
    sleep 0.1
  done
}
ping_until() { # ping_until NS DST SECONDS: until one ping answers
  local end=$((SECONDS + $3))
  while [ $SECONDS -lt $end ]; do
    ip netns exec "$1" ping -c 1 -W 1 "$2" >/dev/null 2>&1 && return 0
  done
  return 1
}

# ---------------------------------------------------------------- topology
step "namespaces: fu-la and fu-lb reach only TCP 3340 on the relay in fu-lr"
fu_ns fu-la fu-lb fu-lr
fu_link fu-la 10.77.11.2/24 fu-lr 10.77.11.1/24
fu_link fu-lb 10.77.12.2/24 fu-lr 10.77.12.1/24
# Routed through fu-lr, so without the firewall the peers could talk UDP.
ip netns exec fu-lr sysctl -qw net.ipv4.ip_forward=1
fu_route fu-la 10.77.12.0/24 10.77.11.1
fu_route fu-lb 10.77.11.0/24 10.77.12.1
for n in a b; do
  relay_ip=10.77.1$([ $n = a ] && echo 1 || echo 2).1
  ip netns exec "fu-l$n" nft -f - <<NFT
table inet link {
  chain out {
    type filter hook output priority 0; policy drop;
    oifname "lo" accept
    oifname "fulk$n" accept
    ip daddr $relay_ip tcp dport 3340 accept
    counter drop comment "blocked"
  }
  chain in {
    type filter hook input priority 0; policy drop;
    iifname "lo" accept
    iifname "fulk$n" accept
    ct state established,related accept
    counter drop
  }
}
NFT
done
blocked() { ip netns exec "$1" nft list chain inet link out | awk '/blocked/ { for (i = 1; i <= NF; i++) if ($i == "packets") print $(i+1) }'; }
before=$(blocked fu-la)
ip netns exec fu-la bash -c 'echo probe >/dev/udp/10.77.12.2/51820' 2>/dev/null || true
check "UDP from fu-la to fu-lb is dropped by nftables" test "$(blocked fu-la)" -gt "$before"

step "WireGuard (${FU_WG:-wireguard-go}) on both sides; each one's endpoint for the other is its ferry link"
for n in a b; do fu_key "wg$n"; done
fu_wg fu-la fulka "$T/wga.key" 51820 10.77.110.1/24
fu_wg fu-lb fulkb "$T/wgb.key" 51820 10.77.110.2/24
fu_wg_peer fu-la fulka "$(fu_pub wgb)" 10.77.110.2/32 127.0.0.1:51001
fu_wg_peer fu-lb fulkb "$(fu_pub wga)" 10.77.110.1/32 127.0.0.1:51001

# Link keys: `ferry link pubkey` with a file holding only key_file.
for n in a b; do
  printf 'key_file = "%s"\n' "$T/link-$n.key" >"$T/link-$n.toml"
  "$ferry" link pubkey --config "$T/link-$n.toml" >"$T/link-$n.pub" 2>/dev/null
  check "link key of $n is 0600" test "$(stat -c %a "$T/link-$n.key")" = 600
done
write_link_config() { # write_link_config SIDE RELAY_IP OTHER
  cat >"$T/link-$1.toml" <<TOML
key_file = "$T/link-$1.key"
wireguard = "127.0.0.1:51820"
metrics_addr = "127.0.0.1:9102"

[[relay]]
name = "r"
url = "http://$2:3340/derp"

[[peer]]
name = "$3"
link_key = "$(cat "$T/link-$3.pub")"
endpoint = "127.0.0.1:51001"
TOML
}
write_link_config a 10.77.11.1 b
write_link_config b 10.77.12.1 a

iperf_run() { # iperf_run NS SERVER SECONDS: "Mbit/s retransmits" (receiver's rate, sender's retransmits)
  ip netns exec "$1" timeout $(($3 + 15)) iperf3 -c "$2" -t "$3" -f m |
    awk '/sender/ { for (i = 1; i <= NF; i++) if ($i == "Mbits/sec") r = $(i+1) }
         /receiver/ { for (i = 1; i <= NF; i++) if ($i == "Mbits/sec") m = $(i-1) }
         END { print m, r }'
}

fu_bg fu-lb "$T/iperf-server.log" iperf3 -s -B 10.77.110.2
results=()
run_case() { # run_case NAME COMMAND...: the relay in fu-lr, then the links, then traffic
  local name=$1; shift
  step "$name: relay, links, WireGuard through DERP"
  fu_bg fu-lr "$T/relay-$name.log" "$@"
  local relay_pid=$FU_LAST_PID
  wait_tcp fu-lr 127.0.0.1 3340 20
  fu_bg fu-la "$T/link-a-$name.log" "$ferry" link --config "$T/link-a.toml"
  local la=$FU_LAST_PID
  fu_bg fu-lb "$T/link-b-$name.log" "$ferry" link --config "$T/link-b.toml"
  local lb=$FU_LAST_PID
  wait_log "$T/link-a-$name.log" "relay connected" 20
  wait_log "$T/link-b-$name.log" "relay connected" 20
  # wireguard-go retries its handshake every 5 s.
  check "$name: first ping through the tunnel within 30 s" ping_until fu-la 10.77.110.2 30
  local rtt loss
  read -r loss rtt < <(ip netns exec fu-la ping -c 20 -i 0.2 -W 2 10.77.110.2 |
    awk '/packet loss/ { for (i = 1; i <= NF; i++) if ($i == "packet") l = $(i-1) } /^rtt/ { split($4, v, "/"); r = v[2] } END { print l, r }')
  check "$name: 20 pings A -> B, loss $loss, average RTT $rtt ms" test "${loss%\%}" -le 10
  check "$name: B answers pings too" ping_until fu-lb 10.77.110.1 10
  local ep
  ep=$(ip netns exec fu-lb wg show fulkb endpoints | awk '{ print $2 }')
  check "$name: B's WireGuard sees A at its link (127.0.0.1:51001), got $ep" test "$ep" = 127.0.0.1:51001
  local mbits retr
  read -r mbits retr < <(iperf_run fu-la 10.77.110.2 3)
  check "$name: iperf3 TCP A -> B through WireGuard over DERP: $mbits Mbit/s, $retr retransmits" awk -v m="${mbits:-0}" -v min="$min_mbits" 'BEGIN { exit !(m > min) }'
  local sent
  sent=$(metric fu-la 'ferry_link_peer_packets_total{peer="b",direction="to_peer",path="derp"}')
  check "$name: A's link carried $sent datagrams to B" test "$sent" -gt "$min_datagrams"
  check "$name: B's link took them from the relay" test "$(metric fu-lb 'ferry_link_peer_packets_total{peer="a",direction="from_peer",path="derp"}')" -gt "$min_datagrams"
  check "$name: no packets from unknown link keys" test "$(metric fu-la 'ferry_link_unknown_sender_drops_total{relay="r"}')" -eq 0
  echo "   ferry link status in fu-la:"
  ip netns exec fu-la "$ferry" link status --config "$T/link-a.toml" | sed 's/^/     /'
  results+=("$name: ping avg ${rtt} ms (loss $loss), iperf3 TCP ${mbits} Mbit/s with ${retr} retransmits (3 s)")
  if [ -n "${RESTART:-}" ]; then
    step "$name: the relay restarts during an iperf3 transfer"
    ip netns exec fu-la timeout $((restart_secs + 30)) iperf3 -c 10.77.110.2 -t "$restart_secs" -i 1 -f m >"$T/iperf-restart.log" 2>&1 &
    local iperf_pid=$!
    sleep 2
    fu_stop "$relay_pid"
    wait_log "$T/link-a-$name.log" "relay connection lost" 10
    fu_bg fu-lr "$T/relay-$name-2.log" "$@"
    relay_pid=$FU_LAST_PID
    wait "$iperf_pid" || { cat "$T/iperf-restart.log" >&2; false; }
    check "$name: both links reconnected" test "$(grep -c 'relay connected' "$T/link-a-$name.log")$(grep -c 'relay connected' "$T/link-b-$name.log")" = 22
    local late
    late=$(awk -v last=$((restart_secs - 3)) '/sec/ && !/sender|receiver/ { split($3, t, "-"); if (t[1] + 0 >= last) print $7 }' "$T/iperf-restart.log" | sort -n | tail -n 1)
    check "$name: the TCP transfer inside the tunnel carried on (last seconds: ${late:-0} Mbit/s)" awk -v m="${late:-0}" -v min="$late_mbits" 'BEGIN { exit !(m > min) }'
    echo "   iperf3 Mbit/s per second across the restart: $(awk '/sec/ && !/sender|receiver/ { printf "%s ", $7 }' "$T/iperf-restart.log")"
    echo "   relay_down drops at A during the restart: $(metric fu-la 'ferry_link_peer_drops_total{peer="b",reason="relay_down"}')"
  fi
  fu_stop "$la"; fu_stop "$lb"; fu_stop "$relay_pid"
}

RESTART=1 run_case ferry "$ferry" -a :3340 --stun=false -c "$T/relay-ferry.key"
run_case derper "$derper" -a :3340 -http-port -1 -stun=false -c "$T/relay-derper.key"

step "all ferry link namespace tests passed in $((SECONDS - started)) s"
for r in "${results[@]}"; do echo "   $r"; done

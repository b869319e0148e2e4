#!/usr/bin/env bash
# Stock WireGuard over `ferry link`, in network namespaces this script
# creates (fu-PID-la, -lb, -lr, PID this run's; 10.77.11.0/24,
# 10.77.12.0/24, 10.77.110.0/24) and removes again, also on failure:
#
#   la: wireguard-go (fuPIDlka) + ferry link ──┐
#                                                lr: router + the relay (Ferry or derper): DERP :3340, STUN :3478
#   lb: wireguard-go (fuPIDlkb) + ferry link ──┘
#
# lr routes between the peers, so without a firewall they could talk
# UDP directly. nftables in la and lb decides which paths exist, one
# firewall mode per case (`firewall`): "derp" lets out only TCP to the
# relay's DERP port, "relay" also UDP to the relay, "direct" also UDP to
# the other peer (loopback and the tunnel itself always pass). Each
# WireGuard's endpoint for the other is its local `ferry link` on
# 127.0.0.1:51001. The path a link uses is read from `ferry link status
# --json`; gaps and resets of a TCP transfer from iperf3's JSON (0.1 s
# intervals).
#
# The cases; LINK_CASES picks them (default: those whose paths
# are built):
#   ferry-derp     (a) only TCP to the relay: DERP; ping, iperf3, counters,
#                  status, and a relay restart during a transfer
#   derper-derp    (a) the same against Tailscale's derper (no restart)
#   ferry-relay-session (b) UDP to the relay, not between the peers: relay session
#   ferry-direct   (c) everything allowed: direct
#   derper-direct  (c) against derper: direct
#   ferry-failover (d) during one iperf3 transfer, direct is cut (-> relay
#                  session), then the relay's UDP (-> DERP): each switch
#                  within 2 s, the transfer's longest gap under 2 s, no reset
#   ferry-upgrade  (e) from DERP, the firewall opens: relay session, then
#                  direct, each within 10 s of being allowed
# FU_WG=kernel uses the kernel's WireGuard instead of wireguard-go (the VM).
#
# Needs root, ip, nft, wg, wireguard-go, iperf3, ping, jq and derper
# (FERRY_DERPER_BIN, interop/bin/derper or ~/go/bin/derper; built by
# .ci/setup.d/10-derper.sh). Without them it says why and exits 0, except
# under CI=true, where it fails. FERRY_BIN names the ferry binary.
# FU_MIN_MBITS / FU_MIN_DATAGRAMS / FU_RESTART_SECS lower the rate and
# datagram count asked of the iperf3 runs and lengthen the transfer across
# the restart (as in crates/udp/tests/netns/run.sh; scripts/vm/guest.sh sets
# them in the emulated kernel test VM).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../../.." && pwd)
. "$root/scripts/lib/netns.sh"
. "$root/scripts/lib/netns-link.sh"

link_prereqs "ferry link namespace tests"
ferry=$(fu_ferry_bin "$root")

cases=${LINK_CASES:-ferry-derp derper-derp ferry-relay-session ferry-direct derper-direct ferry-failover ferry-upgrade}
for c in $cases; do
  case " ferry-derp derper-derp ferry-relay-session ferry-direct derper-direct ferry-failover ferry-upgrade " in
    *" $c "*) ;; *) echo "unknown case $c in LINK_CASES" >&2; exit 2 ;;
  esac
done

fu_init
T=$FU_TMP
# This run's namespaces and WireGuard interface prefix (scripts/lib/netns.sh: names
# outside a namespace carry the pid, so two runs on one host do not meet).
LA=fu-$FU_RUN-la LB=fu-$FU_RUN-lb LR=fu-$FU_RUN-lr W=fu$FU_RUN
LK_STARTED=$SECONDS
min_mbits=${FU_MIN_MBITS:-5} late_mbits=${FU_MIN_MBITS:-1} min_datagrams=${FU_MIN_DATAGRAMS:-1000}
restart_secs=${FU_RESTART_SECS:-10}
cleanup() {
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "--- FAILED (exit $rc); logs:" >&2
    for f in "$T"/link-*.log "$T"/relay-*.log; do [ -f "$f" ] && { echo "-- $f" >&2; tail -n 30 "$f" >&2; }; done
    for ns in $LA $LB; do ip netns exec "$ns" wg show >&2 2>/dev/null || true; done
  fi
  fu_cleanup
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- topology
step "namespaces: $LA and $LB routed through $LR"
fu_ns $LA $LB $LR
fu_link $LA 10.77.11.2/24 $LR 10.77.11.1/24
fu_link $LB 10.77.12.2/24 $LR 10.77.12.1/24
ip netns exec $LR sysctl -qw net.ipv4.ip_forward=1
fu_route $LA 10.77.12.0/24 10.77.11.1
fu_route $LB 10.77.11.0/24 10.77.12.1

# firewall MODE: the paths that exist. derp: TCP to the relay's DERP port
# only; relay: also UDP to the relay (STUN, relay sessions); direct: also
# UDP between the peers, both ways (no hole punching needed). Replaced
# atomically (one nft transaction).
firewall() {
  local n relay_ip other udp_relay udp_peer
  for n in a b; do
    relay_ip=10.77.1$([ $n = a ] && echo 1 || echo 2).1
    other=10.77.1$([ $n = a ] && echo 2 || echo 1).2
    udp_relay="# no UDP to the relay"; udp_peer="# no UDP to the peer"; udp_peer_in="# nor from it"
    case $1 in
      derp) ;;
      relay) udp_relay="ip daddr $relay_ip meta l4proto udp accept" ;;
      direct) udp_relay="ip daddr $relay_ip meta l4proto udp accept"; udp_peer="ip daddr $other meta l4proto udp accept"
        udp_peer_in="ip saddr $other meta l4proto udp accept" ;;
      *) echo "firewall: unknown mode $1" >&2; return 1 ;;
    esac
    nft_table "fu-$FU_RUN-l$n" link <<NFT
  chain out {
    type filter hook output priority 0; policy drop;
    oifname "lo" accept
    oifname "${W}lk$n" accept
    ip daddr $relay_ip tcp dport 3340 accept
    $udp_relay
    $udp_peer
    counter drop comment "blocked"
  }
  chain in {
    type filter hook input priority 0; policy drop;
    iifname "lo" accept
    iifname "${W}lk$n" accept
    ct state established,related accept
    $udp_peer_in
    counter drop
  }
NFT
  done
}
blocked() { ip netns exec "$1" nft list chain inet link out | awk '/blocked/ { for (i = 1; i <= NF; i++) if ($i == "packets") print $(i+1) }'; }
firewall derp
before=$(blocked $LA)
ip netns exec $LA bash -c 'echo probe >/dev/udp/10.77.12.2/51820' 2>/dev/null || true
check "firewall derp: UDP from $LA to $LB is dropped by nftables" test "$(blocked $LA)" -gt "$before"

step "WireGuard (${FU_WG:-wireguard-go}) on both sides; each one's endpoint for the other is its ferry link"
for n in a b; do fu_key "wg$n"; done
fu_wg $LA ${W}lka "$T/wga.key" 51820 10.77.110.1/24
fu_wg $LB ${W}lkb "$T/wgb.key" 51820 10.77.110.2/24
fu_wg_peer $LA ${W}lka "$(fu_pub wgb)" 10.77.110.2/32 127.0.0.1:51001
fu_wg_peer $LB ${W}lkb "$(fu_pub wga)" 10.77.110.1/32 127.0.0.1:51001

# Link keys: `ferry link pubkey` with a file holding only key_file.
for n in a b; do
  printf 'key_file = "%s"\n' "$T/link-$n.key" >"$T/link-$n.toml"
  "$ferry" link pubkey --config "$T/link-$n.toml" >"$T/link-$n.pub" 2>/dev/null
  check "link key of $n is 0600" test "$(stat -c %a "$T/link-$n.key")" = 600
done
write_link_config() { # write_link_config SIDE RELAY_IP OTHER OWN_IP
  cat >"$T/link-$1.toml" <<TOML
key_file = "$T/link-$1.key"
wireguard = "127.0.0.1:51820"
metrics_addr = "127.0.0.1:9102"
bind = "$4:0"

[[relay]]
name = "r"
url = "http://$2:3340/derp"

[[peer]]
name = "$3"
link_key = "$(cat "$T/link-$3.pub")"
endpoint = "127.0.0.1:51001"
TOML
}
write_link_config a 10.77.11.1 b 10.77.11.2
write_link_config b 10.77.12.1 a 10.77.12.2

fu_bg $LB "$T/iperf-server.log" iperf3 -s -B 10.77.110.2
results=()

# ------------------------------------------------------------ one setup
relay_pid="" la="" lb="" relay_cmd=()
relay_start() { # relay_start NAME: the relay of kind NAME (ferry, derper) in $LR
  case $1 in
    ferry) relay_cmd=("$ferry" -a :3340 --stun-port 3478 -c "$T/relay-ferry.key" --relay-port 3341) ;;
    derper) relay_cmd=("$derper" -a :3340 -http-port -1 -stun-port 3478 -c "$T/relay-derper.key") ;;
  esac
  fu_bg $LR "$T/relay-$CASE.log" "${relay_cmd[@]}"
  relay_pid=$FU_LAST_PID
  wait_tcp $LR 127.0.0.1 3340 20
}
links_start() { # both links, connected to the relay, and a first ping through the tunnel
  fu_bg $LA "$T/link-a-$CASE.log" "$ferry" link --config "$T/link-a.toml"
  la=$FU_LAST_PID
  fu_bg $LB "$T/link-b-$CASE.log" "$ferry" link --config "$T/link-b.toml"
  lb=$FU_LAST_PID
  wait_log "$T/link-a-$CASE.log" "relay connected" 20
  wait_log "$T/link-b-$CASE.log" "relay connected" 20
  # wireguard-go retries its handshake every 5 s.
  check "$CASE: first ping through the tunnel within 30 s" ping_until $LA 10.77.110.2 30
}
all_stop() { fu_stop "$la"; fu_stop "$lb"; fu_stop "$relay_pid"; }
a_path() { link_path $LA "$T/link-a.toml" b; }
b_path() { link_path $LB "$T/link-b.toml" a; }

# traffic PATH: ping and a short iperf3 TCP run through the tunnel, both
# links on PATH before and after, and the datagrams counted on PATH.
traffic() {
  local path=$1 rtt loss
  check "$CASE: A's link to B on $path" on_path $LA "$T/link-a.toml" b "$path" 15
  check "$CASE: B's link to A on $path" on_path $LB "$T/link-b.toml" a "$path" 15
  read -r loss rtt < <(ip netns exec $LA ping -c 20 -i 0.2 -W 2 10.77.110.2 |
    awk '/packet loss/ { for (i = 1; i <= NF; i++) if ($i == "packet") l = $(i-1) } /^rtt/ { split($4, v, "/"); r = v[2] } END { print l, r }')
  check "$CASE: 20 pings A -> B, loss $loss, average RTT $rtt ms" test "${loss%\%}" -le 10
  check "$CASE: B answers pings too" ping_until $LB 10.77.110.1 10
  local ep
  ep=$(ip netns exec $LB wg show ${W}lkb endpoints | awk '{ print $2 }')
  check "$CASE: B's WireGuard sees A at its link (127.0.0.1:51001), got $ep" test "$ep" = 127.0.0.1:51001
  local mbits retr
  iperf_json $LA 10.77.110.2 3 "$T/iperf-$CASE.json"
  read -r mbits retr < <(iperf_summary "$T/iperf-$CASE.json")
  check "$CASE: iperf3 TCP A -> B through WireGuard over $path: $mbits Mbit/s, $retr retransmits" awk -v m="${mbits:-0}" -v min="$min_mbits" 'BEGIN { exit !(m > min) }'
  local sent
  sent=$(metric $LA "ferry_link_peer_packets_total{peer=\"b\",direction=\"to_peer\",path=\"$path\"}")
  check "$CASE: A's link carried $sent datagrams to B on $path" test "$sent" -gt "$min_datagrams"
  check "$CASE: B's link took them from $path" test "$(metric $LB "ferry_link_peer_packets_total{peer=\"a\",direction=\"from_peer\",path=\"$path\"}")" -gt "$min_datagrams"
  check "$CASE: still on $path afterwards (A, B)" test "$(a_path) $(b_path)" = "$path $path"
  check "$CASE: nothing from strangers or unparsable dropped (ferry_link_rejected_total)" test "$(metric $LA ferry_link_rejected_total)" -eq 0
  echo "   ferry link status in $LA:"
  ip netns exec $LA "$ferry" link status --config "$T/link-a.toml" | sed 's/^/     /'
  results+=("$CASE: path $path, ping avg ${rtt} ms (loss $loss), iperf3 TCP ${mbits} Mbit/s with ${retr} retransmits (3 s)")
}

# ----------------------------------------------------------------- cases
case_ferry_derp() {
  firewall derp; relay_start ferry; links_start
  traffic derp
  step "$CASE: the relay restarts during an iperf3 transfer"
  iperf_json $LA 10.77.110.2 "$restart_secs" "$T/iperf-restart.json" &
  local iperf_pid=$!
  sleep 2
  fu_stop "$relay_pid"
  wait_log "$T/link-a-$CASE.log" "relay connection lost" 10
  fu_bg $LR "$T/relay-$CASE-2.log" "${relay_cmd[@]}"
  relay_pid=$FU_LAST_PID
  wait "$iperf_pid" || { cat "$T/iperf-restart.json" >&2; false; }
  check "$CASE: both links reconnected" test "$(grep -c 'relay connected' "$T/link-a-$CASE.log")$(grep -c 'relay connected' "$T/link-b-$CASE.log")" = 22
  local late gap err
  late=$(jq --argjson last $((restart_secs - 3)) '[.intervals[] | select(.sum.start >= ($last)) | .sum.bits_per_second] | max / 1e6 | round' "$T/iperf-restart.json")
  read -r gap err < <(iperf_gap "$T/iperf-restart.json")
  check "$CASE: the TCP transfer inside the tunnel carried on (no error: $err; last seconds up to ${late:-0} Mbit/s; longest gap $gap s)" awk -v m="${late:-0}" -v min="$late_mbits" -v e="$err" 'BEGIN { exit !(m > min && e == "ok") }'
  echo "   relay_down drops at A during the restart: $(metric $LA 'ferry_link_peer_drops_total{peer="b",reason="relay_down"}')"
  all_stop
}
case_derper_derp() { firewall derp; relay_start derper; links_start; traffic derp; all_stop; }
case_ferry_relay_session() { firewall relay; relay_start ferry; links_start; traffic relay; all_stop; }
case_ferry_direct() { firewall direct; relay_start ferry; links_start; traffic direct; all_stop; }
case_derper_direct() { firewall direct; relay_start derper; links_start; traffic direct; all_stop; }

# switch_within MODE PATH: the firewall goes to MODE (during a transfer);
# both links must be on PATH within 2 s.
switch_within() {
  local mode=$1 path=$2 took
  firewall "$mode"
  took=$(wait_path $LA "$T/link-a.toml" b "$path" 2) || { echo "FAIL: $CASE: A not on $path within 2 s of firewall $mode" >&2; return 1; }
  echo "   ok: $CASE: firewall $mode -> A on $path after $took s"
  took=$(wait_path $LB "$T/link-b.toml" a "$path" 2) || { echo "FAIL: $CASE: B not on $path within 2 s of firewall $mode" >&2; return 1; }
  echo "   ok: $CASE: B on $path after $took s more"
}
case_ferry_failover() {
  firewall direct; relay_start ferry; links_start
  check "$CASE: starts direct" on_path $LA "$T/link-a.toml" b direct 15
  iperf_json $LA 10.77.110.2 14 "$T/iperf-failover.json" &
  local iperf_pid=$!
  sleep 3
  step "$CASE: direct cut during the transfer"
  switch_within relay relay
  sleep 3
  step "$CASE: the relay's UDP cut during the transfer"
  switch_within derp derp
  wait "$iperf_pid" || { cat "$T/iperf-failover.json" >&2; false; }
  local gap err mbits retr
  read -r gap err < <(iperf_gap "$T/iperf-failover.json")
  read -r mbits retr < <(iperf_summary "$T/iperf-failover.json")
  check "$CASE: the transfer was never reset ($err)" test "$err" = ok
  check "$CASE: its longest gap across both switches was $gap s (< 2 s)" awk -v g="$gap" 'BEGIN { exit !(g < 2) }'
  check "$CASE: it carried on at $mbits Mbit/s overall, $retr retransmits" awk -v m="$mbits" -v min="$late_mbits" 'BEGIN { exit !(m > min) }'
  results+=("$CASE: direct -> relay -> DERP during one transfer: longest gap $gap s, $mbits Mbit/s, $retr retransmits")
  all_stop
}
case_ferry_upgrade() {
  firewall derp; relay_start ferry; links_start
  check "$CASE: starts on DERP" on_path $LA "$T/link-a.toml" b derp 15
  local took t
  for t in relay:relay direct:direct; do
    firewall "${t%%:*}"
    took=$(wait_path $LA "$T/link-a.toml" b "${t#*:}" 10) || { echo "FAIL: $CASE: not upgraded to ${t#*:} within 10 s" >&2; return 1; }
    echo "   ok: $CASE: firewall ${t%%:*} -> A on ${t#*:} after $took s"
    check "$CASE: B on ${t#*:} too" on_path $LB "$T/link-b.toml" a "${t#*:}" 10
    check "$CASE: the tunnel works on ${t#*:}" ping_until $LA 10.77.110.2 5
    results+=("$CASE: upgraded to ${t#*:} $took s after the firewall allowed it")
  done
  all_stop
}

# A case defined twice runs the second body under both names (a rename
# once turned the relay-session case into a second ferry-derp, and the
# DERP case with the relay restart ran nowhere): refuse that, and a case
# with no body.
twice=$(grep -o '^case_[a-z_]*()' "$0" | sort | uniq -d | tr '\n' ' ')
if [ -n "$twice" ]; then echo "link.sh: case defined more than once: $twice" >&2; exit 2; fi
for c in $cases; do
  declare -F "case_${c//-/_}" >/dev/null || { echo "link.sh: case $c has no case_${c//-/_}()" >&2; exit 2; }
done

for CASE in $cases; do
  step "case $CASE"
  "case_${CASE//-/_}"
done

step "ferry link namespace cases ($cases) passed in $((SECONDS - LK_STARTED)) s"
for r in "${results[@]}"; do echo "   $r"; done

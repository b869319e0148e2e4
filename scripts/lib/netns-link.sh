# Helpers for the `ferry link` namespace test (link.sh) and its benchmark
# (bench/link/run.sh), on top of scripts/lib/netns.sh (source that
# first). Functions only. Set LK_STARTED=$SECONDS before calling step.

step() { echo "== [$((SECONDS - ${LK_STARTED:-0}))s] $*"; }
check() { # check DESCRIPTION COMMAND...
  if ! "${@:2}"; then echo "FAIL: $1" >&2; return 1; fi
  echo "   ok: $1"
}
metrics() { # metrics NS [PORT]: the link's Prometheus text there
  ip netns exec "$1" timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/${2:-9102}; printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3; cat <&3"
}
metric() { # metric NS 'NAME{labels}' -> value (fails when absent: fu_series)
  metrics "$1" | fu_series "$2"
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

# nft_table NS NAME < CHAINS: replaces the nftables table `inet NAME` in
# NS with one holding CHAINS (read from standard input), in one
# transaction, so no packet sees a half-made firewall.
nft_table() {
  { printf 'table inet %s\ndelete table inet %s\ntable inet %s {\n' "$2" "$2" "$2"; cat; printf '}\n'; } |
    ip netns exec "$1" nft -f -
}

# link_path NS CONFIG PEER: the peer's current path ("derp", "relay",
# "direct" or "none") from `ferry link status --json`.
link_path() {
  ip netns exec "$1" "$ferry" link status --json --config "$2" |
    jq -r --arg p "$3" '.peers[] | select(.name == $p) | .path // "none"'
}
# link_node NS CONFIG: the URL of the node the link's first relay is
# connected to ("none" while it is down), from `ferry link status --json`.
link_node() {
  ip netns exec "$1" "$ferry" link status --json --config "$2" | jq -r '.relays[0].node // "none"'
}
# wait_path NS CONFIG PEER PATH SECONDS: until the peer's path is PATH;
# prints how long it took (seconds, 0.1 s resolution).
wait_path() {
  local t0=$EPOCHREALTIME end=$((SECONDS + $5)) got
  while :; do
    got=$(link_path "$1" "$2" "$3" 2>/dev/null || echo error)
    if [ "$got" = "$4" ]; then
      awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f\n", b - a }'
      return 0
    fi
    [ $SECONDS -lt $end ] || { echo "peer $3 in $1: path $got, not $4, after $5 s" >&2; return 1; }
    sleep 0.1
  done
}

on_path() { wait_path "$@" >/dev/null; } # on_path: wait_path, quietly

# iperf_json NS SERVER SECONDS OUT [ARGS...]: an iperf3 TCP run with JSON
# output into OUT.
iperf_json() {
  local ns=$1 server=$2 secs=$3 out=$4; shift 4
  ip netns exec "$ns" timeout $((secs + 30)) iperf3 -c "$server" -t "$secs" -i 0.1 -J "$@" >"$out"
}
# iperf_summary OUT: "receiver-Mbit/s sender-retransmits" from iperf3's JSON.
iperf_summary() {
  jq -r '"\(.end.sum_received.bits_per_second / 1e6 | . * 100 | round / 100) \(.end.sum_sent.retransmits // 0)"' "$1"
}
# iperf_gap OUT: the longest run of 0.1 s intervals that carried nothing,
# in seconds (the transfer's longest stall), and whether it ended in an
# error ("ok" or iperf3's error text).
iperf_gap() {
  jq -r '[.intervals[] | .sum | {d: (.end - .start), b: .bytes}] as $iv
    | (reduce $iv[] as $i ({cur: 0, max: 0}; if $i.b == 0 then .cur += $i.d | .max = ([.max, .cur] | max) else .cur = 0 end) | .max * 100 | round / 100)
    as $gap | "\($gap) \(.error // "ok" | gsub(" "; "_"))"' "$1"
}

# delay_router NS DELAY_MS LOSS_PERMILLE TUN IFACE...: NS forwards between
# its veths; every packet arriving on one of the IFACEs (the peers'
# uplinks) is first dropped with probability LOSS_PERMILLE/1000 (nftables
# numgen random) and then goes through link-delay.py's TUN device TUN,
# which hands it back DELAY_MS later, after which the main table routes it
# on. Packets from other interfaces pass undelayed. With the delay on both
# peers' uplinks and nowhere else, every path between the peers (direct, or
# through a relay behind another interface) gets the same round trip:
# 2 x DELAY_MS.
delay_router() {
  local ns=$1 delay=$2 loss=$3 tun=$4; shift 4
  ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
  fu_bg "$ns" "$FU_TMP/delay-$ns.log" python3 -u "$(dirname "${BASH_SOURCE[0]}")/link-delay.py" "$tun" "$delay"
  wait_log "$FU_TMP/delay-$ns.log" ready 10
  ip -n "$ns" link set "$tun" up
  ip netns exec "$ns" sysctl -qw "net.ipv4.conf.$tun.rp_filter=0"
  ip -n "$ns" route add default dev "$tun" table 77
  local ifn set=""
  for ifn in "$@"; do
    ip -n "$ns" rule add iif "$ifn" lookup 77 priority 100
    set+="${set:+, }\"$ifn\""
  done
  ip netns exec "$ns" nft -f - <<NFT
table inet emulate {
  chain forward {
    type filter hook forward priority 0; policy accept;
    iifname { $set } numgen random mod 1000 < $loss counter drop comment "loss"
  }
}
NFT
}
# link_prereqs WHAT [TOOL...]: what a namespace test of `ferry link` needs
# (wg, nft, iperf3, ping, timeout, jq, the TOOLs, wireguard-go unless
# FU_WG=kernel, and derper), or skip WHAT saying why (fails under
# CI=true: fu_skip_or_fail). Sets derper to derper's path
# (FERRY_DERPER_BIN, interop/bin/derper or ~/go/bin/derper).
link_prereqs() {
  local what=$1 why c
  shift
  derper=""
  for c in "${FERRY_DERPER_BIN:-}" "$root/interop/bin/derper" "$HOME/go/bin/derper"; do
    [ -n "$c" ] && [ -x "$c" ] && { derper=$c; break; }
  done
  why=$(fu_why_not wg nft iperf3 ping timeout jq "$@")
  if [ -z "$why" ] && [ "${FU_WG:-}" != kernel ] && ! fu_wireguard_go >/dev/null; then why="wireguard-go not found (go install golang.zx2c4.com/wireguard@latest)"; fi
  if [ -z "$why" ] && [ -z "$derper" ]; then why="derper not found (.ci/setup.d/10-derper.sh builds interop/bin/derper, or set FERRY_DERPER_BIN)"; fi
  fu_skip_or_fail "$what" "$why"
}

#!/usr/bin/env bash
# `ferry link` benchmark: iperf3 TCP through stock WireGuard (wireguard-go)
# over each of ferry link's paths, beside plain WireGuard direct and two
# tailscaled nodes through derper, on one emulated network. See README.md.
#
#   sudo bash bench/link/run.sh longhaul   # 150 ms round trip, 1 % loss on the peers' uplinks
#   sudo bash bench/link/run.sh local      # no emulation; relay and links CPU per Gbit/s
#   sudo bash bench/link/run.sh longhaul --rtt 150 --loss 2 --duration 30 --cases "link-derp tailscaled-derper"
#
# Writes one JSON document (every case's figures) to
# bench/results/<date>-link-<mode>-<time>/raw/link.json with summary.json
# and results.md beside it (bench/README.md, "Results"), or only the JSON
# to --out FILE, and prints a table.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/scripts/lib/netns.sh"
. "$root/scripts/lib/netns-link.sh"
. "$root/bench/lib/results.sh"
# This run's namespaces, ${K}a ${K}b ${K}r ${K}d, and the prefix of its
# interfaces (names outside a namespace are shared: they carry the pid).
K=fu-$FU_RUN-k W=fu$FU_RUN

mode=${1:-}
case $mode in
  longhaul) rtt=150 loss=1 duration=20 cases="wg-direct link-direct link-relay link-derp tailscaled-derper" ;;
  local) rtt=0 loss=0 duration=10 cases="wg-direct link-direct link-relay link-derp" ;;
  *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
shift
out="" mtu=1280 build=1
while [ $# -gt 0 ]; do
  case $1 in
    --rtt) rtt=$2; shift 2 ;;
    --loss) loss=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    --mtu) mtu=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-build) build=""; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
bin=$root/interop/bin
why=$(fu_why_not wg nft iperf3 ping timeout jq python3)
if [ -z "$why" ] && ! fu_wireguard_go >/dev/null; then why="wireguard-go not found"; fi
for b in derper tailscaled-v1.104.7 tailscale-v1.104.7 headscale-v0.29.3; do
  case " $cases " in *" tailscaled-derper "*) ;; *) [ "$b" = derper ] || continue ;; esac
  [ -n "$why" ] || [ -x "$bin/$b" ] || why="$bin/$b missing (.ci/setup.d builds them; or copy a checkout's interop/bin)"
done
[ -z "$why" ] || { echo "bench/link: cannot run: $why" >&2; exit 1; }
if [ -n "$build" ]; then (cd "$root" && cargo build --release --locked -q -p ferry); fi
ferry=${FERRY_BIN:-${CARGO_TARGET_DIR:-$root/target}/release/ferry}
[ -x "$ferry" ] || { echo "no ferry binary at $ferry" >&2; exit 1; }
dir=""
if [ -z "$out" ]; then
  dir=$(bench_results_dir link "$mode-$(date -u +%H%M%SZ)")
  out="$dir/raw/link.json"
fi

fu_init
T=$FU_TMP
LK_STARTED=$SECONDS
trap 'rc=$?; [ $rc -eq 0 ] || for f in "$T"/*.log; do echo "-- $f" >&2; tail -n 15 "$f" >&2; done; fu_cleanup; exit $rc' EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------ network
#   fu-PID-ka 10.77.21.2 ─┐                        ┌─ fu-PID-kr 10.77.20.2: relay (Ferry or derper), Headscale
#                          fu-PID-kd: router (+ delay line)
#   fu-PID-kb 10.77.22.2 ─┘
# With emulation, every packet entering kd from ka or kb (the
# peers' uplinks) is dropped with probability LOSS % and delayed by RTT/2:
# every path between the peers, direct or through the relay, crosses two
# uplinks per round trip, so all see the same RTT and loss.
step "network: $mode (round trip +$rtt ms, loss $loss % per uplink), inner MTU $mtu"
fu_ns "${K}a" "${K}b" "${K}r" "${K}d"
fu_link "${K}a" 10.77.21.2/24 "${K}d" 10.77.21.1/24
fu_link "${K}b" 10.77.22.2/24 "${K}d" 10.77.22.1/24
fu_link "${K}r" 10.77.20.2/24 "${K}d" 10.77.20.1/24
for n in a b r; do fu_route "$K$n" default "10.77.2$([ $n = a ] && echo 1 || { [ $n = b ] && echo 2 || echo 0; }).1"; done
if [ "$rtt" != 0 ] || [ "$loss" != 0 ]; then
  delay_router "${K}d" "$(awk -v r="$rtt" 'BEGIN { print r / 2 }')" "$(awk -v l="$loss" 'BEGIN { print int(l * 10 + 0.5) }')" "${W}delay" vkd-ka vkd-kb
else
  ip netns exec "${K}d" sysctl -qw net.ipv4.ip_forward=1
fi
RELAY=10.77.20.2
ip_of() { case $1 in a) echo 10.77.21.2 ;; b) echo 10.77.22.2 ;; esac; }
other() { [ "$1" = a ] && echo b || echo a; }
ping_rtt() { # ping_rtt NS DST: average of 10 pings, ms
  ip netns exec "$1" ping -c 10 -i 0.2 -W 3 "$2" | awk -F/ '/^rtt/ { print $5 }'
}
check "network: the emulated round trip between the peers is $(ping_rtt "${K}a" 10.77.22.2) ms" ping_until "${K}a" 10.77.22.2 5

# block WHAT: nftables in the peers drops outgoing UDP to WHAT
# ("peer", "peer relay", or nothing).
block() {
  local n rules dst
  for n in a b; do
    rules=""
    for dst in "$@"; do
      case $dst in
        peer) rules+="ip daddr $(ip_of "$(other $n)") meta l4proto udp counter drop"$'\n' ;;
        relay) rules+="ip daddr $RELAY meta l4proto udp counter drop"$'\n' ;;
      esac
    done
    nft_table "$K$n" bench <<NFT
  chain out {
    type filter hook output priority 0; policy accept;
    $rules
  }
NFT
  done
}

# -------------------------------------------------------------- WireGuard
for n in a b; do fu_key "wg$n"; done
fu_wg "${K}a" "${W}wa" "$T/wga.key" 51820 10.77.120.1/24
fu_wg "${K}b" "${W}wb" "$T/wgb.key" 51820 10.77.120.2/24
for n in a b; do ip -n "$K$n" link set "${W}w$n" mtu "$mtu"; done
wg_endpoint() { # wg_endpoint EP_FOR_A EP_FOR_B
  fu_wg_peer "${K}a" "${W}wa" "$(fu_pub wgb)" 10.77.120.2/32 "$1"
  fu_wg_peer "${K}b" "${W}wb" "$(fu_pub wga)" 10.77.120.1/32 "$2"
}
for n in a b; do
  printf 'key_file = "%s"\n' "$T/link-$n.key" >"$T/link-$n.toml"
  "$ferry" link pubkey --config "$T/link-$n.toml" >"$T/link-$n.pub" 2>/dev/null
done
for n in a b; do
  cat >"$T/link-$n.toml" <<TOML
key_file = "$T/link-$n.key"
wireguard = "127.0.0.1:51820"
metrics_addr = "127.0.0.1:9102"

[[relay]]
name = "r"
url = "http://$RELAY:3340/derp"

[[peer]]
name = "$(other $n)"
link_key = "$(cat "$T/link-$(other $n).pub")"
endpoint = "127.0.0.1:51001"
TOML
done

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
results="[]"
# measure CASE PATH SERVER_IP RELAY_PID [LINK_PIDS]: ping and iperf3 A -> B,
# the relay's CPU and both ferry links' (LINK_PIDS, space-separated)
# during the transfer; appends to $results. Each case has its
# own iperf3 server, stopped after it: a server left serving a client
# whose tunnel broke would keep the next case's client waiting until its
# timeout ("interrupt - the client has terminated"). A case that yields no
# figure is recorded with its reason (iperf3's error, or none written) and
# the run goes on.
measure() {
  local c=$1 path=$2 dst=$3 rpid=${4:-} lpids=${5:-} rtt c0 c1 cpu=null spid l0=0 l1=0 lcpu=null p
  ping_until "${K}a" "$dst" 30 || { record_error "$c" "no ping through the tunnel within 30 s"; return; }
  rtt=$(ping_rtt "${K}a" "$dst")
  fu_bg "${K}b" "$T/iperf-server-$c.log" iperf3 -s
  spid=$FU_LAST_PID
  wait_tcp "${K}b" 127.0.0.1 5201 10 || { record_error "$c" "iperf3 server did not start"; fu_stop "$spid"; return; }
  [ -n "$rpid" ] && c0=$(cpu_ticks "$rpid")
  for p in $lpids; do l0=$((l0 + $(cpu_ticks "$p"))); done
  iperf_json "${K}a" "$dst" "$duration" "$T/iperf-$c.json" || true
  [ -n "$rpid" ] && { c1=$(cpu_ticks "$rpid"); cpu=$(awk -v a="$c0" -v b="$c1" -v hz="$(getconf CLK_TCK)" 'BEGIN { print (b - a) / hz }'); }
  if [ -n "$lpids" ]; then
    for p in $lpids; do l1=$((l1 + $(cpu_ticks "$p"))); done
    lcpu=$(awk -v a="$l0" -v b="$l1" -v hz="$(getconf CLK_TCK)" 'BEGIN { print (b - a) / hz }')
  fi
  fu_stop "$spid"
  local one
  if ! one=$(jq -e --arg c "$c" --arg p "$path" --arg rtt "${rtt:-0}" --argjson cpu "$cpu" --argjson lcpu "$lcpu" --argjson d "$duration" '
      (.end.sum_received.bits_per_second // null) as $bps | {
      case: $c, path: $p, ping_rtt_ms: ($rtt | tonumber),
      mbit_s: (if $bps == null then null else $bps / 1e6 | . * 10 | round / 10 end),
      retransmits: (.end.sum_sent.retransmits // 0),
      relay_cpu_s: $cpu,
      relay_cores_per_gbit_s: (if $cpu == null or $bps == null or $bps == 0 then null
        else ($cpu / $d) / ($bps / 1e9) | . * 1000 | round / 1000 end),
      link_cpu_s: $lcpu,
      link_cores_per_gbit_s: (if $lcpu == null or $bps == null or $bps == 0 then null
        else ($lcpu / $d) / ($bps / 1e9) | . * 1000 | round / 1000 end),
      error: (.error // (if $bps == null then "iperf3 reported no received total" else null end)) }' "$T/iperf-$c.json" 2>/dev/null) ||
     [ -z "$one" ]; then
    record_error "$c" "iperf3 wrote no JSON result ($(head -c 200 "$T/iperf-$c.json" 2>/dev/null | tr '\n' ' '))"
    return
  fi
  results=$(jq --argjson r "$one" '. + [$r]' <<<"$results")
  echo "   $c: $(jq -r '"\(.mbit_s // "-") Mbit/s, \(.retransmits) retransmits, ping \(.ping_rtt_ms) ms, relay CPU \(.relay_cpu_s // "-") s, links CPU \(.link_cpu_s // "-") s\(if .error then ", error: " + .error else "" end)"' <<<"$one")"
}
record_error() {
  results=$(jq --arg c "$1" --arg e "$2" '. + [{case: $c, error: $e}]' <<<"$results")
  echo "   $1: not measured: $2"
}

relay_pid=""
relay_start() { # relay_start ferry|derper
  if [ "$1" = ferry ]; then
    fu_bg "${K}r" "$T/relay-$1.log" "$ferry" -a :3340 --stun-port 3478 -c "$T/relay-ferry.key" --relay-port 3341
  else
    fu_bg "${K}r" "$T/relay-$1.log" "$bin/derper" -a :3340 -http-port -1 -stun-port 3478 -c "$T/relay-derper.key"
  fi
  relay_pid=$FU_LAST_PID
  wait_tcp "${K}r" 127.0.0.1 3340 20
}

# link_case CASE PATH BLOCKED...: both links through a Ferry relay, UDP
# to BLOCKED dropped, measured only once both links are on PATH.
link_case() {
  local c=$1 path=$2; shift 2
  block "$@"
  relay_start ferry
  fu_bg "${K}a" "$T/link-a-$c.log" "$ferry" link --config "$T/link-a.toml"
  local la=$FU_LAST_PID
  fu_bg "${K}b" "$T/link-b-$c.log" "$ferry" link --config "$T/link-b.toml"
  local lb=$FU_LAST_PID
  wg_endpoint 127.0.0.1:51001 127.0.0.1:51001
  if ping_until "${K}a" 10.77.120.2 30 && on_path "${K}a" "$T/link-a.toml" b "$path" 15 &&
     on_path "${K}b" "$T/link-b.toml" a "$path" 15; then
    measure "$c" "$path" 10.77.120.2 "$relay_pid" "$la $lb"
  else
    record_error "$c" "ferry link is not on path $path here (status: $(link_path "${K}a" "$T/link-a.toml" b 2>/dev/null || echo unknown))"
  fi
  fu_stop "$la"; fu_stop "$lb"; fu_stop "$relay_pid"
}

# tailscaled_case: Headscale and derper in fu-PID-kr, a tailscaled in each
# peer, UDP between the peers dropped so that they talk through derper.
tailscaled_case() {
  local c=tailscaled-derper hs=$T/headscale
  block peer
  relay_start derper
  mkdir -p "$hs"
  # Headscale's defaults, except: addresses, files in $hs, only our DERP
  # map, no update checks, no DNS for the nodes.
  cat >"$hs/config.yaml" <<YAML
server_url: http://$RELAY:8080
listen_addr: $RELAY:8080
noise: { private_key_path: $hs/noise.key }
prefixes: { v4: 100.64.0.0/10, v6: "fd7a:115c:a1e0::/48" }
derp: { server: { enabled: false }, urls: [], paths: [$hs/derp.yaml], auto_update_enabled: false }
disable_check_updates: true
database: { type: sqlite, sqlite: { path: $hs/db.sqlite } }
dns: { magic_dns: false, override_local_dns: false }
unix_socket: $hs/headscale.sock
YAML
  cat >"$hs/derp.yaml" <<YAML
regions:
  900:
    regionid: 900
    regioncode: fl
    regionname: ferry link bench
    nodes:
      - name: fl1
        regionid: 900
        hostname: derp.fl.test
        ipv4: $RELAY
        ipv6: none
        stunport: 3478
        derpport: 3340
YAML
  local hsc=("$bin/headscale-v0.29.3" -c "$hs/config.yaml")
  fu_bg "${K}r" "$T/headscale.log" "${hsc[@]}" serve
  local hpid=$FU_LAST_PID
  wait_tcp "${K}r" "$RELAY" 8080 30
  local uid key
  uid=$(ip netns exec "${K}r" "${hsc[@]}" users create bench -o json | jq -r .id)
  key=$(ip netns exec "${K}r" "${hsc[@]}" preauthkeys create --user "$uid" --reusable --expiration 1h -o json | jq -r .key)
  local n pids=()
  for n in a b; do
    mkdir -p "$T/ts-$n"
    fu_bg "$K$n" "$T/tailscaled-$n.log" env TS_DEBUG_USE_DERP_HTTP=1 "$bin/tailscaled-v1.104.7" \
      --tun "${W}ts$n" --socket "$T/ts-$n/sock" --statedir "$T/ts-$n/state" --port 41641 --no-logs-no-support
    pids+=("$FU_LAST_PID")
  done
  for n in a b; do
    local end=$((SECONDS + 10))
    until [ -S "$T/ts-$n/sock" ]; do [ $SECONDS -lt $end ] || { record_error "$c" "tailscaled $n did not start"; return; }; sleep 0.1; done
    ip netns exec "$K$n" "$bin/tailscale-v1.104.7" --socket "$T/ts-$n/sock" up --login-server "http://$RELAY:8080" \
      --authkey "$key" --hostname "bench-$n" --accept-dns=false --netfilter-mode=off --timeout 90s >"$T/ts-up-$n.log" 2>&1
  done
  local bip
  bip=$(ip netns exec "${K}b" "$bin/tailscale-v1.104.7" --socket "$T/ts-b/sock" ip -4)
  # tailscale ping answers once the peers see each other; it must say DERP.
  # (It exits non-zero when no direct connection came of it, as here.)
  local pinged="" i
  for i in $(seq 1 30); do
    ip netns exec "${K}a" "$bin/tailscale-v1.104.7" --socket "$T/ts-a/sock" ping --c 1 --timeout 3s "$bip" >"$T/ts-ping.log" 2>&1 || true
    if grep -q '^pong from' "$T/ts-ping.log"; then pinged=1; break; fi
  done
  if [ -z "$pinged" ]; then record_error "$c" "tailscale ping to B never answered: $(tail -n 1 "$T/ts-ping.log")";
  elif ! grep -q 'via DERP' "$T/ts-ping.log"; then record_error "$c" "not through DERP: $(tail -n 1 "$T/ts-ping.log")";
  else measure "$c" derp "$bip" "$relay_pid"; fi
  for pid in "${pids[@]}" "$hpid"; do fu_stop "$pid"; done
  fu_stop "$relay_pid"
}

for c in $cases; do
  step "case $c"
  case $c in
    wg-direct) block; wg_endpoint 10.77.22.2:51820 10.77.21.2:51820; measure "$c" wireguard 10.77.120.2 ;;
    link-direct) link_case "$c" direct ;;
    link-relay) link_case "$c" relay peer ;;
    link-derp) link_case "$c" derp peer relay ;;
    tailscaled-derper) tailscaled_case ;;
    *) echo "unknown case $c" >&2; exit 2 ;;
  esac
done

jq -n --arg mode "$mode" --argjson rtt "$rtt" --argjson loss "$loss" --argjson mtu "$mtu" --argjson d "$duration" \
  --arg kernel "$(uname -r)" --argjson cpus "$(nproc)" --arg ferry "$("$ferry" --version 2>/dev/null || echo unknown)" \
  --arg at "$(date -u +%FT%TZ)" --argjson r "$results" \
  '{mode: $mode, at: $at, emulation: {rtt_ms: $rtt, loss_percent_per_uplink: $loss}, inner_mtu: $mtu,
    iperf3_seconds: $d, kernel: $kernel, cpus: $cpus, ferry: $ferry, results: $r}' >"$out"
step "results in $out"
[ -z "$dir" ] || bench_results_finish "$dir" "not pinned: relay, links, wireguard-go and iperf3 share the $(nproc) CPUs"
jq -r '.results[] | [.case, (.path // "-"), (.mbit_s // "-"), (.retransmits // "-"), (.ping_rtt_ms // "-"), (.relay_cores_per_gbit_s // "-"), (.link_cores_per_gbit_s // "-"), (.error // "")] | @tsv' "$out" |
  (printf 'case\tpath\tMbit/s\tretransmits\tping ms\trelay cores per Gbit/s\tlinks cores per Gbit/s\terror\n'; cat) | column -t -s $'\t'

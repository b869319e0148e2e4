# Network-namespace helpers, one copy for the namespace tests (the UDP
# relay's, crates/udp/tests/netns/, and `ferry link`'s,
# crates/ferry/tests/netns/link.sh; test steps 30 and 40) and the
# benchmarks that build namespaces (bench/udp/, bench/link/). Source it;
# it defines functions only. Every namespace is named fu-<something>, every address is inside
# 10.77.0.0/16, every WireGuard interface name starts with fu, and
# everything started here is recorded so fu_cleanup can undo it (call it
# from an EXIT trap).
#
# Names that live outside a namespace are shared by every run on the
# host: namespace names (/run/netns), wireguard-go's control sockets
# (/run/wireguard/IFNAME.sock) and /etc/netns/NS. Scripts that can run
# beside another run (the test steps) build them with FU_RUN, this
# shell's pid: fu-$FU_RUN-a, fu${FU_RUN}a. fu_ns reaps what a run that
# was killed left behind (its pid gone).

# shellcheck source=/dev/null
. "$(dirname "${BASH_SOURCE[0]}")/expect.sh"

FU_RUN=$$
FU_NAMESPACES=()
FU_PIDS=()
FU_TMP=""

fu_log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }

# Prints why the namespace tests cannot run here, or nothing when they can.
# Tools: pass the commands the caller needs.
fu_why_not() {
  if [ "$(id -u)" != 0 ]; then echo "not root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"; return; fi
  local t
  for t in ip "$@"; do
    command -v "$t" >/dev/null 2>&1 || { echo "missing tool: $t"; return; }
  done
  if ! ip netns add fu-probe-$$ >/dev/null 2>&1; then echo "cannot create network namespaces"; return; fi
  ip netns del fu-probe-$$ >/dev/null 2>&1 || true
  if [ "${FU_WG:-}" = kernel ]; then
    if ! ip link add fu-probe-$$ type wireguard >/dev/null 2>&1; then echo "this kernel has no WireGuard (ip link add type wireguard failed)"; return; fi
    ip link del fu-probe-$$ >/dev/null 2>&1 || true
  elif [ ! -c /dev/net/tun ]; then echo "no /dev/net/tun (wireguard-go needs TUN)"; return; fi
}

# Finds the wireguard-go binary (named "wireguard" by go install).
fu_wireguard_go() {
  local c
  for c in "${WIREGUARD_GO:-}" "$(command -v wireguard-go 2>/dev/null)" "$(command -v wireguard 2>/dev/null)" \
           "$(go env GOPATH 2>/dev/null)/bin/wireguard" "$HOME/go/bin/wireguard"; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  return 1
}

# fu_skip_or_fail WHAT WHY: with a reason, says the tests of WHAT skip
# (counted in the step's skips) and exits 0, or, under CI=true (whose
# machine has everything .ci/setup.d installs), fails: a skip there is not
# a pass. Without a reason, returns.
fu_skip_or_fail() {
  [ -n "$2" ] || return 0
  expect_skip "$1" "$2" ".ci/setup.d/10-netns.sh and 30-udp.sh install the tools"
}

# fu_ferry_bin ROOT: the ferry binary under test (FERRY_BIN, or the debug
# build), or fails saying how to build it.
fu_ferry_bin() {
  local f=${FERRY_BIN:-$1/target/debug/ferry}
  [ -x "$f" ] || { echo "ferry binary not found at $f (cargo build -p ferry)" >&2; exit 1; }
  echo "$f"
}

# fu_init: creates the scratch directory; call once, not in a subshell.
fu_init() { FU_TMP=$(mktemp -d /tmp/fu-udp.XXXXXX); }
fu_tmpdir() { echo "$FU_TMP"; }

# fu_reap: deletes the namespaces fu-PID-* whose PID is gone (a run that
# was killed before its cleanup), and ends what still runs in them.
fu_reap() {
  local ns pid p
  for ns in $(ip netns list 2>/dev/null | awk '/^fu-[0-9]+-/ { print $1 }'); do
    pid=${ns#fu-}; pid=${pid%%-*}
    kill -0 "$pid" 2>/dev/null && continue
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
}

fu_ns() { # fu_ns NAME...: creates namespaces with loopback up
  local n
  fu_reap
  for n in "$@"; do
    ip netns del "$n" >/dev/null 2>&1 || true
    ip netns add "$n"
    FU_NAMESPACES+=("$n")
    ip -n "$n" link set lo up
  done
}

# fu_link NS_A ADDR_A/PLEN NS_B ADDR_B/PLEN: a veth pair between two
# namespaces, named after the last part of their names: in fu-x, the end
# towards fu-y is vx-y.
fu_link() {
  local a=$1 aa=$2 b=$3 ba=$4
  local ia="v${a##*-}-${b##*-}" ib="v${b##*-}-${a##*-}"
  ia=${ia:0:15}; ib=${ib:0:15}
  ip link add "$ia" netns "$a" type veth peer name "$ib" netns "$b"
  ip -n "$a" addr add "$aa" dev "$ia"
  ip -n "$b" addr add "$ba" dev "$ib"
  ip -n "$a" link set "$ia" up
  ip -n "$b" link set "$ib" up
}

fu_route() { ip -n "$1" route add "$2" via "$3"; }

# fu_series 'NAME{labels}' < PROMETHEUS_TEXT: the series' value. A series
# that is not there (renamed, or the scrape failed) is an error, never 0:
# it says so with the scrape on standard error and fails, so that a check
# such as "nothing dropped" cannot pass on a missing counter.
fu_series() {
  awk -v k="$1" '
    { text = text $0 "\n" }
    $1 == k { print $2; found = 1 }
    END { if (!found) { printf "no series %s in the scrape:\n%s", k, text > "/dev/stderr"; exit 1 } }'
}

# fu_bg NS LOGFILE CMD...: runs CMD in namespace NS in the background and
# records its pid in FU_PIDS and FU_LAST_PID (do not call in a subshell).
FU_LAST_PID=""
fu_bg() {
  local ns=$1 log=$2; shift 2
  ip netns exec "$ns" "$@" >"$log" 2>&1 &
  FU_LAST_PID=$!
  FU_PIDS+=("$FU_LAST_PID")
}

fu_stop() { # fu_stop PID: stops one process we started
  local pid=$1 i
  kill "$pid" 2>/dev/null || return 0
  for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

# fu_wg NS IFNAME KEYFILE PORT ADDR/PLEN: a WireGuard interface, from
# wireguard-go, or the kernel's module with FU_WG=kernel.
fu_wg() {
  local ns=$1 ifn=$2 key=$3 port=$4 addr=$5 wg_go
  if [ "${FU_WG:-}" = kernel ]; then
    ip -n "$ns" link add "$ifn" type wireguard
  else
    wg_go=$(fu_wireguard_go) || { fu_log "wireguard-go not found"; return 1; }
    rm -f "/var/run/wireguard/$ifn.sock"
    fu_bg "$ns" "$FU_TMP/$ifn.log" env WG_PROCESS_FOREGROUND=1 LOG_LEVEL=error "$wg_go" -f "$ifn"
    local i
    for i in $(seq 1 100); do [ -S "/var/run/wireguard/$ifn.sock" ] && break; sleep 0.05; done
    [ -S "/var/run/wireguard/$ifn.sock" ] || { fu_log "wireguard-go $ifn did not start"; cat "$FU_TMP/$ifn.log" >&2; return 1; }
  fi
  ip netns exec "$ns" wg set "$ifn" private-key "$key" listen-port "$port"
  ip -n "$ns" addr add "$addr" dev "$ifn"
  ip -n "$ns" link set "$ifn" mtu 1420 up
}

# fu_wg_peer NS IFNAME PUBKEY ALLOWED [ENDPOINT]: adds a peer.
fu_wg_peer() {
  local ns=$1 ifn=$2 pub=$3 allowed=$4 ep=${5:-}
  if [ -n "$ep" ]; then
    ip netns exec "$ns" wg set "$ifn" peer "$pub" allowed-ips "$allowed" endpoint "$ep" persistent-keepalive 1
  else
    ip netns exec "$ns" wg set "$ifn" peer "$pub" allowed-ips "$allowed"
  fi
}

fu_key() { # fu_key NAME: writes NAME.key/NAME.pub in the scratch directory
  (umask 077; wg genkey >"$FU_TMP/$1.key")
  wg pubkey <"$FU_TMP/$1.key" >"$FU_TMP/$1.pub"
}
fu_pub() { cat "$FU_TMP/$1.pub"; }

# fu_wait_handshake NS IFNAME SECONDS: waits until every peer of IFNAME has
# completed a handshake.
fu_wait_handshake() {
  local ns=$1 ifn=$2 secs=$3 end=$((SECONDS + $3))
  while [ $SECONDS -lt $end ]; do
    if ip netns exec "$ns" wg show "$ifn" latest-handshakes | awk '{ if ($2 == 0) bad=1 } END { exit bad }'; then
      return 0
    fi
    sleep 0.2
  done
  fu_log "no handshake on $ns/$ifn within ${secs}s"
  return 1
}

fu_cleanup() {
  local pid ns
  for pid in "${FU_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  sleep 0.2
  for pid in "${FU_PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  for ns in "${FU_NAMESPACES[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  FU_PIDS=(); FU_NAMESPACES=()
  if [ -n "$FU_TMP" ] && [ -z "${FU_KEEP_TMP:-}" ]; then rm -rf "$FU_TMP"; fi
}

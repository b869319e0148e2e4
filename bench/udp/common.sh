# Helpers shared by the UDP relay benchmarks (run.sh, pps.sh). Source it
# after scripts/lib/netns.sh; it defines functions only.

# bench_stop_relay NS TABLE PID...: stops the relay processes we started
# in NS and undoes an nftables relay (table TABLE, forwarding, conntrack).
bench_stop_relay() {
  local ns=$1 table=$2 p
  shift 2
  for p in "$@"; do fu_stop "$p"; done
  # socat's forked children are not ours by pid: end whatever still runs in NS.
  for p in $(ip netns pids "$ns"); do kill "$p" 2>/dev/null || true; done
  ip netns exec "$ns" nft delete table ip "$table" 2>/dev/null || true
  ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=0
  ip netns exec "$ns" conntrack -F >/dev/null 2>&1 || true
}

# bench_rcvbuf_errors NS: RcvbufErrors of a namespace's UDP counters.
bench_rcvbuf_errors() {
  ip netns exec "$1" awk '/^Udp:/ { n++; if (n == 1) { for (i = 1; i <= NF; i++) if ($i == "RcvbufErrors") c = i } else print $c }' /proc/net/snmp
}

# bench_topology PREFIX N1 N2: namespaces A=PREFIX-a, R=PREFIX-r,
# B=PREFIX-b (sets A, R, B), A 10.77.N1.2 ── 10.77.N1.1 R 10.77.N2.1 ──
# 10.77.N2.2 B, veth pairs.
bench_topology() {
  A=$1-a R=$1-r B=$1-b
  fu_ns "$A" "$R" "$B"
  fu_link "$A" "10.77.$2.2/24" "$R" "10.77.$2.1/24"
  fu_link "$B" "10.77.$3.2/24" "$R" "10.77.$3.1/24"
}

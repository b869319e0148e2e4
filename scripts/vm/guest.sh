#!/usr/bin/env bash
# Runs inside the kernel test VM as PID 1 (init.sh hands over to it), on
# the guest's own kernel (Debian's 6.1) with the host's root as a RAM
# overlay. $ferry_plan (from the kernel command line) names a file that
# scripts/test.d/55-vm.sh wrote: CI, FERRY_ROOT and the test binaries.
#
# Every check prints "ferry-vm: result NAME ok|FAILED ..." on the serial
# console, every skip inside one "ferry-vm: skip TEST<tab>REASON", and the
# last line is "ferry-vm: status N passed, M failed", which 55-vm.sh
# reads; then the VM powers off. With CI=true from the plan a skip fails
# its check, as on the host.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8
set -u
poweroff_now() {
  echo o >/proc/sysrq-trigger
  sleep 30
}
trap poweroff_now EXIT

# A clean /tmp, /run and /dev/shm (the host's are under the overlay). The
# host's /tmp stays reachable at /run/host-tmp: a checkout or target
# directory under it (the plan, the test binaries) is bound back in place
# by host_tmp.
mount -t tmpfs -o mode=755 tmpfs /run
mkdir /run/host-tmp && mount --bind /tmp /run/host-tmp
mount -t tmpfs -o mode=1777 tmpfs /tmp
host_tmp() { # host_tmp PATH...: the host's /tmp/TOP over the guest's, for each PATH in /tmp/TOP/...
  local p top
  for p in "$@"; do
    case $p in /tmp/?*) ;; *) continue ;; esac
    top=${p#/tmp/}
    top=${top%%/*}
    [ -e "/run/host-tmp/$top" ] && ! mountpoint -q "/tmp/$top" || continue
    if [ -d "/run/host-tmp/$top" ]; then mkdir -p "/tmp/$top"; else touch "/tmp/$top"; fi
    mount --bind "/run/host-tmp/$top" "/tmp/$top"
  done
}
mkdir -p /dev/shm /dev/pts && mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t devpts devpts /dev/pts
# What udev would link: bash's process substitution needs /dev/fd.
ln -sfn /proc/self/fd /dev/fd
ln -sfn /proc/self/fd/0 /dev/stdin
ln -sfn /proc/self/fd/1 /dev/stdout
ln -sfn /proc/self/fd/2 /dev/stderr
ip link set lo up
hostname ferry-vm
host_tmp "$ferry_plan"
# The marker 55-vm.sh reports when no status comes.
[ -r "$ferry_plan" ] || { echo "ferry-vm: init failed: no plan at $ferry_plan"; exit 1; }
# shellcheck source=/dev/null
. "$ferry_plan"
for v in FERRY_ROOT FERRY_BIN BENCH_DEBUG URING_PROBE SYS_LIB RELAY_LIB KTLS_RX KTLS TLS_RELAY INTEROP_TEST DERPER_BIN \
  BENCH_FERRY BENCH_CLIENT; do
  host_tmp "${!v:-}"
done
cd "$FERRY_ROOT" || { echo "ferry-vm: init failed: no checkout at $FERRY_ROOT"; exit 1; }
export CI
# Skips of the checks (the shell's and the Rust tests'), relayed after each.
export FERRY_SKIP_LOG=/tmp/ferry-vm-skips
: >"$FERRY_SKIP_LOG"
echo "ferry-vm: kernel $(uname -r), $(nproc) CPUs, plan $ferry_plan, CI=${CI:-unset}"

passed=0
failed=0
run() { # run NAME SECONDS CMD...: one check, bounded in time
  local name=$1 secs=$2 start=$SECONDS rc=0
  shift 2
  # FERRY_VM_ONLY (a bash regex; by hand, never in CI): only these checks.
  if [ -n "${FERRY_VM_ONLY:-}" ] && ! [[ $name =~ $FERRY_VM_ONLY ]]; then
    echo "ferry-vm: skipped $name (FERRY_VM_ONLY)"
    return
  fi
  echo "ferry-vm: --- $name"
  timeout -k 5 "$secs" "$@" </dev/null 2>&1 || rc=$?
  sort -u "$FERRY_SKIP_LOG" | sed -n 's/^./ferry-vm: skip &/p'
  : >"$FERRY_SKIP_LOG"
  if [ $rc = 0 ]; then
    passed=$((passed + 1))
    echo "ferry-vm: result $name ok ($((SECONDS - start)) s)"
  else
    failed=$((failed + 1))
    [ $rc = 124 ] && rc="timeout after $secs s"
    echo "ferry-vm: result $name FAILED (exit $rc, $((SECONDS - start)) s)"
  fi
}

# FERRY_VM_HOG=N (by hand, never in CI): N busy loops in the guest for
# the whole run, at the checks' own priority, to make the guest as slow
# as a loaded host makes it (races that only show there).
if [ "${FERRY_VM_HOG:-0}" -gt 0 ]; then
  for _ in $(seq 1 "$FERRY_VM_HOG"); do
    (trap - EXIT; while :; do :; done) &
  done
  echo "ferry-vm: $FERRY_VM_HOG busy loops running (FERRY_VM_HOG)"
fi

run "modprobe tls" 30 modprobe tls
run "modprobe wireguard" 30 modprobe wireguard
run "io_uring usable" 30 "$URING_PROBE"
# kTLS: a skip is a failure here (FERRY_REQUIRE_KTLS=1). Test binaries run
# from their crate's directory, as cargo test runs them, through
# scripts/lib/expect.sh: a run selected by name (the unit tests of the kTLS modules)
# must pass as many tests as it selected on 2026-11-28 (12 and 5), the
# others at least one, so that a renamed test cannot turn the check into
# "0 passed".
export FERRY_REQUIRE_KTLS=1
libtest=(bash scripts/lib/expect.sh libtest)
run "ferry-sys ktls unit tests" 120 "${libtest[@]}" 12 env -C crates/sys "$SYS_LIB" ktls --test-threads=2 --color never
run "ferry-derp ktls unit tests" 120 "${libtest[@]}" 5 env -C crates/derp "$RELAY_LIB" transport::kernel transport::handoff --test-threads=2 --color never
run "ferry-engine ktls_rx" 120 "${libtest[@]}" 1 env -C crates/engine "$KTLS_RX" --test-threads=2 --color never
# tests/ktls/ drives the epoll driver itself (the one back end that reads
# kTLS records); tls_relay.rs runs the relay on each back end: on epoll
# the sessions move into the kernel, on io_uring they are refused with
# reason "backend" and stay in userspace.
run "ferry-derp ktls" 300 "${libtest[@]}" 1 env -C crates/derp "$KTLS" --test-threads=2 --color never --nocapture
for io in epoll uring; do
  run "ferry-derp tls_relay ($io)" 300 "${libtest[@]}" 1 env -C crates/derp FERRY_IO=$io "$TLS_RELAY" --test-threads=2 --color never --nocapture
done
unset FERRY_REQUIRE_KTLS
# Kernel WireGuard peers through `ferry udp-relay` in namespaces.
# Under TCG (no KVM) the whole guest is emulated: bulk TCP through the
# tunnel runs at 5-40 Mbit/s, so the rate check only asks for traffic to
# flow, and restarting the relay takes seconds, so the transfer across the
# restart runs longer to outlast TCP's back-off.
min_mbits=20 restart_secs=10
[ "$FERRY_VM_ACCEL" = tcg ] && min_mbits=1 restart_secs=20
run "udp netns with kernel WireGuard" 400 env FU_WG=kernel FU_MIN_MBITS=$min_mbits FU_RESTART_SECS=$restart_secs WG_COLOR_MODE=never \
  FERRY_BIN="$FERRY_BIN" bash crates/udp/tests/netns/run.sh
# `ferry link` between kernel WireGuard peers, over Ferry and over derper
# (crates/ferry/tests/netns/link.sh; the same rates as above under TCG).
# Through two userspace hops (link, relay, link), emulated, a loaded host
# carries well under 1 Mbit/s: there the checks ask for traffic to flow.
link_env=()
[ "$FERRY_VM_ACCEL" = tcg ] && link_env=(FU_MIN_MBITS=0.05 FU_MIN_DATAGRAMS=20)
# The DERP cases only: the failover and upgrade cases time path switches
# in seconds, which an emulated guest cannot promise; they run on the host
# (step 31).
run "ferry link netns with kernel WireGuard" 400 env FU_WG=kernel "${link_env[@]}" LINK_CASES="ferry-derp derper-derp" FU_RESTART_SECS=$restart_secs \
  FERRY_BIN="$FERRY_BIN" FERRY_DERPER_BIN="$DERPER_BIN" bash crates/ferry/tests/netns/link.sh

# Tailscale's own DERP client (derphttp, from the interop suite) against
# `ferry --ktls on` on epoll (sessions in the kernel) and io_uring (kept in
# userspace for the back end): packets of every size relayed both ways and
# the server's kTLS metrics checked (interop/ktls_test.go).
# The relay's connection log at debug level is printed if it fails.
# It is selected by name: it and both its back ends must pass.
run "Tailscale's DERP client against ferry --ktls on" 180 bash scripts/lib/expect.sh passed \
  "TestKernelTLS TestKernelTLS/epoll TestKernelTLS/uring" env -C interop INTEROP_KTLS=1 INTEROP_SERVERS=ferry \
  FERRY_BIN="$FERRY_BIN" FERRY_ARGS="--log info,ferry_derp=debug" "$INTEROP_TEST" -test.run '^TestKernelTLS$' -test.count=1 -test.v

# The ferry binary over TLS: one ferry on epoll with --ktls MODE, loaded by
# ferry-bench (4 peers in 2 pairs, unpaced) for SECS. Every connection
# must be in the kernel with --ktls on or auto, none with off (the
# ferry_connections_by_transport{transport="ktls"} gauge, the most seen
# while it runs), and packets must be delivered. The figures are printed,
# never asserted.
ferry_over_tls() { # ferry_over_tls MODE FERRY FERRY-BENCH SECS
  local mode=$1 dir=/tmp/tls-$1-$RANDOM pid bench rc=0 ktls=0 v i scrape
  mkdir -p "$dir"
  "$2" -a 127.0.0.1:8443 --certmode selfsigned --certdir "$dir" --hostname localhost \
    --http-port -1 --stun=false -c "$dir/ferry.key" --workers 1 --io epoll --ktls "$mode" \
    --metrics-addr 127.0.0.1:9102 --log warn >"$dir/ferry.log" 2>&1 &
  pid=$!
  for i in $(seq 1 100); do
    timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/8443' 2>/dev/null && break
    sleep 0.1
  done
  "$3" throughput --server https://localhost:8443 --connect 127.0.0.1:8443 --insecure \
    --server-pid "$pid" -n 4 --warmup 1s --duration "${4}s" --quiet -o "$dir/report.json" &
  bench=$!
  for i in $(seq 1 120); do
    kill -0 "$bench" 2>/dev/null || break
    # A scrape that did not answer is tried again; one without the gauge
    # fails the check (a missing series is not 0).
    if ! scrape=$(timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/9102; printf "GET /metrics HTTP/1.0\r\n\r\n" >&3; cat <&3' 2>/dev/null); then
      sleep 0.5
      continue
    fi
    v=$(awk '$1 == "ferry_connections_by_transport{transport=\"ktls\"}" { print $2 }' <<<"$scrape")
    if [ -z "$v" ]; then
      echo "no ferry_connections_by_transport{transport=\"ktls\"} in ferry's metrics"
      kill "$pid" "$bench" 2>/dev/null
      wait "$pid" "$bench"
      return 1
    fi
    [ "$v" -gt "$ktls" ] && ktls=$v
    sleep 0.5
  done
  wait "$bench" || rc=$?
  kill "$pid"
  wait "$pid"
  [ $rc = 0 ] || { cat "$dir/ferry.log"; return $rc; }
  jq -e -r --arg m "$mode" --arg k "$ktls" 'if .result.packets_delivered > 0 then "ferry-vm: ferry --ktls \($m): \(.result.delivered_mbps | floor) Mbit/s delivered, server CPU \(.server.cpu_util * 100 | floor) %, kTLS connections \($k)" else error("no packets delivered") end' "$dir/report.json" || return 1
  if [ "$mode" = off ]; then [ "$ktls" = 0 ]; else [ "$ktls" = 4 ]; fi
}
export -f ferry_over_tls
# The debug binaries as CI built them: a check of the binary, not a speed.
run "ferry --ktls on: TLS sessions in the kernel" 120 bash -c 'ferry_over_tls on "$0" "$1" 2' "$FERRY_BIN" "$BENCH_DEBUG"
# kTLS against userspace TLS (FERRY_VM_BENCH=1 on the host: release builds).
if [ -n "${BENCH_FERRY:-}" ]; then
  run "bench: --ktls auto" 120 bash -c 'ferry_over_tls auto "$0" "$1" 5' "$BENCH_FERRY" "$BENCH_CLIENT"
  run "bench: --ktls off" 120 bash -c 'ferry_over_tls off "$0" "$1" 5' "$BENCH_FERRY" "$BENCH_CLIENT"
fi

echo "ferry-vm: status $passed passed, $failed failed"

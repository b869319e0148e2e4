# The container image (packaging/container): build.sh assembles the root
# from the debug binary the earlier steps built (stripped; a release build
# would add minutes and test nothing more about the image), podman builds
# it FROM scratch, and it runs in a network namespace of this step's own,
# twice on one /data directory:
#   1. under podman's default seccomp profile, which refuses io_uring:
#      ferry must run on epoll and say why;
#   2. under packaging/container/seccomp-ferry.json and a read-only root
#      (as compose.yaml runs it): io_uring, and the key and certificate of
#      run 1 still there.
# Each run: /healthz answers 200 with the JSON status, the image's
# HEALTHCHECK passes, Tailscale's derpprobe passes its TLS, STUN and
# relay probes (a packet through the container) against ports 443 and
# 3478, which the non-root user binds with CAP_NET_BIND_SERVICE and no
# other capability, and SIGTERM stops it cleanly (exit 0, "stopped").
# compose.yaml is validated by docker-compose. Needs root.
set -euo pipefail
. scripts/lib/expect.sh
cargo build --locked -p ferry
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
bin="$target_dir/debug/ferry"

skip() { expect_skip "container image (step 47)" "$1" ".ci/setup.d/47-container.sh installs the tools"; }
[ "$(id -u)" = 0 ] || skip "not root (podman, setcap and a network namespace need it)"
for tool in podman runc setcap docker-compose curl jq ip; do
  command -v "$tool" >/dev/null || skip "$tool is not installed"
done

# compose.yaml against the Compose file schema (no daemon needed; it also
# reads the seccomp profile it names, relative to the working directory).
(cd packaging/container && docker-compose -f compose.yaml config -q)

# Tailscale's derpprobe, which set-up builds (.ci/setup.d/20-interop.sh;
# this step runs that script itself if it did not).
derpprobe=interop/bin/derpprobe
[ -x "$derpprobe" ] || bash .ci/setup.d/20-interop.sh

tag=$$
image=localhost/ferry-test:$tag
name=ferry-test-$tag
ns=ferry-test-$tag
work=$(mktemp -d)
# runc: Debian 12's crun refuses this kernel's hybrid cgroup layout. The
# limits: podman's default ones (open files 1048576, processes above ours)
# are over this machine's hard limits, which only CAP_SYS_RESOURCE, which
# this sandbox lacks, may raise.
podman=(podman --runtime runc)
nofile=$(ulimit -Hn)
[ "$nofile" != unlimited ] || nofile=1048576
limits=(--ulimit "nofile=$nofile:$nofile" --ulimit nproc=4096:4096)
cleanup() {
  "${podman[@]}" rm -f "$name" >/dev/null 2>&1 || true
  podman rmi -f "$image" >/dev/null 2>&1 || true
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

start=$SECONDS
ctx=$(bash packaging/container/build.sh "$bin" "$work/ctx")
# docker format: the OCI image format has no HEALTHCHECK.
podman build -q --format docker -t "$image" "$ctx" >/dev/null
echo "image built in $((SECONDS - start)) s: $(podman image inspect "$image" --format '{{.Size}}' | numfmt --to=iec) (debug binary, stripped)"
[ "$(podman image inspect "$image" --format '{{.Config.User}}')" = 65532:65532 ]

ip netns add "$ns"
ip -n "$ns" link set lo up
in_ns() { ip netns exec "$ns" "$@"; }
data="$work/data"
mkdir -m 0700 "$data"
chown 65532:65532 "$data"
cat > "$work/derpmap.json" <<'MAP'
{"Regions": {"900": {"RegionID": 900, "RegionCode": "ct", "RegionName": "container",
  "Nodes": [{"Name": "900a", "RegionID": 900, "HostName": "localhost", "IPv4": "127.0.0.1",
             "DERPPort": 443, "STUNPort": 3478}]}},
 "omitDefaultRegions": true}
MAP

# run LABEL WANT_BACKEND [podman run options]: one life of the container.
run() {
  local label=$1 want=$2
  shift 2
  local t0=$SECONDS
  # The image's defaults: key and certificates under /data, metrics and
  # /healthz on :9100, DERP over TLS on :443, HTTP on :80, STUN on :3478.
  # DERP_DOMAIN is a derper image's name for --hostname.
  "${podman[@]}" run -d --name "$name" --network "ns:/run/netns/$ns" \
    --health-interval disable "${limits[@]}" \
    --cap-drop ALL --cap-add NET_BIND_SERVICE "$@" \
    -v "$data:/data" -e FERRY_CERTMODE=selfsigned -e DERP_DOMAIN=localhost \
    "$image" >/dev/null 2> >(grep -v 'systemd connection' >&2)
  local health=""
  for _ in $(seq 100); do
    health=$(in_ns curl -sf --max-time 2 http://127.0.0.1:9100/healthz) && break
    if [ "$("${podman[@]}" inspect "$name" --format '{{.State.Running}}')" != true ]; then
      "${podman[@]}" logs "$name" >&2
      echo "$label: the container exited" >&2
      return 1
    fi
    sleep 0.1
  done
  [ -n "$health" ] || { "${podman[@]}" logs "$name" >&2; echo "$label: /healthz never answered 200" >&2; return 1; }
  echo "$label: /healthz $health"
  [ "$(jq -r .status <<<"$health")" = ok ]
  [ "$(jq -r .backend <<<"$health")" = "$want" ] || { echo "$label: back end is not $want" >&2; return 1; }
  local logs
  logs=$("${podman[@]}" logs "$name" 2>&1)
  if [ "$want" = epoll ]; then
    # Refused io_uring: the start-up log and the metric both say why.
    grep 'I/O back end backend="epoll" reason=io_uring not usable' <<<"$logs"
    in_ns curl -sf http://127.0.0.1:9100/metrics | grep '^ferry_io_backend{backend="epoll",reason="io_uring not usable' >/dev/null
  fi
  "${podman[@]}" healthcheck run "$name" 2> >(grep -v 'systemd connection' >&2)

  # Tailscale's own prober: TLS (the self-signed certificate from /data),
  # STUN, and a packet relayed from the node to itself.
  local probe
  probe=$(in_ns env SSL_CERT_FILE="$data/certs/localhost.selfsigned.crt" \
    timeout 60 "$derpprobe" -derp-map "file://$work/derpmap.json" -once -spread=false 2>&1)
  if grep 'bad: ' <<<"$probe" >&2; then
    echo "$label: derpprobe failed" >&2
    return 1
  fi
  for want_probe in derp/ct/900a/tls derp/ct/900a/udp derp/ct/900a/900a/mesh; do
    grep "good: $want_probe" <<<"$probe" >/dev/null || { echo "$probe" >&2; echo "$label: no passing $want_probe probe" >&2; return 1; }
  done
  in_ns curl -sf http://127.0.0.1:9100/metrics | awk '$1 == "derp_accepts" && $2 >= 2 { ok = 1 } END { exit !ok }'

  # The relay runs as the image's user with exactly one capability.
  local pid status
  pid=$("${podman[@]}" inspect "$name" --format '{{.State.Pid}}')
  status=$(cat "/proc/$pid/status")
  grep -E '^Uid:\s+65532\s+65532\s+65532\s+65532$' <<<"$status" >/dev/null
  for set in CapEff CapPrm CapBnd; do
    # 0x400: CAP_NET_BIND_SERVICE alone.
    grep -E "^$set:\s+0000000000000400$" <<<"$status" >/dev/null || { echo "$label: $(grep "^$set" <<<"$status")" >&2; return 1; }
  done

  local t_stop=$SECONDS
  "${podman[@]}" stop -t 20 "$name" >/dev/null 2> >(grep -v 'systemd connection' >&2)
  local code
  code=$("${podman[@]}" inspect "$name" --format '{{.State.ExitCode}}')
  [ "$code" = 0 ] || { "${podman[@]}" logs "$name" >&2; echo "$label: exit code $code after SIGTERM" >&2; return 1; }
  [ $((SECONDS - t_stop)) -lt 15 ] || { echo "$label: SIGTERM took $((SECONDS - t_stop)) s" >&2; return 1; }
  "${podman[@]}" logs "$name" 2>&1 | tail -n 1 | grep 'INFO stopped$' >/dev/null
  "${podman[@]}" rm "$name" >/dev/null 2> >(grep -v 'systemd connection' >&2)
  echo "$label: ok in $((SECONDS - t0)) s (uid 65532, CAP_NET_BIND_SERVICE only, clean SIGTERM)"
}

run "default seccomp" epoll
key=$(cat "$data/ferry.key")
cert=$(cat "$data/certs/localhost.selfsigned.crt")
[ "$(stat -c %u "$data/ferry.key")" = 65532 ]

want=uring
if [ "$(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null || echo 0)" != 0 ]; then
  echo "kernel.io_uring_disabled is set on this host: expecting epoll under the io_uring profile too"
  want=epoll
fi
run "seccomp-ferry.json, read-only root" "$want" --read-only \
  --security-opt "seccomp=$PWD/packaging/container/seccomp-ferry.json"
[ "$(cat "$data/ferry.key")" = "$key" ] || { echo "the key on /data changed across containers" >&2; exit 1; }
[ "$(cat "$data/certs/localhost.selfsigned.crt")" = "$cert" ] || { echo "the certificate on /data changed across containers" >&2; exit 1; }
echo "container step: $((SECONDS - start)) s"

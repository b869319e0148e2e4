#!/usr/bin/env bash
# Draws the Grafana dashboard's panels over a short load run, for docs/operating.md
# (Grafana is in none of the package registries this project uses): a ferry
# DERP server and UDP relay on loopback, a real Prometheus (from Debian's
# package, .ci/setup.d/48-monitoring.sh) scraping them every second, load
# from ferry-bench (pairs, then stuck receivers) admitted by a stand-in
# admission controller, malformed handshakes and UDP datagrams through the
# relay, then render.py sends each panel's own
# queries to Prometheus and plots the answers.
#
#   packaging/grafana/render.sh [OUT.png]     (default docs/monitoring.png)
#
# Uses the debug builds (a picture of the panels, not a benchmark).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-docs/monitoring.png}
prom_dir=${FERRY_PROMETHEUS_DIR:-$HOME/.cache/ferry-tools/prometheus}
[ -x "$prom_dir/prometheus" ] || bash .ci/setup.d/48-monitoring.sh
cargo build --locked -q -p ferry -p ferry-bench
bin=${CARGO_TARGET_DIR:-$PWD/target}/debug
py=/usr/bin/python3   # Debian's, with python3-matplotlib (.ci/setup.d/40-bench.sh)

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# field FILE MESSAGE KEY: KEY= from the first line of FILE holding MESSAGE,
# waiting up to 20 s for it.
field() {
  for _ in $(seq 200); do
    line=$(grep -m1 "$2" "$1" || true)
    if [ -n "$line" ]; then
      sed -E "s/.* $3=\"?([^ \"]*).*/\1/" <<<"$line"
      return
    fi
    sleep 0.1
  done
  echo "no '$2' in $1:" >&2
  cat "$1" >&2
  exit 1
}
free_port() { "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# An admission controller that admits everyone, as Headscale's /verify
# would admit its own nodes.
verify_port=$(free_port)
"$py" -c '
import http.server, sys
class Verify(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = b"{\"Allow\":true}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Verify).serve_forever()
' "$verify_port" &
pids+=($!)
for _ in $(seq 100); do
  curl -sf -d '{}' "http://127.0.0.1:$verify_port/verify" >/dev/null && break
  sleep 0.1
done
"$bin/ferry" -a 127.0.0.1:0 --stun-port 0 --workers 2 -c "$work/ferry.key" \
  --metrics-addr 127.0.0.1:0 --verify-client-url "http://127.0.0.1:$verify_port/verify" \
  2>"$work/derp.log" &
pids+=($!)
derp=$(field "$work/derp.log" "ferry relay running" url)
derp=${derp%/derp}
derp_metrics=$(field "$work/derp.log" "ferry relay running" metrics)

# A UDP sink that answers every datagram, as the bounce's target.
sink_port=$(free_port)
"$py" -c '
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", int(sys.argv[1])))
while True:
    data, peer = s.recvfrom(2048)
    s.sendto(data, peer)
' "$sink_port" &
pids+=($!)
"$bin/ferry" udp-relay --workers 1 --listen 127.0.0.1:0 --target "127.0.0.1:$sink_port" \
  --metrics-addr 127.0.0.1:0 2>"$work/udp.log" &
pids+=($!)
udp_metrics=$(field "$work/udp.log" "INFO metrics " url)
udp_listen=$(field "$work/udp.log" "listening" addr)

prom_port=$(free_port)
derp_target=${derp_metrics#http://}
udp_target=${udp_metrics#http://}
cat > "$work/prometheus.yml" <<YAML
global: {scrape_interval: 1s}
scrape_configs:
  - job_name: ferry
    static_configs: [{targets: ["${derp_target%/metrics}"]}]
  - job_name: ferry-udp
    static_configs: [{targets: ["${udp_target%/metrics}"]}]
YAML
"$prom_dir/prometheus" --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" --log.level=warn 2>"$work/prometheus.log" &
pids+=($!)
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$prom_port/-/ready" >/dev/null && break
  sleep 0.2
done

start=$(date +%s)
sleep 5
# UDP datagrams through the bounce for 35 s, about 2000 a second.
"$py" -c '
import socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setblocking(False)
end = time.time() + 35
while time.time() < end:
    for _ in range(20):
        s.sendto(b"\x04" + bytes(1199), (host, int(port)))
        try:
            s.recv(2048)
        except BlockingIOError:
            pass
    time.sleep(0.01)
' "$udp_listen" &
pids+=($!)
# Malformed handshakes, two a second.
(for _ in $(seq 70); do
  exec 3<>"/dev/tcp/127.0.0.1/${derp##*:}" && printf 'NOT HTTP\r\n\r\n' >&3 && exec 3>&-
  sleep 0.5
done) &
pids+=($!)
"$bin/ferry-bench" throughput -s "$derp" --peers 8 --rate 50M --warmup 1s --duration 12s --quiet -o "$work/a.json"
"$bin/ferry-bench" throughput -s "$derp" --peers 8 --rate 50M --stuck 2 --warmup 1s --duration 12s --quiet -o "$work/b.json"
sleep 8
end=$(date +%s)

mkdir -p "$(dirname "$out")"
"$py" packaging/grafana/render.py --prometheus "http://127.0.0.1:$prom_port" \
  --start "$start" --end "$end" --var 'derp=.*' --var 'udp=.*' --out "$out" \
  --title "Ferry dashboard panels over a load run ($(date -u +%Y-%m-%d), debug build, $(nproc) cores): pairs at 50 Mbit/s, then with 2 stuck receivers; bad handshakes; UDP bounce"

#!/usr/bin/env bash
# Regenerates the WireGuard handshake fixtures in
# crates/proto/src/wireguard/fixtures/ from real wireguard-go peers.
#
# Topology: fu-cap-a (wireguard-go, peer endpoint = the recorder) <->
# fu-cap-r (a small UDP recorder that forwards to B and writes every datagram
# as hex) <-> fu-cap-b (wireguard-go). After the handshake and a few pings
# (one at full MTU), the recorder floods B with copies of the initiation so
# that B, under load, answers with a real cookie reply. Keys are fresh each
# run and written beside the fixtures (they protect nothing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../../../proto/src/wireguard/fixtures}
. "$here/../../../../scripts/lib/netns.sh"
why=$(fu_why_not wg python3 ping)
[ -z "$why" ] || { echo "capture-fixtures: cannot run: $why" >&2; exit 1; }
fu_init
trap fu_cleanup EXIT
mkdir -p "$out"
d=$FU_TMP

fu_ns fu-cap-a fu-cap-r fu-cap-b
fu_link fu-cap-a 10.77.201.2/24 fu-cap-r 10.77.201.1/24
fu_link fu-cap-b 10.77.202.2/24 fu-cap-r 10.77.202.1/24
fu_key a; fu_key b

cat >"$d/recorder.py" <<'PY'
import socket, select, sys, time
out = sys.argv[1]
a_side = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); a_side.bind(("10.77.201.1", 40000))
b_side = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); b_side.bind(("10.77.202.1", 0))
flood = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); flood.bind(("10.77.202.1", 0))
B = ("10.77.202.2", 51820)
client = None
seen = {}
init = None
def keep(name, data):
    n = seen.get(name, 0)
    if n < 3:
        with open(f"{out}/{name}_{n}.hex", "w") as f:
            f.write(data.hex() + "\n")
    seen[name] = n + 1
def kind(data):
    t = data[0]
    return {1: "initiation", 2: "response", 3: "cookie_reply", 4: "transport"}.get(t, "other")
deadline = time.time() + 60
flooded = False
while time.time() < deadline:
    r, _, _ = select.select([a_side, b_side, flood], [], [], 0.2)
    for s in r:
        data, src = s.recvfrom(65535)
        if s is a_side:
            client = src
            k = kind(data)
            if k == "initiation" and init is None: init = data
            if k == "transport" and len(data) > 1000: k = "transport_big"
            elif k == "transport" and len(data) == 32: k = "keepalive"
            keep("a_to_b_" + k, data)
            b_side.sendto(data, B)
        elif s is b_side:
            k = kind(data)
            if k == "transport" and len(data) > 1000: k = "transport_big"
            elif k == "transport" and len(data) == 32: k = "keepalive"
            keep("b_to_a_" + k, data)
            a_side.sendto(data, client)
        else:
            keep("b_to_flood_" + kind(data), data)
            if kind(data) == "cookie_reply":
                deadline = min(deadline, time.time() + 1)
    try:
        open(out + "/.flood").close()
        if init is not None and not flooded:
            flooded = True
            for _ in range(20000):
                flood.sendto(init, B)
    except FileNotFoundError:
        pass
PY
fu_bg fu-cap-r "$d/recorder.log" python3 "$d/recorder.py" "$d"; rec=$FU_LAST_PID
sleep 0.5
fu_wg fu-cap-a fucapa "$d/a.key" 51820 10.77.200.1/24
fu_wg fu-cap-b fucapb "$d/b.key" 51820 10.77.200.2/24
fu_wg_peer fu-cap-b fucapb "$(fu_pub a)" 10.77.200.1/32
fu_wg_peer fu-cap-a fucapa "$(fu_pub b)" 10.77.200.2/32 10.77.201.1:40000
fu_wait_handshake fu-cap-a fucapa 20
ip netns exec fu-cap-a ping -c 3 -i 0.2 -W 2 10.77.200.2 >/dev/null
ip netns exec fu-cap-a ping -c 2 -i 0.2 -W 2 -s 1392 -M do 10.77.200.2 >/dev/null
touch "$d/.flood"
for _ in $(seq 1 100); do kill -0 "$rec" 2>/dev/null || break; sleep 0.1; done
fu_stop "$rec"

rm -f "$out"/*.hex
for f in "$d"/*.hex; do cp "$f" "$out/"; done
cp "$d/a.pub" "$out/a.public"
cp "$d/b.pub" "$out/b.public"
echo "wireguard-go $("$(fu_wireguard_go)" --version 2>&1 | head -1), captured $(date -u +%Y-%m-%dT%H:%MZ)" >"$out/SOURCE"
ls "$out"

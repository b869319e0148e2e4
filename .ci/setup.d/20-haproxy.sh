# serves: 20
# haproxy, which the interop suite puts in front of the relay to check the
# client addresses it reports (PROXY protocol, X-Forwarded-For).
set -euo pipefail
. "$(dirname "$0")/../apt.sh"
apt_need "the interop proxy tests" haproxy:haproxy

# haproxy, which the interop suite puts in front of the relay to check the
# client addresses it reports (PROXY protocol, X-Forwarded-For).
set -euo pipefail
if command -v haproxy >/dev/null; then
  exit 0
fi
if [ "$(id -u)" = 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy >/dev/null
else
  echo "not root: cannot install haproxy (the interop proxy tests will say so)"
fi

# systemd-analyze, for checking the units in packaging/systemd.
set -euo pipefail
if command -v systemd-analyze >/dev/null; then
  exit 0
fi
if [ "$(id -u)" = 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null
else
  echo "not root: cannot install systemd (scripts/test.d/45-systemd.sh will say so)"
fi

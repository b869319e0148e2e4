# serves: 48
# promtool (and jq), for checking and unit-testing packaging/prometheus in
# scripts/test.d/48-monitoring.sh, and the Prometheus server beside it for
# packaging/grafana/render.sh: both taken out of Debian's prometheus package
# into a cache directory, without installing the package (which would start
# a Prometheus server on :9090).
set -euo pipefail
. "$(dirname "$0")/../apt.sh"
dir=${FERRY_PROMETHEUS_DIR:-$HOME/.cache/ferry-tools/prometheus}
apt_need scripts/test.d/48-monitoring.sh jq:jq
if [ -x "$dir/promtool" ] && [ -x "$dir/prometheus" ]; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
apt-get update -qq
# apt-get download writes into the current directory; _apt may not be
# able to, which only costs a warning.
(cd "$tmp" && apt-get download -qq prometheus 2>&1 | grep -v 'unsandboxed' || true)
dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
mkdir -p "$dir"
install -m 0755 "$tmp/x/usr/bin/promtool" "$tmp/x/usr/bin/prometheus" "$dir/"
"$dir/promtool" --version | sed -n 1p

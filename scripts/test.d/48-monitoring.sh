# The Prometheus alert rules and scrape example in packaging/prometheus:
# promtool checks them and runs the rules' unit tests (each alert fires on
# the series that should fire it, and only there); the Grafana dashboard is
# valid JSON. That every metric they name exists in a real scrape of a
# running DERP server and UDP relay is checked by the Rust suite (step 10:
# crates/ferry/tests/monitoring.rs).
set -euo pipefail
promtool=${FERRY_PROMETHEUS_DIR:-$HOME/.cache/ferry-tools/prometheus}/promtool
if [ ! -x "$promtool" ]; then
  promtool=$(command -v promtool || true)
fi
if [ -z "$promtool" ]; then
  if [ "${CI:-}" = true ]; then
    echo "CI=true: promtool is missing (.ci/setup.d/48-monitoring.sh installs it)" >&2
    exit 1
  fi
  echo "SKIP: promtool is not installed (bash .ci/setup.d/48-monitoring.sh)"
  exit 0
fi
cd packaging/prometheus
"$promtool" check rules ferry-alerts.yaml
"$promtool" test rules ferry-alerts.test.yaml
"$promtool" check config prometheus.yml
cd ../grafana
panels=$(jq '.panels | length' ferry.json)
echo "ferry.json: $panels panels"

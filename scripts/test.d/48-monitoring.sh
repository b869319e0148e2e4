# The Prometheus alert rules and scrape example in packaging/prometheus:
# promtool checks them and runs the rules' unit tests (each alert fires on
# the series that should fire it, and only there); the Grafana dashboard is
# valid JSON. That every metric they name exists in a real scrape of a
# running DERP server and UDP relay is checked by the Rust suite (step 10:
# crates/ferry/tests/monitoring.rs).
set -euo pipefail
. scripts/lib/expect.sh
promtool=${FERRY_PROMETHEUS_DIR:-$HOME/.cache/ferry-tools/prometheus}/promtool
if [ ! -x "$promtool" ]; then
  promtool=$(command -v promtool || true)
fi
if [ -z "$promtool" ]; then
  expect_skip "alert rules (step 48)" "promtool is not installed (bash .ci/setup.d/48-monitoring.sh)" \
    ".ci/setup.d/48-monitoring.sh installs it"
fi
cd packaging/prometheus
"$promtool" check rules ferry-alerts.yaml
"$promtool" test rules ferry-alerts.test.yaml
"$promtool" check config prometheus.yml
cd ../grafana
panels=$(jq '.panels | length' ferry.json)
echo "ferry.json: $panels panels"

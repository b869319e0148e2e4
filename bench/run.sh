#!/usr/bin/env bash
# One command for the Ferry-vs-derper suite: builds Ferry (release) and
# derper (tailscale.com v1.104.7), runs the suites, writes raw JSON, a
# markdown table and PNG plots. See bench/README.md.
#
#   bench/run.sh quick     # smoke test, a couple of minutes
#   bench/run.sh full      # the real measurement, about 29 minutes
#   bench/run.sh soak      # fixed load for 10 minutes, then idle: memory over time
#
# Any further arguments go to the suite (bench/ferrybench/; --help lists
# them) or to bench/soak.py.
set -euo pipefail
cd "$(dirname "$0")/.."
# Plots need matplotlib; Debian's python3-matplotlib lives with /usr/bin/python3,
# which may not be the first python3 on PATH.
py=python3
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null && "$cand" -c 'import matplotlib' 2>/dev/null; then
    py=$cand
    break
  fi
done
if [ "${1:-}" = soak ]; then
  shift
  exec "$py" bench/soak.py "$@"
fi
PYTHONPATH=bench${PYTHONPATH:+:$PYTHONPATH} exec "$py" -m ferrybench "$@"

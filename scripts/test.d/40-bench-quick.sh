# Smoke test of the benchmark suite (bench/run.sh quick): Ferry, derper,
# tuned derper and the ceiling through every suite for a second or so each,
# with the debug builds the earlier steps already made. It checks that the
# tool works and the numbers are sane (packets delivered, loss within
# [0, 1], percentiles ordered, connections held), never a speed target.
set -euo pipefail
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bash bench/run.sh quick --profile dev --out "$out"
test -s "$out/results.md"
test -s "$out/summary.json"

#!/usr/bin/env bash
# Ferry's whole test suite. Each step is a script in scripts/test.d, run in
# name order; any failure stops the run. Set FERRY_TEST_ONLY=NN to run just
# the steps whose name starts with NN.
set -euo pipefail
cd "$(dirname "$0")/.."
for step in scripts/test.d/*.sh; do
  name=$(basename "$step" .sh)
  if [ -n "${FERRY_TEST_ONLY:-}" ] && [[ "$name" != "${FERRY_TEST_ONLY}"* ]]; then
    continue
  fi
  echo "== $name"
  start=$SECONDS
  bash "$step"
  echo "== $name done in $((SECONDS - start)) s"
done

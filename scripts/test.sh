#!/usr/bin/env bash
# Ferry's whole test suite, on a machine already set up (`bash .ci/run`
# sets one up, as root, and then runs this with CI=true). Each step is a
# script in scripts/test.d, run in name order; any failure stops the run.
# FERRY_TEST_ONLY="NN [MM...]" runs just the steps whose names start with
# one of those prefixes (a prefix that names no step is an error).
#
# Every skip is shown with its reason and counted: each step gets its own
# FERRY_SKIP_LOG file, which shell skips (scripts/lib/expect.sh), Go's
# t.Skip (through the same helper) and the Rust tests (ferry_testkit's
# skip!) append "<test>\t<reason>" lines to, and FERRY_BACKEND_LOG, where
# the Rust tests record which I/O back end each relay they started ran on.
# Under CI=true a skip of something the machine should have fails its
# step; without it, skips pass but are listed after the step and at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
export FERRY_TEST_LOGS=${FERRY_TEST_LOGS:-${CARGO_TARGET_DIR:-$PWD/target}/test-logs}
mkdir -p "$FERRY_TEST_LOGS"
FERRY_TEST_LOGS=$(cd "$FERRY_TEST_LOGS" && pwd)

steps=()
for step in scripts/test.d/*.sh; do
  name=$(basename "$step" .sh)
  if [ -n "${FERRY_TEST_ONLY:-}" ]; then
    hit=0
    for p in $FERRY_TEST_ONLY; do [[ "$name" == "$p"* ]] && hit=1; done
    [ $hit = 1 ] || continue
  fi
  steps+=("$name")
done
if [ ${#steps[@]} = 0 ]; then
  echo "FERRY_TEST_ONLY=$FERRY_TEST_ONLY names no step in scripts/test.d" >&2
  exit 2
fi
if [ "${CI:-}" = true ]; then
  echo "== CI=true: a skip of anything this machine should have fails its step"
else
  echo "== CI is not true: skips pass, each listed with its reason (bash .ci/run sets CI=true)"
fi

summary=()
total_skips=0
show_skips() { # show_skips NAME SECONDS: the step's line, its skips and back ends
  local name=$1 secs=$2 n
  n=$(sort -u "$FERRY_SKIP_LOG" | grep -c . || true)
  total_skips=$((total_skips + n))
  echo "== $name: $3 in $secs s, $n skipped"
  sort -u "$FERRY_SKIP_LOG" | awk -F'\t' 'NF { printf "   SKIP %s: %s\n", $1, $2 }'
  if [ -s "$FERRY_BACKEND_LOG" ]; then
    echo "   relays started by the Rust tests, by I/O back end: $(awk -F'\t' 'NF { n[$3]++ } END { for (b in n) { printf "%s%s %d", sep, b, n[b]; sep = ", " } }' "$FERRY_BACKEND_LOG")"
  fi
  summary+=("$(printf '%-18s %5d s  %3d skipped  %s' "$name" "$secs" "$n" "$3")")
}
finish() {
  echo "== summary ($total_skips skipped in all; logs in $FERRY_TEST_LOGS)"
  printf '   %s\n' "${summary[@]}"
}

for name in "${steps[@]}"; do
  export FERRY_SKIP_LOG=$FERRY_TEST_LOGS/$name.skips FERRY_BACKEND_LOG=$FERRY_TEST_LOGS/$name.backends
  : >"$FERRY_SKIP_LOG"
  : >"$FERRY_BACKEND_LOG"
  echo "== $name"
  start=$SECONDS
  rc=0
  bash "scripts/test.d/$name.sh" || rc=$?
  if [ $rc != 0 ]; then
    show_skips "$name" $((SECONDS - start)) "FAILED (exit $rc)"
    finish
    exit $rc
  fi
  show_skips "$name" $((SECONDS - start)) "passed"
done
finish

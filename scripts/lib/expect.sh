# What every test step uses to skip honestly and to check that a run
# selected by name ran what it meant to. Source it (bash), or run it as
# `bash scripts/lib/expect.sh COMMAND ARGS...` where a function cannot be
# called (under `timeout`, in the kernel test VM):
#
#   expect_skip WHAT REASON [HINT]
#       WHAT cannot run here: prints "SKIP WHAT: REASON", records it in
#       $FERRY_SKIP_LOG, and exits 0, except under CI=true (whose machine
#       has everything .ci/setup.d installs), where it exits 1 saying HINT
#       (what installs the missing piece): a failure, not a skip. A skip
#       is never a silent pass.
#   expect_record_skip WHAT REASON
#       Prints and records one skip and returns (for skips that a test
#       run reported, e.g. Go's t.Skip).
#   expect_passed [-k] LOG NAME...
#       Each NAME (a Go test or subtest: TestX, TestX/sub) has a
#       "--- PASS: NAME (" line in LOG, Go's -v output. With -k a NAME that
#       skipped will do too, except under CI=true (the skip is a skip of
#       the step, recorded by whoever read the reason).
#   expect_libtest LOG MIN
#       libtest's summaries in LOG ("test result: ok. N passed; ...") add
#       up to at least MIN passed tests (a name filter that matches nothing
#       passes with 0).
#   expect_run_libtest MIN CMD...        (command: libtest)
#       Runs CMD (cargo test, or a test binary with a filter), its output
#       shown as it comes, then expect_libtest on it.
#   expect_run_passed 'NAME...' CMD...   (command: passed)
#       Runs CMD (a Go test binary with -test.v), then expect_passed.
#   expect_go_test [-v] [-k] LABEL 'NAME...' ARGS...
#       Runs `go test -json ARGS...` (in the current directory), keeps
#       the events in $FERRY_TEST_LOGS/LABEL.json and Go's -v text in
#       LABEL.log, prints the package lines, the output of every failed
#       test and every skip with its reason (recorded as above; the count
#       is left in EXPECT_SKIPS); -v streams the -v text as it comes. It
#       fails unless go test passed, at least one test passed, and every
#       NAME passed (-k: or skipped, as for expect_passed).
#
# $FERRY_SKIP_LOG (scripts/test.sh sets one per step) gets one line per
# skip, "<what>\t<reason>"; the Rust tests write the same lines there
# (ferry_testkit::skip!). $FERRY_TEST_LOGS is where full logs go
# (default: target/test-logs).

expect_skip() {
  if [ "${CI:-}" = true ]; then
    echo "SKIP $1: $2"
    echo "CI=true: $1 must run on this machine${3:+ ($3)}" >&2
    exit 1
  fi
  expect_record_skip "$1" "$2"
  exit 0
}

expect_record_skip() {
  local reason=${2//$'\t'/ }
  reason=${reason//$'\n'/ }
  echo "SKIP $1: $reason"
  if [ -n "${FERRY_SKIP_LOG:-}" ]; then
    printf '%s\t%s\n' "$1" "$reason" >>"$FERRY_SKIP_LOG"
  fi
}

# _expect_line LOG TEXT: a line of LOG starts with TEXT after its
# indentation (subtests are indented). awk reads all of LOG: grep -q in a
# pipe would stop its writer early, which fails the pipe under pipefail.
_expect_line() {
  awk -v t="$2" '{ sub(/^ +/, "") } index($0, t) == 1 { found = 1 } END { exit !found }' "$1"
}

expect_passed() {
  local skip_ok=0
  if [ "$1" = -k ]; then skip_ok=1; shift; fi
  local log=$1 name missing=0
  shift
  for name in "$@"; do
    if _expect_line "$log" "--- PASS: $name ("; then
      continue
    fi
    if _expect_line "$log" "--- SKIP: $name ("; then
      if [ $skip_ok = 1 ] && [ "${CI:-}" != true ]; then continue; fi
      echo "FAIL: $name skipped${CI:+ (CI=$CI)}" >&2
    else
      echo "FAIL: $name did not run (renamed, or filtered out?)" >&2
    fi
    missing=1
  done
  return $missing
}

expect_libtest() {
  local log=$1 min=$2 passed
  passed=$(awk '/^test result: / { for (i = 2; i <= NF; i++) if ($i == "passed;") n += $(i - 1) } END { print n + 0 }' "$log")
  if [ "$passed" -lt "$min" ]; then
    echo "FAIL: $passed tests passed, expected at least $min (a filter that matches nothing passes with 0)" >&2
    return 1
  fi
  echo "$passed tests passed (at least $min expected)"
}

_expect_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
expect_logs() { # the directory for full logs
  local d=${FERRY_TEST_LOGS:-${CARGO_TARGET_DIR:-$_expect_root/target}/test-logs}
  mkdir -p "$d"
  (cd "$d" && pwd)
}

expect_run_libtest() {
  local min=$1 log rc=0
  shift
  log=$(mktemp "${TMPDIR:-/tmp}/ferry-libtest.XXXXXX")
  # The command's own status, with or without pipefail and errexit.
  { "$@" 2>&1 | tee "$log"; rc=${PIPESTATUS[0]}; } || true
  if [ "$rc" = 0 ]; then expect_libtest "$log" "$min" || rc=1; fi
  rm -f "$log"
  return "$rc"
}

expect_run_passed() {
  local names=$1 log rc=0
  shift
  log=$(mktemp "${TMPDIR:-/tmp}/ferry-gotest.XXXXXX")
  { "$@" 2>&1 | tee "$log"; rc=${PIPESTATUS[0]}; } || true
  # shellcheck disable=SC2086 # NAMES is a list
  if [ "$rc" = 0 ]; then expect_passed "$log" $names || rc=1; fi
  rm -f "$log"
  return "$rc"
}

# Per test, from go test's events: its last result (pass, fail, skip) and
# its output, without the === and --- lines Go adds.
_expect_go_results='
  reduce (.[] | select(.Test != null)) as $e ({};
    ($e.Package + " " + $e.Test) as $k
    | if $e.Action == "output" then
        (if ($e.Output | test("^\\s*(=== |--- (PASS|FAIL|SKIP): )")) then . else .[$k].out += [$e.Output] end)
      elif ($e.Action | IN("pass", "fail", "skip")) then
        .[$k].result = $e.Action | .[$k].test = (($e.Package | split("/") | last) + "." + $e.Test)
      else . end)
  | [.[] | select(.result != null)]'

EXPECT_SKIPS=0
expect_go_test() {
  local stream=0 skip_ok=
  while :; do
    case $1 in
      -v) stream=1; shift ;;
      -k) skip_ok=-k; shift ;;
      *) break ;;
    esac
  done
  local label=$1 names=$2 dir json log rc=0 passed
  shift 2
  dir=$(expect_logs)
  json=$dir/$label.json log=$dir/$label.log
  echo "-- go test $* (logs: $log, $json)"
  if [ $stream = 1 ]; then
    { go test -json "$@" | tee "$json" | jq --unbuffered -R -j 'fromjson? // {Action: "output", Output: (. + "\n")} | select(.Action == "output" or .Action == "build-output") | .Output'; rc=${PIPESTATUS[0]}; } || true
  else
    go test -json "$@" >"$json" || rc=$?
  fi
  # Lines that are not events (go vet, a crash of go itself) stay as text.
  jq -R -j 'fromjson? // {Action: "output", Output: (. + "\n")} | select(.Action == "output" or .Action == "build-output") | .Output' "$json" >"$log"
  if [ $stream = 0 ]; then
    # What go test prints without -v: the package lines and build errors.
    jq -R -r 'fromjson? // {Action: "output", Output: .} | select((.Action == "output" and .Test == null) or .Action == "build-output") | .Output | rtrimstr("\n")
      | select(. != "PASS" and . != "FAIL" and (test("^=== |^--- ") | not))' "$json"
    jq -R -s -r '[split("\n")[] | fromjson? | select(type == "object")] | '"$_expect_go_results"' | .[] | select(.result == "fail")
      | "--- FAIL: \(.test)\n\(.out // [] | join(""))"' "$json"
  fi
  EXPECT_SKIPS=0
  local what reason
  while IFS=$'\t' read -r what reason; do
    expect_record_skip "$what" "$reason"
    EXPECT_SKIPS=$((EXPECT_SKIPS + 1))
  done < <(jq -R -s -r '[split("\n")[] | fromjson? | select(type == "object")] | '"$_expect_go_results"' | .[] | select(.result == "skip")
      | "\(.test)\t\(.out // [] | join(" ") | gsub("\\s+"; " ") | ltrimstr(" ") | rtrimstr(" ") | if . == "" then "(no reason given)" else . end)"' "$json")
  if [ "$rc" != 0 ]; then
    echo "FAIL: go test $* (exit $rc)" >&2
    return "$rc"
  fi
  local bad=0
  # shellcheck disable=SC2086 # NAMES is a list
  expect_passed $skip_ok "$log" $names || bad=1
  passed=$(grep -c -- '--- PASS: ' "$log" || true)
  if [ "$passed" = 0 ] && { [ -z "$skip_ok" ] || [ "$EXPECT_SKIPS" = 0 ]; }; then
    echo "FAIL: go test $*: no test passed (a -run pattern that matches nothing passes with \"no tests to run\")" >&2
    bad=1
  fi
  [ $bad = 0 ] || return 1
  echo "-- $passed tests and subtests passed, $EXPECT_SKIPS skipped${names:+; named: $names}"
}

# As a command: bash scripts/lib/expect.sh libtest|passed|skip ARGS...
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  cmd=${1:?usage: expect.sh libtest MIN CMD... | passed NAMES CMD... | skip WHAT REASON [HINT]}
  shift
  case $cmd in
    libtest) expect_run_libtest "$@" ;;
    passed) expect_run_passed "$@" ;;
    skip) expect_skip "$@" ;;
    *) echo "expect.sh: unknown command $cmd" >&2; exit 2 ;;
  esac
fi

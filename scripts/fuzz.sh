#!/usr/bin/env bash
# A fuzzing campaign over Ferry's cargo-fuzz targets (fuzz/).
#
#   scripts/fuzz.sh --minutes N [--jobs K] [--sanitizer S] [TARGET...]
#
# Each target (default: every [[bin]] in fuzz/Cargo.toml) runs as one
# libFuzzer process at `nice -n 19` until it has used N minutes of CPU
# time, read from /proc/<pid>/stat (utime + stime), not wall time; K
# targets run at once, one per core (default: every core). A target that
# gets little CPU on a busy machine is stopped anyway after 20 times its
# budget of wall time (plus a minute), and says so in the table.
#
# New inputs go to a scratch corpus (fuzz/target/campaign/<target>/), never
# straight into the committed seeds. Afterwards the inputs libFuzzer found
# are merged back into fuzz/corpus/<target>/ with `-merge=1`, minimised:
# the named seeds (protocol vectors, regress_* inputs) stay as they are,
# and the fuzzer-found files (named by their SHA-1) are replaced by the
# fewest that keep all the edges the named seeds do not reach. Crash, timeout
# and out-of-memory inputs stay in fuzz/artifacts/<target>/ (gitignored);
# reproduce one with `cd fuzz && cargo +nightly fuzz run TARGET FILE`.
#
# Needs the nightly toolchain and cargo-fuzz (installed here, pinned, when
# missing). The ordinary test suite replays every committed corpus, so
# keep them small: see the replay-time note in fuzz/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

CARGO_FUZZ_VERSION=0.13.2
minutes=
jobs=$(nproc)
sanitizer=none
targets=()

usage() {
  sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=${2:?--minutes needs a value}; shift 2 ;;
    --minutes=*) minutes=${1#*=}; shift ;;
    --jobs|-j) jobs=${2:?--jobs needs a value}; shift 2 ;;
    --jobs=*) jobs=${1#*=}; shift ;;
    --sanitizer) sanitizer=${2:?--sanitizer needs a value}; shift 2 ;;
    --sanitizer=*) sanitizer=${1#*=}; shift ;;
    -h|--help) usage 0 ;;
    -*) echo "unknown option $1" >&2; usage 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ -z "$minutes" ] || ! [[ "$minutes" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
  echo "--minutes N (CPU minutes per target, e.g. 30 or 0.5) is required" >&2
  exit 2
fi
if ! [[ "$jobs" =~ ^[1-9][0-9]*$ ]]; then
  echo "--jobs must be a positive number" >&2
  exit 2
fi

all_targets=$(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^ferry-proto-fuzz$')
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets <<<"$all_targets"
fi
for t in "${targets[@]}"; do
  if ! grep -qx "$t" <<<"$all_targets"; then
    echo "unknown fuzz target $t; targets: $(echo $all_targets)" >&2
    exit 2
  fi
done

# The largest input per target: room for the biggest committed seed and
# for what the target can use, no more (longer inputs only slow it down).
max_len() {
  case "$1" in
    deframer|client|server) echo 80000 ;;
    tls_records|websocket) echo 70000 ;;
    derp_map) echo 65536 ;;
    tls13|tls_record) echo 40000 ;;
    http_request|admission_response) echo 20000 ;;
    hub|sessions|paths|server_info|client_info|forwarded|wireguard) echo 4097 ;;
    *) echo 2048 ;;
  esac
}

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "cargo fuzz needs the nightly toolchain (rustup toolchain install nightly)" >&2
  exit 1
fi
if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
  echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION"
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

echo "== building ${#targets[@]} target(s) (sanitizer $sanitizer)"
(cd fuzz && for t in "${targets[@]}"; do
  cargo +nightly fuzz build -O --debug-assertions --sanitizer "$sanitizer" "$t"
done)
bin_dir=$ROOT/fuzz/target/x86_64-unknown-linux-gnu/release
campaign=$ROOT/fuzz/target/campaign
mkdir -p "$campaign" fuzz/artifacts

hz=$(getconf CLK_TCK)
budget_ticks=$(awk -v m="$minutes" -v hz="$hz" 'BEGIN { printf "%d", m * 60 * hz }')
wall_cap=$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 * 20 + 60 }')

# CPU ticks (user + system) of a process; fields after the command name,
# which may hold spaces, so cut at its closing parenthesis.
cpu_ticks() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  # shellcheck disable=SC2086
  set -- $stat
  echo $(( ${12} + ${13} ))
}

count_files() { find "$1" -maxdepth 1 -type f 2>/dev/null | wc -l; }

# Runs one target for the CPU budget, then merges; writes its table row.
run_target() {
  local t=$1 dir=$campaign/$1 seeds=$ROOT/fuzz/corpus/$1
  local art=$ROOT/fuzz/artifacts/$1 bin=$bin_dir/$1
  rm -rf "$dir" && mkdir -p "$dir/new" "$art" "$seeds"
  local before crashes_before
  before=$(count_files "$seeds")
  crashes_before=$(count_files "$art")
  local start=$SECONDS status=ok
  nice -n 19 "$bin" "$dir/new" "$seeds" \
    -max_len="$(max_len "$t")" -timeout=30 -rss_limit_mb=2048 \
    -artifact_prefix="$art/" -print_final_stats=1 >"$dir/log" 2>&1 &
  local pid=$! ticks=0
  while kill -0 "$pid" 2>/dev/null; do
    ticks=$(cpu_ticks "$pid") || break
    if [ "$ticks" -ge "$budget_ticks" ]; then
      kill -INT "$pid" 2>/dev/null || true
      break
    fi
    if [ $((SECONDS - start)) -ge "$wall_cap" ]; then
      status=wall-capped
      kill -INT "$pid" 2>/dev/null || true
      break
    fi
    sleep 1
  done
  local rc=0
  wait "$pid" || rc=$?
  # libFuzzer exits 0 (or 72 after an interrupt) unless it found a crash.
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 72 ] && [ "$rc" -ne 130 ]; then
    status="exit $rc"
  fi
  local execs
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)

  # Merge: named seeds first, then the fewest fuzzer-found inputs (old and
  # new) that add coverage to them. Coverage here is edges only (no hit
  # counts): counting them keeps several times more files, and the suite
  # replays every one in a debug build.
  mkdir -p "$dir/merged" "$dir/found"
  find "$seeds" -maxdepth 1 -type f -regextype posix-extended -regex '.*/[0-9a-f]{40}' \
    -exec mv {} "$dir/found/" \;
  cp -p "$seeds"/* "$dir/merged/" 2>/dev/null || true
  if nice -n 19 "$bin" -merge=1 -use_counters=0 -max_len="$(max_len "$t")" -timeout=30 \
    -rss_limit_mb=2048 "$dir/merged" "$dir/found" "$dir/new" >"$dir/merge.log" 2>&1; then
    find "$dir/merged" -maxdepth 1 -type f -regextype posix-extended -regex '.*/[0-9a-f]{40}' \
      -exec cp -p {} "$seeds/" \;
  else
    # Keep what was committed if the merge itself failed.
    cp -p "$dir/found"/* "$seeds/" 2>/dev/null || true
    status="$status, merge failed"
  fi
  local after crashes
  after=$(count_files "$seeds")
  crashes=$(( $(count_files "$art") - crashes_before ))
  awk -v t="$t" -v ticks="${ticks:-0}" -v hz="$hz" -v e="${execs:-?}" \
    -v b="$before" -v a="$after" -v c="$crashes" -v s="$status" \
    'BEGIN { printf "%-20s %8.2f %14s %8s %8s %8d  %s\n", t, ticks / hz / 60, e, b, a, c, s }' \
    >"$dir/row"
}

echo "== fuzzing ${#targets[@]} target(s), $minutes CPU minute(s) each, $jobs at a time"
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  echo "   $t"
  run_target "$t" &
  running=$((running + 1))
done
wait || true

printf '\n%-20s %8s %14s %8s %8s %8s  %s\n' target cpu-min execs "seeds<" "seeds>" crashes status
total_crashes=0
for t in "${targets[@]}"; do
  row=$campaign/$t/row
  if [ -f "$row" ]; then
    cat "$row"
    total_crashes=$((total_crashes + $(awk '{ print $6 }' "$row")))
  else
    printf '%-20s %s\n' "$t" "no result (see $campaign/$t/log)"
    total_crashes=$((total_crashes + 1))
  fi
done
echo
echo "corpora: fuzz/corpus/<target>/ (commit them); crash inputs: fuzz/artifacts/<target>/"
if [ "$total_crashes" -gt 0 ]; then
  echo "$total_crashes crash(es) or failed target(s)" >&2
  exit 1
fi

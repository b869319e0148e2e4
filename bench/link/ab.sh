#!/usr/bin/env bash
# Two `ferry` binaries through the `ferry link` bench, interleaved: each
# repeat runs run.sh once per binary (the order swapped every repeat, so
# drift in the machine's load falls on both), and the medians with their
# min–max are printed per case and binary. The links' CPU per Gbit/s (their
# CPU from /proc/PID/stat over the bytes moved) is the figure to compare on
# a shared machine; throughput moves with whatever else runs.
#
#   sudo bash bench/link/ab.sh OLD_FERRY NEW_FERRY
#   sudo bash bench/link/ab.sh OLD NEW --repeats 5 --duration 10 --cases "wg-direct link-direct link-relay"
#
# Every run's JSON (run.sh's document) goes to --out DIR (default: a new
# directory under /tmp), with ab.json, the medians, beside them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 2 ] || { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
old=$1 new=$2
shift 2
repeats=5 duration=10 cases="wg-direct link-direct link-relay" out=""
while [ $# -gt 0 ]; do
  case $1 in
    --repeats) repeats=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
for b in "$old" "$new"; do [ -x "$b" ] || { echo "no ferry binary at $b" >&2; exit 1; }; done
[ -n "$out" ] || out=$(mktemp -d /tmp/link-ab.XXXXXX)
mkdir -p "$out"
for r in $(seq 1 "$repeats"); do
  order="old new"
  [ $((r % 2)) -eq 0 ] && order="new old"
  for which in $order; do
    bin=$old
    [ "$which" = new ] && bin=$new
    doc="$out/$which-$r.json"
    echo "== repeat $r/$repeats: $which ($bin)"
    if ! FERRY_BIN=$bin bash "$here/run.sh" local --no-build --duration "$duration" \
      --cases "$cases" --out "$doc" >"$out/$which-$r.log" 2>&1; then
      echo "   run.sh failed (its log: $out/$which-$r.log); this run is left out" >&2
    fi
  done
done
# Medians (and min, max) per case and binary over the runs that gave a
# figure; a case with no figure in any run says so instead of a number.
jq -s '
  def stats: sort as $s | ($s | length) as $n | if $n == 0 then null
    else {median: (if $n % 2 == 1 then $s[($n - 1) / 2] else ($s[$n / 2 - 1] + $s[$n / 2]) / 2 end),
          min: $s[0], max: $s[-1], n: $n} end;
  [ .[] | .binary as $b | .results[] | . + {binary: $b} ]
  | group_by([.case, .binary])
  | map({case: .[0].case, binary: .[0].binary,
         mbit_s: (map(.mbit_s // empty) | stats),
         link_cores_per_gbit_s: (map(.link_cores_per_gbit_s // empty) | stats),
         relay_cores_per_gbit_s: (map(.relay_cores_per_gbit_s // empty) | stats),
         errors: (map(.error // empty))})' \
  <(for f in "$out"/old-*.json; do [ -f "$f" ] && jq '. + {binary: "old"}' "$f"; done
    for f in "$out"/new-*.json; do [ -f "$f" ] && jq '. + {binary: "new"}' "$f"; done) >"$out/ab.json"
{
  printf 'case\tbinary\tMbit/s median (min-max)\tlinks cores per Gbit/s median (min-max)\truns\n'
  jq -r '.[] | def f(s): if s == null then "none" else "\(s.median) (\(s.min)-\(s.max))" end;
    "\(.case)\t\(.binary)\t\(f(.mbit_s))\t\(f(.link_cores_per_gbit_s))\t\(.mbit_s.n // 0)"' "$out/ab.json"
} | column -t -s $'\t'
echo "runs and ab.json in $out"

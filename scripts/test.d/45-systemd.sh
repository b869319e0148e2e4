# The systemd units in packaging/systemd: `systemd-analyze verify` must be
# clean (with ExecStart pointing at the binary just built), and the
# hardening keeps `systemd-analyze security`'s exposure at 2.0 or below
# (the README quotes the figures).
set -euo pipefail
. scripts/lib/expect.sh
cargo build --locked -p ferry
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
if ! command -v systemd-analyze >/dev/null; then
  expect_skip "systemd units (step 45)" "systemd-analyze is not installed" ".ci/setup.d/45-systemd.sh installs systemd"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
units="ferry ferry-udp-relay ferry-link"
for unit in $units; do
  sed "s|/usr/bin/ferry|$target_dir/debug/ferry|" "packaging/systemd/$unit.service" > "$work/$unit.service"
done
cp packaging/systemd/ferry.socket "$work/ferry.socket"
systemd-analyze verify "$work/ferry.service" "$work/ferry-udp-relay.service" "$work/ferry-link.service" "$work/ferry.socket"
for unit in $units; do
  line=$(systemd-analyze security --offline=true "$work/$unit.service" | grep 'Overall exposure level')
  echo "$line"
  level=$(echo "$line" | sed -E 's/.*: ([0-9.]+) .*/\1/')
  if ! awk -v l="$level" 'BEGIN { exit !(l <= 2.0) }'; then
    echo "$unit.service: exposure $level is above 2.0" >&2
    exit 1
  fi
done

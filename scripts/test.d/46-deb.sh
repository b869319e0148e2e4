# The Debian package: packaging/deb/build.sh builds it (here from the debug
# binary, stripped), dpkg installs it into a scratch root, and the
# installed binary, units, default file and man page are checked.
set -euo pipefail
. scripts/lib/expect.sh
# grep reads its whole input here (no -q): under pipefail an early exit
# would kill the writer with SIGPIPE and fail the step.
cargo build --locked -p ferry
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
if ! command -v dpkg-deb >/dev/null; then
  expect_skip "Debian package (step 46)" "dpkg-deb is not installed (not a Debian system)" "CI runs on Debian"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
deb=$(bash packaging/deb/build.sh "$target_dir/debug/ferry" "$work/out")
dpkg-deb --info "$deb" | grep '^ Package: ferry$' >/dev/null
root="$work/root"
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates"
touch "$root/var/lib/dpkg/status"
dpkg --root="$root" --force-script-chrootless --force-depends --log=/dev/null -i "$deb" >/dev/null
dpkg --root="$root" -s ferry | grep '^Status: install ok installed$' >/dev/null
"$root/usr/bin/ferry" --version | grep '^ferry ' >/dev/null
for f in lib/systemd/system/ferry.service lib/systemd/system/ferry-udp-relay.service lib/systemd/system/ferry.socket \
         lib/systemd/system/ferry-link.service etc/default/ferry usr/share/doc/ferry/copyright; do
  [ -f "$root/$f" ] || { echo "missing /$f in the package" >&2; exit 1; }
done
zcat "$root/usr/share/man/man1/ferry.1.gz" | grep '^\.TH FERRY 1' >/dev/null
# Every service and tool has its section.
for section in 'DERP SERVER' UDP-RELAY LINK STATUS CHECK-CONFIG; do
  zcat "$root/usr/share/man/man1/ferry.1.gz" | grep "^\.SH $section\$" >/dev/null || { echo "the man page has no $section section" >&2; exit 1; }
done
# Depends names the libraries the binary links, with versions.
depends=$(dpkg-deb --field "$deb" Depends)
echo "Depends: $depends"
case "$depends" in
  *"libc6 (>="*) ;;
  *) echo "Depends lacks a versioned libc6: $depends" >&2; exit 1 ;;
esac
# Started with its defaults (the unit's ExecStart, /etc/default/ferry as
# shipped, the state directory systemd gives it), ferry must not run ACME
# for localhost on :443: it stops at once, saying what to set.
exec_start=$(sed -n 's/^ExecStart=//p' "$root/lib/systemd/system/ferry.service")
FERRY_ARGS=unset
# shellcheck disable=SC1091
. "$root/etc/default/ferry"
[ "$FERRY_ARGS" != unset ] || { echo "/etc/default/ferry sets no FERRY_ARGS" >&2; exit 1; }
exec_start=${exec_start//\$FERRY_ARGS/$FERRY_ARGS}
exec_start=${exec_start//\/usr\/bin\/ferry/$root/usr/bin/ferry}
mkdir -p "$work/state"
set +e
# shellcheck disable=SC2086
started=$(STATE_DIRECTORY="$work/state" timeout 10 $exec_start 2>&1)
status=$?
set -e
if [ "$status" != 1 ] || ! echo "$started" | grep -- '--hostname localhost: --certmode letsencrypt' >/dev/null; then
  echo "started with the package's defaults, ferry did not stop naming --hostname (exit $status):" >&2
  echo "$started" >&2
  exit 1
fi
echo "$(basename "$deb"): $(du -h "$deb" | cut -f1), installed into a scratch root; $("$root/usr/bin/ferry" --version)"

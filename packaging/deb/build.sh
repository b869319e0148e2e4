#!/usr/bin/env bash
# Builds ferry_<version>_<arch>.deb from a ferry binary: the binary, the
# systemd units, /etc/default/ferry, a man page made from --help, and the
# licence. No maintainer scripts: the units use DynamicUser, so there is
# no user to create; enable them with systemctl after installing.
#
#   packaging/deb/build.sh [FERRY_BIN] [OUT_DIR]
#
# FERRY_BIN defaults to target/release/ferry (cargo build --release -p ferry).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-target/release/ferry}
out=${2:-target/deb}
[ -x "$bin" ] || { echo "no ferry binary at $bin (cargo build --release -p ferry)" >&2; exit 1; }
version=$("$bin" --version | awk '{print $2}')
arch=$(dpkg --print-architecture)
root=$(mktemp -d)
chmod 0755 "$root"
trap 'rm -rf "$root"' EXIT

# Stripped, as Debian ships binaries.
install -D -s -m 0755 "$bin" "$root/usr/bin/ferry"
install -D -m 0644 packaging/systemd/ferry.service "$root/lib/systemd/system/ferry.service"
install -D -m 0644 packaging/systemd/ferry-udp-relay.service "$root/lib/systemd/system/ferry-udp-relay.service"
install -D -m 0644 packaging/systemd/ferry-link.service "$root/lib/systemd/system/ferry-link.service"
install -D -m 0644 packaging/systemd/ferry.socket "$root/lib/systemd/system/ferry.socket"
install -D -m 0644 packaging/deb/default-ferry "$root/etc/default/ferry"
install -D -m 0644 LICENSE "$root/usr/share/doc/ferry/copyright"

# A man page from the help texts (roff, preformatted sections).
man="$root/usr/share/man/man1/ferry.1"
mkdir -p "$(dirname "$man")"
{
  echo ".TH FERRY 1 \"$(date -u +%Y-%m-%d)\" \"ferry $version\" \"User Commands\""
  echo ".SH NAME"
  echo "ferry \\- DERP relay for Tailscale, and UDP relay for WireGuard"
  for sub in "" "udp-relay" "link" "status" "check-config"; do
    if [ -z "$sub" ]; then echo ".SH DERP SERVER"; else echo ".SH ${sub^^}"; fi
    echo ".nf"
    # shellcheck disable=SC2086
    "$bin" $sub --help | sed -e 's/\\/\\\\/g' -e 's/^\./\\\&./'
    echo ".fi"
  done
} > "$man"
gzip -9n "$man"

# Depends from the libraries the binary links, as dpkg-shlibdeps finds
# them (it wants a debian/control beside it).
shlib=$(mktemp -d)
mkdir -p "$shlib/debian"
printf 'Source: ferry\n\nPackage: ferry\nArchitecture: any\n' > "$shlib/debian/control"
depends=$(cd "$shlib" && dpkg-shlibdeps -O -e "$root/usr/bin/ferry" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
rm -rf "$shlib"
[ -n "$depends" ] || { echo "dpkg-shlibdeps found no dependencies for $bin" >&2; exit 1; }

size=$(du -ks "$root" | cut -f1)
mkdir -p "$root/DEBIAN"
cat > "$root/DEBIAN/control" <<CONTROL
Package: ferry
Version: $version
Architecture: $arch
Maintainer: Ferry <ferry@localhost>
Installed-Size: $size
Depends: $depends
Section: net
Priority: optional
Description: DERP relay for Tailscale and UDP relay for WireGuard
 A drop-in replacement for Tailscale's derper (same flags, ACME
 certificates, admission, mesh peers accepted) and a UDP relay that
 forwards stock WireGuard without decrypting anything.
CONTROL
echo "/etc/default/ferry" > "$root/DEBIAN/conffiles"
mkdir -p "$out"
deb="$out/ferry_${version}_${arch}.deb"
dpkg-deb --root-owner-group --build "$root" "$deb" >/dev/null
echo "$deb"

#!/usr/bin/env bash
# Assembles the build context of Ferry's container image: rootfs.tar (the
# whole root filesystem, nothing from an image registry) and the
# Containerfile, which starts FROM scratch and adds that archive.
#
#   packaging/container/build.sh [FERRY_BIN] [OUT_DIR]
#   podman build --format docker -t ferry OUT_DIR     # or: docker build -t ferry OUT_DIR
#
# FERRY_BIN defaults to the release binary (cargo build --release -p
# ferry). A dynamically linked binary (the glibc target) gets the
# libraries ldd lists, copied from this host, beside it; a static one
# (cargo build --release --target x86_64-unknown-linux-musl -p ferry)
# stands alone with the CA bundle and two passwd lines. The binary is stripped and given the file capability
# cap_net_bind_service (ports 80 and 443 as a non-root user), which the
# archive carries as an extended attribute: COPY from a build context
# drops it in some builders, ADD of a tar keeps it. Needs root (setcap,
# and the owner of /data in the archive). Prints OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-target/release/ferry}
out=${2:-target/container}
[ -x "$bin" ] || { echo "no ferry binary at $bin (cargo build --release -p ferry)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "build.sh needs root: setcap and the owner of /data" >&2; exit 1; }
command -v setcap >/dev/null || { echo "setcap is missing (Debian: libcap2-bin)" >&2; exit 1; }
# The user the relay runs as (the same number distroless images use for
# their non-root user); the Containerfile's USER line names it too.
uid=65532
ca=/etc/ssl/certs/ca-certificates.crt
[ -f "$ca" ] || { echo "no CA bundle at $ca (Debian: ca-certificates)" >&2; exit 1; }

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
chmod 0755 "$root"
install -D -s -m 0755 "$bin" "$root/usr/bin/ferry"
setcap cap_net_bind_service=+ep "$root/usr/bin/ferry"
# Libraries of a dynamically linked binary, at the paths ldd gives (the
# loader included); a static binary has none (ldd names no path for a
# static PIE, and fails for a plain static binary).
libs=$(ldd "$bin" 2>/dev/null | grep -oE '/[^ ]+' || true)
if [ -n "$libs" ]; then
  for lib in $libs; do
    install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
  done
  # glibc reads this for host name lookups (ACME, --verify-client-url).
  install -D -m 0644 /dev/stdin "$root/etc/nsswitch.conf" <<<'hosts: files dns'
fi
install -D -m 0644 "$ca" "$root$ca"
install -D -m 0644 /dev/stdin "$root/etc/passwd" <<PASSWD
root:x:0:0:root:/root:/sbin/nologin
ferry:x:$uid:$uid:ferry:/data:/sbin/nologin
PASSWD
install -D -m 0644 /dev/stdin "$root/etc/group" <<GROUP
root:x:0:
ferry:x:$uid:
GROUP
install -d -m 0700 -o "$uid" -g "$uid" "$root/data"
install -d -m 1777 "$root/tmp"

mkdir -p "$out"
tar --xattrs --xattrs-include=security.capability --numeric-owner --sort=name \
    --mtime=@0 -C "$root" -cf "$out/rootfs.tar" .
cp packaging/container/Containerfile "$out/Containerfile"
echo "$out"

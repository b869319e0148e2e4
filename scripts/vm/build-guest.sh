#!/usr/bin/env bash
# Builds the kernel test VM's guest from Debian packages and prints the
# directory that holds it:
#
#   vmlinuz      Debian's linux-image-amd64 kernel (the 6.1 series, Debian 12's;
#                FERRY_VM_KERNEL_SERIES names another)
#   initrd.img   busybox-static, the modules that mount the root, init.sh
#   modules/     the kernel's whole /lib/modules tree (with modules.dep),
#                which the guest mounts over its /lib/modules
#
# The guest's root is the host's own root, read-only over virtio-9p with a
# RAM overlay on top (see init.sh): the test binaries, bash, ip, wg, iperf3
# and glibc are the host's, and only the kernel is the guest's own.
#
# Packages come from the machine's apt sources (apt-get download; nothing
# else is fetched). The result is kept in ~/.cache/ferry-tools/vm/<key>,
# where the key hashes the package versions and this directory's scripts;
# a second run with the same inputs prints the cached directory at once.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${FERRY_VM_CACHE:-$HOME/.cache/ferry-tools/vm}

# linux-image-amd64 is a metapackage: the kernel is what it depends on.
kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
[ -n "$kpkg" ] || { echo "build-guest: apt knows no linux-image-amd64 (apt-get update?)" >&2; exit 1; }
# The kernel series the VM's tests are written for: 6.1 (Debian 12's),
# which has the tls and wireguard modules but cannot rekey kTLS in the
# kernel (6.14 can: the tests accept that refusal). Security updates move
# within the series (linux-image-6.1.0-N-amd64, e.g. N = 56 and Debian
# version 6.1.192-2 on 2026-11-28); another series (another Debian
# release's apt sources) changes what the tests see, so it stops here
# unless FERRY_VM_KERNEL_SERIES says to take it.
series=${FERRY_VM_KERNEL_SERIES:-6.1}
case $kpkg in
  "linux-image-$series."*) ;;
  *) echo "build-guest: apt's linux-image-amd64 is $kpkg, not a $series kernel (FERRY_VM_KERNEL_SERIES=$(sed -E 's/^linux-image-([0-9]+[.][0-9]+).*/\1/' <<<"$kpkg") takes it)" >&2; exit 1 ;;
esac
kver=$(apt-cache policy "$kpkg" | awk '/Candidate:/ { print $2 }')
bver=$(apt-cache policy busybox-static | awk '/Candidate:/ { print $2 }')
[ -n "$bver" ] && [ "$bver" != "(none)" ] || { echo "build-guest: apt knows no busybox-static" >&2; exit 1; }
key=$( (echo "$kpkg=$kver busybox-static=$bver"; cat "$here/build-guest.sh" "$here/init.sh") | sha256sum | cut -c1-16)
out=$cache/$key
if [ -f "$out/ok" ]; then
  echo "$out"
  exit 0
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ferry-guest.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
echo "build-guest: $kpkg $kver, busybox-static $bver -> $out" >&2
apt-get -q -o APT::Sandbox::User=root download "$kpkg=$kver" "busybox-static=$bver" >&2
dpkg-deb -x "$kpkg"_*.deb kernel
dpkg-deb -x busybox-static_*.deb busybox
uname_r=$(ls kernel/lib/modules)
[ "$(echo "$uname_r" | wc -w)" = 1 ] || { echo "build-guest: expected one module tree, got: $uname_r" >&2; exit 1; }
depmod -b kernel "$uname_r"

# The initramfs: busybox and the modules init.sh loads to reach the root.
mkdir -p initrd/bin initrd/proc initrd/sys initrd/dev initrd/lower initrd/rw initrd/newroot initrd/lib/modules
cp busybox/bin/busybox initrd/bin/busybox
for app in sh mount mkdir insmod switch_root cat echo; do ln -s busybox "initrd/bin/$app"; done
cp "$here/init.sh" initrd/init
chmod 755 initrd/init
# Load order, dependencies first, as `modprobe --show-depends` prints it.
modprobe -d kernel -S "$uname_r" --show-depends -a virtio_pci 9pnet_virtio 9p overlay |
  awk '$1 == "insmod" { print $2 }' | awk '!seen[$0]++' >order
: >initrd/modules
while read -r ko; do
  name=$(basename "$ko")
  cp "$ko" "initrd/lib/modules/$name"
  echo "/lib/modules/$name" >>initrd/modules
done <order
(cd initrd && find . | cpio -o -H newc --quiet) >initrd.img

mkdir -p "$out.tmp"
cp "kernel/boot/vmlinuz-$uname_r" "$out.tmp/vmlinuz"
mv initrd.img "$out.tmp/initrd.img"
mkdir -p "$out.tmp/modules"
mv "kernel/lib/modules/$uname_r" "$out.tmp/modules/"
echo "$kpkg $kver $uname_r" >"$out.tmp/ok"
rm -rf "$out"
mv "$out.tmp" "$out"
# Older guests (other inputs) are not used again.
find "$cache" -mindepth 1 -maxdepth 1 ! -name "$key" -exec rm -rf {} +
echo "$out"

# serves: 55
# The kernel test VM (scripts/test.d/55-vm.sh): QEMU (KVM or TCG), what
# scripts/vm/build-guest.sh needs to make the guest from Debian packages
# (apt-get download of the kernel and busybox-static; dpkg-deb, depmod,
# cpio), jq for the test step, and then the guest itself, built here and
# cached (~/.cache/ferry-tools/vm), so that the step only boots it. The
# guest also uses the host's wg, iperf3, ip and ping (10-netns.sh) and
# derper (10-derper.sh).
set -euo pipefail
. "$(dirname "$0")/../apt.sh"
apt_need scripts/test.d/55-vm.sh qemu-system-x86_64:qemu-system-x86 depmod:kmod cpio:cpio xz:xz-utils jq:jq
if [ "$(id -u)" != 0 ]; then
  echo "not root: cannot build the guest (scripts/test.d/55-vm.sh will say so)"
  exit 0
fi
# build-guest.sh asks apt which kernel linux-image-amd64 is: it needs the
# package lists, which a fresh machine has not fetched yet.
if [[ "$(apt-cache policy linux-image-amd64 2>/dev/null)" != *"Candidate: "[0-9]* ]]; then
  apt-get -o DPkg::Lock::Timeout=600 update -qq
fi
guest=$(bash "$(dirname "$0")/../../scripts/vm/build-guest.sh")
echo "kernel test VM guest: $guest ($(cat "$guest/ok"))"

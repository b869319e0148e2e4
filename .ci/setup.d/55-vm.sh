# The kernel test VM (scripts/test.d/55-vm.sh): QEMU (KVM or TCG), and what
# scripts/vm/build-guest.sh needs to make the guest from Debian packages
# (apt-get download of the kernel and busybox-static; dpkg-deb, depmod,
# cpio), and jq for the test step. The guest itself is built on first use
# and cached. Step 55's guest also uses what 30-udp.sh installs (wg,
# iperf3, ip, ping).
set -euo pipefail
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v depmod >/dev/null || need+=(kmod)
command -v cpio >/dev/null || need+=(cpio)
command -v xz >/dev/null || need+=(xz-utils)
command -v jq >/dev/null || need+=(jq)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
else
  echo "not root: cannot install ${need[*]} (scripts/test.d/55-vm.sh will say so)"
fi

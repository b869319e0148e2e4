#!/bin/sh
# PID 1 of the kernel test VM (busybox sh, from the initramfs that
# build-guest.sh makes). It mounts the host's root, shared read-only by
# QEMU as virtio-9p tag `hostroot`, under a RAM overlay, puts the guest
# kernel's module tree (ferry_modules=, a host path) on /lib/modules, and
# hands over to the host's bash running ferry_run= (a host path) as PID 1.
# Whatever goes wrong is printed to the serial console with the marker
# that scripts/test.d/55-vm.sh looks for, and the VM powers off.
export PATH=/bin
fail() {
  echo "ferry-vm: init failed: $*"
  echo o >/proc/sysrq-trigger
  sleep 10
}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for ko in $(cat /modules); do
  insmod "$ko" || fail "insmod $ko"
done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /lower ||
  fail "cannot mount the host's root over 9p"
mount -t tmpfs -o mode=755 tmpfs /rw || fail "tmpfs"
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot ||
  fail "cannot mount the overlay root"
[ -d "/newroot$ferry_modules" ] || fail "no module tree at $ferry_modules"
mkdir -p "/newroot/lib/modules/$(basename "$ferry_modules")"
mount -o bind "/newroot$ferry_modules" "/newroot/lib/modules/$(basename "$ferry_modules")" ||
  fail "cannot bind the module tree"
[ -f "/newroot$ferry_run" ] || fail "no guest script at $ferry_run"
for d in proc sys dev; do
  mount -o move "/$d" "/newroot/$d" || fail "move /$d"
done
exec switch_root /newroot /bin/bash "$ferry_run"

# The kernel test VM: Debian's own kernel (linux-image-amd64, 6.1, with the
# tls and wireguard modules this host's kernel lacks) booted in QEMU with
# the host's root read-only over 9p (scripts/vm/). Inside it: the relay's
# real kTLS tests with FERRY_REQUIRE_KTLS=1 on epoll and io_uring, the
# ferry binary with --ktls on under ferry-bench's TLS load and against
# Tailscale's own DERP client (interop TestKernelTLS), and the UDP relay's
# and `ferry link`'s namespace tests with kernel WireGuard peers
# (scripts/vm/guest.sh). Each check's result comes back on the serial
# console; the step fails unless the guest reports all passed. CI=true
# goes into the guest with the plan, so a skip in there fails its check;
# every skip the guest reports is counted in this step's skips. Without
# QEMU it says why and skips; under CI=true that is a failure, and so is a
# guest that does not start or finish. The checkout may be anywhere,
# /tmp included (the guest binds what the plan names back over its own
# fresh /tmp).
#
# Acceleration: KVM (-enable-kvm -cpu host) where /dev/kvm is hardware
# virtualisation (kvm_intel, kvm_amd); otherwise TCG, saying why. This
# project's machines serve /dev/kvm with kvm_pvm, which runs only
# PVM-enabled guest kernels: Debian's kernel needs 20 s there just to reach
# memory set-up, while TCG boots it in 5 s. FERRY_VM_ACCEL=kvm|tcg forces one.
set -euo pipefail
. scripts/lib/expect.sh
skip() { expect_skip "kernel test VM (step 55)" "$1" ".ci/setup.d/55-vm.sh installs QEMU"; }
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 not found (.ci/setup.d/55-vm.sh installs it)"
[ "$(id -u)" = 0 ] || skip "not root (the guest reads the host's root over 9p as root)"

# FERRY_VM_ONLY=REGEX runs only the guest's checks whose names match (to
# look into one by hand); CI runs them all.
# FERRY_VM_HOG=N: N busy loops in the guest, to slow it as a loaded host
# does (scripts/vm/guest.sh).
if [ -n "${FERRY_VM_ONLY:-}${FERRY_VM_HOG:-}" ] && [ "${CI:-}" = true ]; then
  echo "FERRY_VM_ONLY and FERRY_VM_HOG are for runs by hand; CI runs every check as it is" >&2
  exit 1
fi
accel=${FERRY_VM_ACCEL:-auto}
if [ "$accel" = auto ]; then
  if [ ! -w /dev/kvm ]; then
    accel=tcg why="no usable /dev/kvm"
  elif [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; then
    accel=kvm why="hardware KVM"
  elif [ -d /sys/module/kvm_pvm ]; then
    accel=tcg why="/dev/kvm is kvm_pvm, which runs only PVM-enabled guest kernels"
  else
    accel=tcg why="/dev/kvm is neither kvm_intel nor kvm_amd"
  fi
else
  why="FERRY_VM_ACCEL=$accel"
fi
case $accel in
  kvm) accel_args=(-enable-kvm -cpu host) ;;
  tcg) accel_args=(-accel tcg,thread=multi -cpu max) ;;
  *) echo "FERRY_VM_ACCEL: kvm, tcg or auto, not $accel" >&2; exit 1 ;;
esac
echo "accelerator: $accel ($why)"

target=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --locked -q -p ferry -p ferry-bench
cargo build --locked -q -p ferry-engine --example uring_probe
# The same build as 10-rust.sh's (the whole workspace, so nothing is
# rebuilt), to find the executables of the tests the guest runs.
json=$(cargo test --workspace --locked -q --no-run --message-format=json)
exe() { # exe TARGET-NAME: the test executable cargo built for it
  local e
  e=$(jq -r --arg n "$1" 'select(.reason == "compiler-artifact" and .profile.test and .target.name == $n) | .executable' <<<"$json" | tail -n 1)
  [ -x "$e" ] || { echo "no test executable for $1" >&2; return 1; }
  echo "$e"
}
# Tailscale's client code (the interop suite's TestKernelTLS, built as a
# test binary), and derper for the ferry link test (set-up builds it:
# .ci/setup.d/10-derper.sh, which does nothing when it is up to date).
interop_test=$target/vm/interop.test
mkdir -p "$target/vm"
(cd interop && go test -c -o "$interop_test" .)
bash .ci/setup.d/10-derper.sh
# The guest: set-up builds it (.ci/setup.d/55-vm.sh); this prints the
# cached one at once, or builds it (about 30 s) when its inputs changed.
guest=$(bash scripts/vm/build-guest.sh)
plan=$target/vm/plan.sh
sys_lib=$(exe ferry_sys)
relay_lib=$(exe ferry_derp)
ktls_rx=$(exe ktls_rx)
ktls=$(exe ktls)
tls_relay=$(exe tls_relay)
cat >"$plan" <<PLAN
CI=${CI:-}
FERRY_ROOT=$PWD
FERRY_VM_ACCEL=$accel
FERRY_BIN=$target/debug/ferry
BENCH_DEBUG=$target/debug/ferry-bench
URING_PROBE=$target/debug/examples/uring_probe
SYS_LIB=$sys_lib
RELAY_LIB=$relay_lib
KTLS_RX=$ktls_rx
KTLS=$ktls
TLS_RELAY=$tls_relay
INTEROP_TEST=$interop_test
DERPER_BIN=$PWD/interop/bin/derper
FERRY_VM_ONLY='${FERRY_VM_ONLY:-}'
FERRY_VM_HOG='${FERRY_VM_HOG:-}'
PLAN
# FERRY_VM_BENCH=1: kTLS against userspace TLS too, with release builds
# (not in CI: the figures go to the README, nothing asserts a speed).
if [ "${FERRY_VM_BENCH:-}" = 1 ]; then
  cargo build --release --locked -q -p ferry -p ferry-bench
  printf 'BENCH_FERRY=%s\nBENCH_CLIENT=%s\n' "$target/release/ferry" "$target/release/ferry-bench" >>"$plan"
fi

log=$target/vm/serial.log
modules=$(ls -d "$guest"/modules/*)
start=$SECONDS
set +e
timeout -k 10 900 qemu-system-x86_64 "${accel_args[@]}" -m 2048 -smp 2 \
  -display none -no-reboot -monitor none -serial stdio \
  -kernel "$guest/vmlinuz" -initrd "$guest/initrd.img" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -append "console=ttyS0 quiet panic=-1 ferry_modules=$modules ferry_run=$PWD/scripts/vm/guest.sh ferry_plan=$plan" \
  </dev/null 2>&1 | tr -d '\r' | tee "$log"
rc=${PIPESTATUS[0]}
set -e
echo "== guest ran $((SECONDS - start)) s (QEMU exit $rc, $accel); serial log: $log"
status=$(sed -n 's/^ferry-vm: status //p' "$log" | tail -n 1)
if [ -z "$status" ]; then
  reason=$(grep -m1 '^ferry-vm: init failed' "$log" || true)
  [ $rc = 124 ] && reason="${reason:+$reason; }timed out after 900 s"
  echo "FAIL: the guest reported no status (${reason:-its last lines follow})" >&2
  tail -n 5 "$log" >&2
  exit 1
fi
grep '^ferry-vm: result ' "$log" | sed 's/^ferry-vm: result /  /'
# Skips inside the guest ("ferry-vm: skip TEST<tab>REASON"), into this
# step's count.
while IFS=$'\t' read -r what reason; do
  expect_record_skip "vm: $what" "$reason"
done < <(sed -n 's/^ferry-vm: skip //p' "$log")
echo "vm: $status"
[[ "$status" == *" 0 failed" ]] && [[ "$status" != "0 passed"* ]]

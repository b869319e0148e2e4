# serves: 10 20 31 40 55
# Tailscale's derper (tailscale.com v1.104.7, pinned by
# interop/reference/go.mod, built with the Go toolchain that module's go
# line names: Go 1.27 from the module proxy, 00-toolchains.sh fetches it):
# the reference server of the client SDK's, `ferry link`'s and the relay
# sessions' tests in step 10, of the interop suite (20) and of the ferry
# link namespace tests (31, and 55 in the VM), and the baseline of the DERP
# benchmark suite (40, bench/run.sh). Built where they all look for it,
# interop/bin/derper, unless the binary there is that tailscale.com version
# and newer than the module's go.sum. About 3 min cold. scripts/test.d/
# 10-rust.sh, the interop suite's TestMain and bench/run.sh run this script
# themselves; it does nothing when derper is up to date.
set -euo pipefail
cd "$(dirname "$0")/../../interop"
mod=reference
# The tailscale.com version the module requires (in a require block or
# on a require line of its own).
want=$(awk '$1 == "tailscale.com" { print $2 } $1 == "require" && $2 == "tailscale.com" { print $3 }' "$mod/go.mod")
[[ "$want" == v* ]] || { echo "$mod/go.mod: no tailscale.com requirement" >&2; exit 1; }
# The tailscale.com version a derper binary was built from (its build info,
# read by the machine's own go, whatever toolchain built it).
built_from() { GOTOOLCHAIN=local go version -m "$1" 2>/dev/null | awk '($1 == "mod" || $1 == "dep") && $2 == "tailscale.com" { print $3 }'; }
if [ -x bin/derper ] && [ bin/derper -nt "$mod/go.sum" ] && [ "$(built_from bin/derper)" = "$want" ]; then
  echo "derper: up to date (tailscale.com $want)"
  exit 0
fi
GOTOOLCHAIN=go$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$mod/go.mod")
export GOTOOLCHAIN
mkdir -p bin
# Build beside, then move in place: a failed build leaves no stale or
# partial binary under the name every test looks for.
(cd "$mod" && go build -o ../bin/derper.new tailscale.com/cmd/derper)
mv -f bin/derper.new bin/derper
got=$(built_from bin/derper)
[ "$got" = "$want" ] || { echo "derper: built from tailscale.com '$got', want $want" >&2; exit 1; }
echo "derper: $(bin/derper --version 2>&1 | sed -n 1p) (tailscale.com $got, $GOTOOLCHAIN)"

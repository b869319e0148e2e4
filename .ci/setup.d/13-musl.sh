# serves: 13
# The x86_64-unknown-linux-musl target and musl-gcc (musl-tools: the C
# parts of the TLS libraries are compiled against musl), for the static
# ferry binary that scripts/test.d/13-static.sh builds and runs; jq reads
# the exchange's report; file and readelf (binutils) check the binary is
# static.
set -euo pipefail
. "$(dirname "$0")/../apt.sh"
rustup target add x86_64-unknown-linux-musl >/dev/null
apt_need scripts/test.d/13-static.sh musl-gcc:musl-tools jq:jq file:file readelf:binutils
echo "musl: $(rustup target list --installed | grep musl), $(command -v musl-gcc || echo 'no musl-gcc')"

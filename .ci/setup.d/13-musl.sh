# The x86_64-unknown-linux-musl target and musl-gcc (musl-tools: the C
# parts of the TLS libraries are compiled against musl), for the static
# ferry binary that scripts/test.d/13-static.sh builds and runs.
set -euo pipefail
rustup target add x86_64-unknown-linux-musl >/dev/null
# jq reads the exchange's report; file and readelf (binutils) check the
# binary is static.
need=0
for tool in musl-gcc jq file readelf; do
  command -v "$tool" >/dev/null || need=1
done
if [ "$need" = 1 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends musl-tools jq file binutils >/dev/null
  else
    echo "not root: cannot install musl-tools, jq, file and binutils (scripts/test.d/13-static.sh will say so)"
  fi
fi
echo "musl: $(rustup target list --installed | grep musl), $(command -v musl-gcc || echo 'no musl-gcc')"

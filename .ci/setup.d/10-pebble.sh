# serves: 10
# Pebble (Let's Encrypt's test CA) and its DNS test server, for the ACME
# tests (crates/ferry/tests/acme.rs): built from the Go module proxy into a
# cache directory, with the test certificates Pebble serves its API with.
set -euo pipefail
version=v2.10.1
dir=${FERRY_PEBBLE_DIR:-$HOME/.cache/ferry-tools/pebble-$version}
if [ -x "$dir/pebble" ] && [ -x "$dir/pebble-challtestsrv" ] && [ -f "$dir/pebble.minica.pem" ]; then
  exit 0
fi
mkdir -p "$dir"
GOBIN="$dir" GOFLAGS=-mod=mod go install \
  "github.com/letsencrypt/pebble/v2/cmd/pebble@$version" \
  "github.com/letsencrypt/pebble/v2/cmd/pebble-challtestsrv@$version"
src="$(go env GOMODCACHE)/github.com/letsencrypt/pebble/v2@$version/test/certs"
cp "$src/pebble.minica.pem" "$src/localhost/cert.pem" "$src/localhost/key.pem" "$dir/"
chmod 0644 "$dir"/*.pem

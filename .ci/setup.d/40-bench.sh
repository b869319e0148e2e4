# serves: 40
# What the benchmark suite needs beyond the toolchains: taskset (util-linux),
# openssl for its test certificate, and matplotlib for the plots.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if ! command -v taskset >/dev/null || ! command -v openssl >/dev/null \
   || ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends util-linux openssl python3 python3-matplotlib >/dev/null
fi

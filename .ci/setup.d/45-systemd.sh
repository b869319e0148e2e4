# serves: 45
# systemd-analyze, for checking the units in packaging/systemd.
set -euo pipefail
. "$(dirname "$0")/../apt.sh"
apt_need scripts/test.d/45-systemd.sh systemd-analyze:systemd

# Sourced by the .ci/setup.d scripts (not one itself: it serves no step).
#
# apt_need WHO CMD:PACKAGE...: installs, from Debian, the PACKAGE of each
# CMD that is not on PATH (nothing when all are there). Not root: says
# what it could not install and that WHO (the step that needs it) will
# say so, and returns 0.
apt_need() {
  local who=$1 t
  local -a need=()
  shift
  for t in "$@"; do
    command -v "${t%%:*}" >/dev/null || need+=("${t#*:}")
  done
  [ ${#need[@]} -gt 0 ] || return 0
  if [ "$(id -u)" != 0 ]; then
    echo "not root: cannot install ${need[*]} ($who will say so)"
    return 0
  fi
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

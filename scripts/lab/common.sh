# Shared by the pmirror lab scripts (sourced, not run).
# shellcheck shell=bash

LAB_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
LAB_REPO=$(cd -- "$LAB_DIR/../.." && pwd -P)
LAB_CACHE=${PMIRROR_LAB_CACHE:-$LAB_REPO/.lab-cache}

lab_die() {
  echo "pmirror-lab: error: ${*#pmirror-lab: }" >&2
  exit 125
}

lab_check_cache_path() {
  case "$LAB_CACHE/" in
    /tmp/*|/var/tmp/*|/run/*|/dev/shm/*)
      lab_die "cache folder $LAB_CACHE is under /tmp, /var/tmp, /run or /dev/shm; the guest has its own there. Set PMIRROR_LAB_CACHE elsewhere" ;;
  esac
  case "$LAB_CACHE$LAB_REPO" in
    *[[:space:]]*) lab_die "paths with spaces cannot go through the kernel command line: $LAB_CACHE / $LAB_REPO" ;;
  esac
}

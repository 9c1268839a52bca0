# Shared by the pmirror lab scripts (sourced, not run).
# shellcheck shell=bash

LAB_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
LAB_REPO=$(cd -- "$LAB_DIR/../.." && pwd -P)
LAB_CACHE=${PMIRROR_LAB_CACHE:-$LAB_REPO/.lab-cache}
# The guest's kernel (docs/transport-rdma.md, "Native persistence"): 6.1,
# Debian 12's, the default and the latency figures' kernel; 6.12, from
# bookworm-backports, whose rxe has FLUSH and ATOMIC WRITE (device
# capability bits 38-40); 7, from trixie-backports, whose rxe also has
# on-demand paging (an fs-dax mapping registers). Each kernel but the
# default has its cache in a folder of its own under the default's.
LAB_KERNEL=${PMIRROR_LAB_KERNEL:-6.1}
case $LAB_KERNEL in
  6.1) ;;
  6.12 | 7) LAB_CACHE=$LAB_CACHE/kernel-$LAB_KERNEL ;;
  *)
    echo "pmirror-lab: error: PMIRROR_LAB_KERNEL='$LAB_KERNEL': the lab boots 6.1 (default), 6.12 or 7" >&2
    exit 125
    ;;
esac

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

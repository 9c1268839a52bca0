#!/usr/bin/env bash
# pmirror lab: boot ONE QEMU guest (TCG; Debian 6.1, or 6.12 with PMIRROR_LAB_KERNEL=6.12)
# and run a command in it.
#
#   scripts/lab/run.sh [options] -- COMMAND [ARGS...]
#   scripts/lab/run.sh [options] -- 'shell string'      (one argument: run with bash -c,
#                                                         or as a script if it is a file)
# Options:
#   --timeout SEC   hard limit for the whole boot (default 300; $PMIRROR_LAB_TIMEOUT)
#   --nvdimm        two emulated NVDIMMs: /dev/pmem0 fsdax + ext4 -o dax on /mnt/pmem,
#                   /dev/dax1.0 devdax (adds ~2-3 s)
#   --nvdimms 3     --nvdimm and a third one, /dev/dax2.0 devdax (two devdax
#                   targets: the benchmark's two APM replicas)
#   --env NAME[=VALUE]  pass a variable into the guest (repeatable). Passed anyway:
#                   PATH, LANG, LC_*, TZ, and every PMIRROR_*, GTEST_*, ASAN_/UBSAN_/
#                   LSAN_/TSAN_OPTIONS variable of the caller.
#   --rw DIR        mount host DIR read-write at the same path in the guest
#                   (repeatable; everything else of the host is read-only + tmpfs overlay)
#   --mem SIZE      guest RAM (default 2G)     --smp N  vCPUs (default 2)
#   --keep          keep the run folder (console log, stages) even on success
#   --verbose       also print the guest's console (kernel + setup log) to stderr
# Advanced (used by run2.sh): --node NAME --link-listen SOCK | --link-connect SOCK
#   --self IP --peer IP --loss PCT --prefix STR
#
# Inside the guest: the host's / read-only (+ tmpfs overlay, so host-built binaries
# run), rxe0 on dummy rdma0 192.168.77.1/24 mtu 4200, the command runs in the
# caller's current directory with env PMIRROR_LAB_GUEST=1, PMIRROR_LAB_NODE,
# PMIRROR_LAB_SELF, PMIRROR_LAB_PEER, PMIRROR_LAB_RDMA_DEV=rxe0, PMIRROR_LAB_NETDEV
# (+ PMIRROR_LAB_PMEM_DIR=/mnt/pmem, PMIRROR_LAB_DAX_DEV=/dev/dax1.0,
# PMIRROR_LAB_PMEM_DEV=/dev/pmem0 with --nvdimm; + PMIRROR_LAB_DAX_DEV2=/dev/dax2.0
# with --nvdimms 3).
# The command's stdout/stderr stream to this script's stdout/stderr.
#
# Exit status: the command's; 124 = timeout; 125 = harness/boot failure (the
# message says which: "guest failed to boot" vs "guest setup failed").
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=scripts/lab/common.sh
source "$here/common.sh"

timeout_s=${PMIRROR_LAB_TIMEOUT:-300}
nvdimm=0 nvdimms=0 mem=2G smp=2 keep=0 verbose=0 node=solo prefix=""
self=192.168.77.1 peer=192.168.77.1 loss="" link_mode="" link_sock=""
pmem_size=${PMIRROR_LAB_PMEM_SIZE:-512M}
envs=() rws=()

usage() { sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; }
need() { [[ $# -ge 2 && -n $2 ]] || lab_die "option $1 needs a value"; }
while (($#)); do
  case $1 in
    --timeout) need "$@"; timeout_s=$2; shift 2 ;;
    --nvdimm) nvdimm=1; ((nvdimms >= 2)) || nvdimms=2; shift ;;
    --nvdimms)
      need "$@"
      [[ $2 == 2 || $2 == 3 ]] || lab_die "--nvdimms wants 2 or 3, got '$2'"
      nvdimm=1 nvdimms=$2
      shift 2 ;;
    --env) need "$@"; envs+=("$2"); shift 2 ;;
    --rw) need "$@"; rws+=("$2"); shift 2 ;;
    --mem) need "$@"; mem=$2; shift 2 ;;
    --smp) need "$@"; smp=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --verbose|-v) verbose=1; shift ;;
    --node) need "$@"; node=$2; shift 2 ;;
    --self) need "$@"; self=$2; shift 2 ;;
    --peer) need "$@"; peer=$2; shift 2 ;;
    --loss) need "$@"; loss=$2; shift 2 ;;
    --prefix) need "$@"; prefix=$2; shift 2 ;;
    --link-listen) need "$@"; link_mode=listen; link_sock=$2; shift 2 ;;
    --link-connect) need "$@"; link_mode=connect; link_sock=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) lab_die "unknown option '$1' (put the command after --; see --help)" ;;
  esac
done
(($#)) || lab_die "no command given; usage: run.sh [options] -- COMMAND..."
[[ $timeout_s =~ ^[0-9]+$ ]] || lab_die "--timeout wants whole seconds, got '$timeout_s'"
[[ $node =~ ^[a-z0-9_-]+$ ]] || lab_die "--node wants [a-z0-9_-]+"
[[ -z $loss || $loss =~ ^[0-9.]+%$ ]] || lab_die "--loss wants a percentage like 1% or 0.5%"

lab_check_cache_path
[[ -s $LAB_CACHE/vmlinux && -s $LAB_CACHE/initramfs.cpio && -f $LAB_CACHE/kernel.env ]] ||
  lab_die "lab not set up in $LAB_CACHE: run scripts/lab/setup.sh (as root) first"
command -v qemu-system-x86_64 >/dev/null || lab_die "qemu-system-x86_64 missing: run scripts/lab/setup.sh"
moddir=$(sed -n 's/^MODDIR=//p' "$LAB_CACHE/kernel.env")
[[ -d $moddir ]] || lab_die "modules folder $moddir missing: run scripts/lab/setup.sh --force"

mkdir -p "$LAB_CACHE/runs"
# Failed runs keep their folder for inspection; drop those older than a day.
find "$LAB_CACHE/runs" -mindepth 1 -maxdepth 1 -mmin +1440 -exec rm -rf {} + 2>/dev/null || true
run=$(mktemp -d "$LAB_CACHE/runs/$node.XXXXXX")
mkdir "$run/share"
qpid="" readers=()
cleanup() {
  local rc=$?
  [[ -n $qpid ]] && kill "$qpid" 2>/dev/null && wait "$qpid" 2>/dev/null
  for f in "$run"/out.fifo "$run"/err.fifo; do [[ -p $f ]] && { exec {fd}<>"$f"; exec {fd}>&-; }; done
  ((${#readers[@]})) && wait "${readers[@]}" 2>/dev/null
  if ((keep == 0 && rc == 0)) || ((keep == 0 && ${PMIRROR_LAB_KEEP_FAILED:-1} == 0)); then
    rm -rf "$run"
  else
    echo "pmirror-lab${prefix:+ $prefix}: run folder kept: $run" >&2
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- what the guest runs ----------------------------------------------------
cwd=$(pwd -P)
case "$cwd/" in
  /run/*|/dev/*|/proc/*|/sys/*) echo "pmirror-lab: warning: $cwd is hidden in the guest; running in /" >&2; cwd=/ ;;
esac
{
  echo "cd -- $(printf '%q' "$cwd") || exit 125"
  if (($# == 1)); then
    if [[ -f $1 ]]; then
      script=$(cd -- "$(dirname -- "$1")" && pwd -P)/$(basename -- "$1")
      if [[ -x $script ]]; then echo "exec $(printf '%q' "$script")"; else echo "exec /bin/bash $(printf '%q' "$script")"; fi
    else
      echo "exec /bin/bash -c $(printf '%q' "$1")"
    fi
  else
    printf 'exec'; printf ' %q' "$@"; echo
  fi
} >"$run/share/cmd.sh"

{
  while IFS= read -r name; do
    printf 'export %s=%q\n' "$name" "${!name}"
  done < <(compgen -e | grep -E '^(PATH|LANG|LC_[A-Z]+|TZ|PMIRROR_[A-Za-z0-9_]+|GTEST_[A-Z_]+|[A-Z]+SAN_OPTIONS)$' |
           grep -vE '^PMIRROR_LAB_(CACHE|NODE|SELF|PEER|GUEST|RDMA_DEV|NETDEV|PMEM_DIR|DAX_DEV|PMEM_DEV)$' || true)
  for e in "${envs[@]}"; do
    n=${e%%=*}
    [[ $n =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || lab_die "--env: bad variable name '$n'"
    if [[ $e == *=* ]]; then v=${e#*=}; else v=${!n-}; fi
    printf 'export %s=%q\n' "$n" "$v"
  done
} >"$run/share/env"

rw_list=() qemu_rw=()
for i in "${!rws[@]}"; do
  d=${rws[$i]}
  [[ -d $d ]] || lab_die "--rw $d: not a folder"
  d=$(cd -- "$d" && pwd -P)
  [[ $d != *[[:space:]]* ]] || lab_die "--rw $d: paths with spaces are not supported"
  rw_list+=("$d")
  qemu_rw+=(-fsdev "local,id=rw$i,path=$d,security_model=none,multidevs=remap"
            -device "virtio-9p-pci,fsdev=rw$i,mount_tag=rw$i")
done

netdev=dummy
[[ -n $link_mode ]] && netdev=eth0
{
  printf 'PMLAB_NODE=%q\nPMLAB_SELF=%q\nPMLAB_PEER=%q\nPMLAB_NETDEV=%q\nPMLAB_LOSS=%q\n' \
    "$node" "$self" "$peer" "$netdev" "$loss"
  printf 'PMLAB_NVDIMM=%q\nPMLAB_NVDIMMS=%q\nPMLAB_MODDIR=%q\n' "$nvdimm" "$nvdimms" "$moddir"
  printf 'PMLAB_RW=('; for d in "${rw_list[@]}"; do printf ' %q' "$d"; done; echo ' )'
} >"$run/share/config"

# ---- QEMU -------------------------------------------------------------------
machine=pc
qemu_nv=()
if ((nvdimm)); then
  machine=pc,nvdimm=on
  nvdir="$LAB_CACHE/nvdimm"
  mkdir -p "$nvdir"
  exec {lockfd}>"$nvdir/$node.lock"
  if ! flock -n "$lockfd"; then
    echo "pmirror-lab${prefix:+ $prefix}: waiting for the NVDIMMs of node '$node' (another run uses them)" >&2
    flock -w "$timeout_s" "$lockfd" || lab_die "NVDIMM files of node '$node' are busy (another run holds $nvdir/$node.lock)"
  fi
  for ((i = 0; i < nvdimms; i++)); do
    f="$nvdir/$node-nvdimm$i.img"
    [[ -f $f ]] || truncate -s "$pmem_size" "$f"
    sz=$(stat -c %s "$f")
    qemu_nv+=(-object "memory-backend-file,id=nvm$i,share=on,mem-path=$f,size=$sz"
              -device "nvdimm,id=nv$i,memdev=nvm$i")
  done
fi
qemu_net=(-nic none)
if [[ $link_mode == listen ]]; then
  qemu_net=(-netdev "stream,id=n0,server=on,addr.type=unix,addr.path=$link_sock"
            -device "virtio-net-pci,netdev=n0,mac=52:54:00:4d:00:0${node: -1}")
elif [[ $link_mode == connect ]]; then
  qemu_net=(-netdev "stream,id=n0,server=off,addr.type=unix,addr.path=$link_sock"
            -device "virtio-net-pci,netdev=n0,mac=52:54:00:4d:01:0${node: -1}")
fi
mkfifo "$run/out.fifo" "$run/err.fifo"
: >"$run/console.log"

append="console=ttyS0 panic=-1 quiet mitigations=off pmlab_init=$LAB_DIR/guest-init.sh ${PMIRROR_LAB_KARGS:-}"
# 6.12 under multi-threaded TCG died in one boot of two or three, about 2.8 s
# in, of an int3 Oops in sched_clock_tick / sched_clock_cpu: the kernel
# patches its text (a static key) with int3 while the other vCPU, on another
# host thread, still runs the old translation. One host thread for all vCPUs
# has no such race; 6.12 is for function proofs, not latency figures.
tcg_threads=multi
[[ $LAB_KERNEL != 6.1 ]] && tcg_threads=single
# shellcheck disable=SC2054  # commas are QEMU option syntax
qemu=(qemu-system-x86_64 -nodefaults -no-user-config -display none -no-reboot
  -accel tcg,thread=$tcg_threads,tb-size=512 -cpu max -smp "$smp"
  -machine "$machine" -m "$mem,slots=4,maxmem=16G"
  -kernel "$LAB_CACHE/vmlinux" -initrd "$LAB_CACHE/initramfs.cpio" -append "$append"
  -chardev "file,id=con,path=$run/console.log" -serial chardev:con
  -chardev "file,id=out,path=$run/out.fifo" -serial chardev:out
  -chardev "file,id=err,path=$run/err.fifo" -serial chardev:err
  -fsdev "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap"
  -device "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot"
  -fsdev "local,id=pmlab,path=$run/share,security_model=none,multidevs=remap"
  -device "virtio-9p-pci,fsdev=pmlab,mount_tag=pmlab"
  "${qemu_rw[@]}" "${qemu_net[@]}" "${qemu_nv[@]}")

if [[ -n $prefix ]]; then
  sed -u "s|^|$prefix |" <"$run/out.fifo" & readers+=($!)
  sed -u "s|^|$prefix |" <"$run/err.fifo" >&2 & readers+=($!)
else
  cat <"$run/out.fifo" & readers+=($!)
  cat <"$run/err.fifo" >&2 & readers+=($!)
fi
t0=$(date +%s.%N)
set +e
timeout -k 5 "$timeout_s" "${qemu[@]}" </dev/null >"$run/qemu.log" 2>&1 &
qpid=$!
if ((verbose)); then
  tail --pid="$qpid" -n +1 -f "$run/console.log" 2>/dev/null | sed -u "s|^|[console${prefix:+ $prefix}] |" >&2 &
  readers+=($!)
fi
wait "$qpid"
qrc=$?
qpid=""
set -e
t1=$(date +%s.%N)
for f in "$run"/out.fifo "$run"/err.fifo; do exec {fd}<>"$f"; exec {fd}>&-; done
wait "${readers[@]}" 2>/dev/null || true
readers=()
secs=$(awk "BEGIN{printf \"%.1f\", $t1-$t0}")
tag="pmirror-lab${prefix:+ $prefix}"

show_console() {
  echo "$tag: --- last lines of the guest console ($run/console.log) ---" >&2
  tail -n 25 "$run/console.log" | sed "s|^|$tag:   |" >&2
  [[ -s $run/qemu.log ]] && { echo "$tag: --- qemu ---" >&2; sed "s|^|$tag:   |" "$run/qemu.log" >&2; }
  return 0
}
[[ -f $run/share/stages ]] && cp "$run/share/stages" "$run/stages"

if [[ -f $run/share/rc ]]; then
  rc=$(<"$run/share/rc")
  if [[ $rc != 0 ]]; then
    echo "$tag: command FAILED with exit status $rc (guest round ${secs} s)" >&2
    if [[ -s $run/share/dmesg ]]; then
      echo "$tag: --- the guest kernel while the command ran (last 40 lines of $run/share/dmesg) ---" >&2
      tail -n 40 "$run/share/dmesg" | sed "s|^|$tag:   |" >&2
    fi
  elif [[ -n ${PMIRROR_LAB_TIMING:-} ]]; then
    echo "$tag: ok (guest round ${secs} s)" >&2
  fi
  exit "$rc"
fi
if ((qrc == 124 || qrc == 137)); then
  if [[ -f $run/share/booted ]]; then
    echo "$tag: TIMEOUT: the command did not finish within --timeout $timeout_s s (guest booted; killed)" >&2
  else
    echo "$tag: TIMEOUT: guest failed to boot within $timeout_s s" >&2
    show_console
  fi
  exit 124
fi
if [[ -f $run/share/setup-error ]]; then
  echo "$tag: guest booted but lab setup inside it FAILED: $(<"$run/share/setup-error")" >&2
  show_console
  exit 125
fi
if [[ -f $run/share/booted ]]; then
  echo "$tag: guest booted but stopped before the command finished (qemu exit $qrc; guest crash/panic?)" >&2
else
  echo "$tag: guest FAILED TO BOOT (qemu exit $qrc)" >&2
fi
show_console
exit 125

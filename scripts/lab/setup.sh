#!/usr/bin/env bash
# pmirror QEMU lab: one-time setup (idempotent). Run as root.
#
#  * apt-get installs QEMU, rdma-core tools, PMDK, ndctl, busybox-static, ...
#    and librpma (runtime librpma0 + librpma-dev, to build bench/rpma-write-flush,
#    the lab benchmark's librpma comparator; the guest sees the host's / so the
#    library and the binary built on the host are there too)
#  * downloads Debian's generic amd64 6.1 kernel package (never installed on the
#    host), unpacks it into the cache folder, prunes useless module folders,
#    runs depmod, cuts the uncompressed ELF kernel out of vmlinuz (QEMU boots it
#    through its PVH note, ~3.5 s faster than vmlinuz under TCG),
#  * with PMIRROR_LAB_KERNEL=6.12: the kernel of bookworm-backports instead
#    (with 7: trixie-backports', whose image is split into binary, modules
#    and base packages), through a private apt configuration in the cache
#    (the host's apt sources and state are not touched), in its own cache
#    folder (common.sh),
#  * builds a tiny busybox initramfs that mounts the host's / read-only over
#    virtio-9p with a tmpfs overlay and hands over to scripts/lab/guest-init.sh.
#
# Cache folder: $PMIRROR_LAB_CACHE, default <repo>/.lab-cache (gitignored). It
# must not live under /tmp, /var/tmp or /run (the guest has its own /run).
# A second run does nothing (about 1 s).
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=scripts/lab/common.sh
source "$here/common.sh"

force=0
for a in "$@"; do
  case $a in
    --force) force=1 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) lab_die "setup: unknown argument '$a' (only --force)" ;;
  esac
done

[[ ${EUID} -eq 0 ]] || lab_die "setup: run as root (apt-get, dpkg -x and depmod need it)"

packages=(
  qemu-system-x86 ibverbs-providers ibverbs-utils rdmacm-utils perftest
  libibverbs-dev librdmacm-dev libpmem-dev libpmemobj-dev pmdk-tools ndctl daxctl
  kmod busybox-static cpio iproute2 e2fsprogs xz-utils zstd
  librpma0 librpma-dev
)

t0=$(date +%s.%N)
lab_check_cache_path
mkdir -p "$LAB_CACHE"
LAB_CACHE=$(cd "$LAB_CACHE" && pwd -P)
lab_check_cache_path

# Fingerprint of everything that shapes the cache: rebuild when it changes.
fingerprint=$(cat "$here/setup.sh" "$here/common.sh" | sha256sum | cut -c1-16)
stamp="$LAB_CACHE/setup.stamp"

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((force == 0)) && ((${#missing[@]} == 0)) && [[ -f $stamp ]] &&
   [[ $(sed -n 's/^fingerprint=//p' "$stamp") == "$fingerprint" ]] &&
   [[ -s $LAB_CACHE/vmlinux && -s $LAB_CACHE/initramfs.cpio && -f $LAB_CACHE/kernel.env ]]; then
  echo "lab-setup: already set up in $LAB_CACHE ($(sed -n 's/^KREL=//p' "$LAB_CACHE/kernel.env"))"
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
if ((${#missing[@]})); then
  echo "lab-setup: installing ${missing[*]}"
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$LAB_CACHE/apt.log" 2>&1; then
    echo "lab-setup: install failed, running apt-get update and retrying"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$LAB_CACHE/apt.log" 2>&1 ||
      { cat "$LAB_CACHE/apt.log" >&2; lab_die "setup: apt-get install failed"; }
  fi
fi

# ---- kernel ---------------------------------------------------------------
# apt for the kernel package: the host's for 6.1; for a newer kernel a
# private configuration (its own sources list, lists and cache) naming only
# the suite that carries it.
apt_private=()
if [[ $LAB_KERNEL != 6.1 ]]; then
  suite=bookworm-backports
  [[ $LAB_KERNEL == 7 ]] && suite=trixie-backports
  pa="$LAB_CACHE/apt"
  mkdir -p "$pa/lists/partial" "$pa/cache/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
    >"$pa/sources.list"
  apt_private=(-o "Dir::Etc::sourcelist=$pa/sources.list" -o Dir::Etc::sourceparts=-
               -o "Dir::State::Lists=$pa/lists" -o "Dir::Cache=$pa/cache" -o Debug::NoLocking=1)
  if [[ ! -f $LAB_CACHE/kernel.env ]]; then
    apt-get -qq "${apt_private[@]}" update || lab_die "setup: apt-get update of $suite failed"
  fi
fi
kpkg=${PMIRROR_LAB_KERNEL_PKG:-}
if [[ -z $kpkg && -f $LAB_CACHE/kernel.env ]]; then
  kpkg=$(sed -n 's/^KPKG=//p' "$LAB_CACHE/kernel.env")   # keep the one we have
fi
if [[ -z $kpkg ]]; then
  kpkg=$(apt-cache "${apt_private[@]}" depends linux-image-amd64 2>/dev/null |
         sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -n1)
  if [[ -z $kpkg ]]; then
    apt-get "${apt_private[@]}" update -qq
    kpkg=$(apt-cache "${apt_private[@]}" depends linux-image-amd64 2>/dev/null |
           sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -n1)
  fi
  [[ -n $kpkg ]] || lab_die "setup: cannot find the kernel package behind linux-image-amd64"
fi
[[ $kpkg == *-cloud-amd64 ]] && lab_die "setup: $kpkg is the cloud flavour (no rdma_rxe, no 9p); use the generic -amd64 one"
krel=${kpkg#linux-image-}
kroot="$LAB_CACHE/kernel"

if [[ ! -f $kroot/.unpacked-$krel ]]; then
  echo "lab-setup: downloading $kpkg"
  rm -rf "$kroot" "$LAB_CACHE"/deb
  mkdir -p "$LAB_CACHE/deb"
  (cd "$LAB_CACHE/deb" &&
     apt-get "${apt_private[@]}" download -q "$kpkg" >/dev/null 2>"$LAB_CACHE/deb/download.log") || {
    apt-get "${apt_private[@]}" update -qq
    (cd "$LAB_CACHE/deb" && apt-get "${apt_private[@]}" download -q "$kpkg") ||
      lab_die "setup: apt-get download $kpkg failed"
  }
  # Debian 13's image package holds no files: its kernel and modules come
  # in packages of their own (linux-binary-*, linux-modules-*, linux-base-*).
  for part in binary modules base; do
    if apt-cache "${apt_private[@]}" show "linux-$part-$krel" >/dev/null 2>&1; then
      (cd "$LAB_CACHE/deb" &&
         apt-get "${apt_private[@]}" download -q "linux-$part-$krel" >/dev/null 2>>"$LAB_CACHE/deb/download.log") ||
        lab_die "setup: apt-get download linux-$part-$krel failed"
    fi
  done
  mkdir -p "$kroot"
  for deb in "$LAB_CACHE"/deb/*.deb; do
    echo "lab-setup: unpacking $(basename "$deb")"
    dpkg -x "$deb" "$kroot"
  done
  rm -rf "$LAB_CACHE/deb"
  # Merged /usr (Debian 13): /lib is /usr/lib, as on the installed system.
  [[ -d $kroot/usr/lib/modules && ! -e $kroot/lib ]] && ln -s usr/lib "$kroot/lib"
  mdir="$kroot/lib/modules/$krel"
  [[ -d $mdir ]] || mdir="$kroot/usr/lib/modules/$krel"
  [[ -d $mdir ]] || lab_die "setup: no modules folder for $krel in $kroot"
  # Prune module folders a headless VM never needs (~ -60%).
  for d in sound drivers/gpu drivers/media drivers/net/wireless drivers/usb drivers/staging \
           drivers/bluetooth drivers/iio drivers/isdn drivers/hid drivers/input/touchscreen \
           drivers/net/can drivers/net/ethernet drivers/scsi drivers/ata drivers/mmc \
           drivers/infiniband/hw drivers/video drivers/platform drivers/hwmon \
           drivers/mtd drivers/net/usb drivers/net/ieee802154 drivers/nfc drivers/w1 \
           net/wireless net/mac80211 net/bluetooth net/nfc fs/ocfs2 fs/btrfs fs/xfs \
           fs/nfs fs/nfsd fs/ceph fs/smb fs/cifs fs/gfs2 fs/f2fs; do
    rm -rf "${mdir:?}/kernel/$d"
  done
  depmod -b "$kroot" "$krel" 2>/dev/null || depmod -b "$kroot/usr" "$krel"
  touch "$kroot/.unpacked-$krel"
fi
mdir="$kroot/lib/modules/$krel"
[[ -d $mdir ]] || mdir="$kroot/usr/lib/modules/$krel"

# Uncompressed ELF kernel (booted via PVH): 6.1's vmlinuz holds it as an XZ
# stream, 6.12's as a zstd frame.
vmlinuz="$kroot/boot/vmlinuz-$krel"
[[ -f $vmlinuz ]] || vmlinuz="$mdir/vmlinuz"  # Debian 13 keeps it beside the modules
[[ -f $vmlinuz ]] || lab_die "setup: $vmlinuz missing"
off=$(LC_ALL=C grep -abo -P '\xfd7zXZ\x00' "$vmlinuz" | head -n1 | cut -d: -f1 || true)
if [[ -n $off ]]; then
  tail -c +$((off + 1)) "$vmlinuz" | xz -dc --single-stream >"$LAB_CACHE/vmlinux.new" 2>/dev/null || true
else
  off=$(LC_ALL=C grep -abo -P '\x28\xb5\x2f\xfd' "$vmlinuz" | head -n1 | cut -d: -f1 || true)
  [[ -n $off ]] || lab_die "setup: no XZ stream or zstd frame in $vmlinuz"
  command -v zstd >/dev/null || lab_die "setup: zstd missing (package zstd)"
  tail -c +$((off + 1)) "$vmlinuz" | zstd -dcq >"$LAB_CACHE/vmlinux.new" 2>/dev/null || true
fi
[[ $(head -c 4 "$LAB_CACHE/vmlinux.new" | od -An -c | tr -d ' ') == '177ELF' ]] ||
  lab_die "setup: extracted kernel is not an ELF file"
mv -f "$LAB_CACHE/vmlinux.new" "$LAB_CACHE/vmlinux"

# ---- initramfs ------------------------------------------------------------
bb=/bin/busybox
[[ -x $bb ]] || lab_die "setup: $bb missing (package busybox-static)"
ird="$LAB_CACHE/initramfs.d"
rm -rf "$ird"
mkdir -p "$ird"/{bin,dev,proc,sys,lower,rw,newroot,mods}
cp "$bb" "$ird/bin/busybox"
ldd_out=$(ldd "$ird/bin/busybox" 2>&1 || true)
[[ $ldd_out == *"not a dynamic"* ]] || lab_die "setup: $bb is not static (install busybox-static)"
for c in sh mount umount mkdir insmod switch_root cat echo sleep poweroff ls; do
  ln -s busybox "$ird/bin/$c"
done
# Modules needed before the root exists, in dependency order.
: >"$ird/mods/order"
for m in virtio_pci 9pnet_virtio 9p overlay; do
  modprobe -d "$kroot" -S "$krel" --show-depends "$m" 2>/dev/null |
    sed -n 's/^insmod \([^ ]*\).*/\1/p' >>"$ird/mods/list.tmp" || true
done
while read -r ko; do
  [[ -f $ko ]] || continue
  name=$(basename "$ko")
  grep -qx "$name" "$ird/mods/order" && continue
  case $ko in
    *.xz) xz -dc "$ko" >"$ird/mods/${name%.xz}"; name=${name%.xz} ;;
    *.zst) zstd -qdc "$ko" >"$ird/mods/${name%.zst}"; name=${name%.zst} ;;
    *) cp "$ko" "$ird/mods/$name" ;;
  esac
  echo "$name" >>"$ird/mods/order"
done <"$ird/mods/list.tmp"
rm -f "$ird/mods/list.tmp"
grep -q '^9p\.ko' "$ird/mods/order" || lab_die "setup: 9p module not found for $krel"

cat >"$ird/init" <<'EOF'
#!/bin/sh
# pmirror lab initramfs: host / (9p, read-only) + tmpfs overlay, then switch_root.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
fail() { echo "pmlab-initramfs: $*" >/dev/console; echo o >/proc/sysrq-trigger; poweroff -f; }
for m in $(cat /mods/order); do insmod /mods/$m 2>/dev/null; done
pm_init=
for w in $(cat /proc/cmdline); do
  case $w in pmlab_init=*) pm_init=${w#pmlab_init=} ;; esac
done
[ -n "$pm_init" ] || fail "no pmlab_init= on the kernel command line"
mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=512000,cache=loose hostroot /lower ||
  fail "cannot mount the host root over 9p"
mount -t tmpfs -o mode=0755,size=75% tmpfs /rw || fail "tmpfs"
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot ||
  fail "cannot mount the overlay"
[ -x "/newroot$pm_init" ] || fail "guest init $pm_init not found or not executable in the host root"
umount /proc /sys /dev 2>/dev/null
exec switch_root /newroot "$pm_init"
EOF
chmod 755 "$ird/init"
(cd "$ird" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) >"$LAB_CACHE/initramfs.cpio.new"
mv -f "$LAB_CACHE/initramfs.cpio.new" "$LAB_CACHE/initramfs.cpio"
rm -rf "$ird"

{
  echo "KPKG=$kpkg"
  echo "KREL=$krel"
  echo "KROOT=$kroot"
  echo "MODDIR=$(dirname "$mdir")"
} >"$LAB_CACHE/kernel.env"
printf 'fingerprint=%s\ndate=%s\n' "$fingerprint" "$(date -Is)" >"$stamp"
t1=$(date +%s.%N)
echo "lab-setup: ready in $LAB_CACHE: kernel $krel, $(du -sh "$LAB_CACHE" | cut -f1), $(awk "BEGIN{printf \"%.1f\", $t1-$t0}") s"

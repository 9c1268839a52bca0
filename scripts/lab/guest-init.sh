#!/bin/bash
# pmirror lab: PID 1 inside the QEMU guest (runs with the HOST's bash and tools,
# seen read-only through 9p + tmpfs overlay). Started by the initramfs; never run
# it on the host. Reads its settings from the writable share /pmlab (written by
# run.sh), sets up rxe (+ NVDIMMs), runs the command with stdout on ttyS1 and
# stderr on ttyS2, writes the exit status to /pmlab/rc and powers off.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8

bye() {
  sync
  mountpoint -q /mnt/pmem && umount /mnt/pmem 2>/dev/null
  mountpoint -q /pmlab && umount /pmlab 2>/dev/null
  /bin/busybox poweroff -f 2>/dev/null
  echo o >/proc/sysrq-trigger
  sleep 10
}
log() { echo "pmlab-guest[$(cut -d' ' -f1 /proc/uptime)s]: $*" >/dev/console; }
stage() { log "$*"; echo "$(cut -d' ' -f1 /proc/uptime) $*" >>/pmlab/stages 2>/dev/null; }
fail() {
  log "SETUP FAILED: $*"
  echo "$*" >/pmlab/setup-error 2>/dev/null
  bye
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# What udev makes on a booted system: bash's process substitution, <(...),
# opens /dev/fd/N, and without the link it fails (cmp exits 2).
ln -sfn /proc/self/fd /dev/fd
ln -sfn /proc/self/fd/0 /dev/stdin
ln -sfn /proc/self/fd/1 /dev/stdout
ln -sfn /proc/self/fd/2 /dev/stderr
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=0755 tmpfs /run
exec </dev/null >/dev/console 2>&1

mkdir -p /pmlab
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 pmlab /pmlab ||
  { log "cannot mount the pmlab share"; bye; }
stage booted
: >/pmlab/booted

# shellcheck disable=SC1091
source /pmlab/config || fail "cannot read /pmlab/config"
# Provides: PMLAB_NODE PMLAB_SELF PMLAB_PEER PMLAB_NETDEV(dummy|eth0) PMLAB_LOSS
#           PMLAB_NVDIMM(0|1) PMLAB_MODDIR PMLAB_RW(array of "tag path")

ip link set lo up
mkdir -p /usr/lib/modules && mount --bind "$PMLAB_MODDIR" /usr/lib/modules ||
  fail "cannot bind $PMLAB_MODDIR on /usr/lib/modules"

for i in "${!PMLAB_RW[@]}"; do
  p=${PMLAB_RW[$i]}
  mkdir -p "$p" 2>/dev/null
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 "rw$i" "$p" || fail "cannot mount $p read-write"
done

# ---- Soft-RoCE -----------------------------------------------------------
modprobe -a ib_uverbs rdma_ucm rdma_rxe || fail "modprobe rdma_rxe"
if [[ $PMLAB_NETDEV == dummy ]]; then
  modprobe dummy numdummies=0 || fail "modprobe dummy"
  ip link add rdma0 type dummy || fail "ip link add rdma0"
  nd=rdma0
else
  modprobe virtio_net || fail "modprobe virtio_net"
  for _ in $(seq 50); do [[ -e /sys/class/net/$PMLAB_NETDEV ]] && break; sleep 0.1; done
  nd=$PMLAB_NETDEV
fi
ip addr add "$PMLAB_SELF/24" dev "$nd" || fail "ip addr add on $nd"
ip link set "$nd" mtu 4200 up || fail "ip link set $nd up"
if [[ -n ${PMLAB_LOSS:-} ]]; then
  modprobe sch_netem || fail "modprobe sch_netem"
  tc qdisc add dev "$nd" root netem loss "$PMLAB_LOSS" || fail "tc netem loss $PMLAB_LOSS"
fi
rdma link add rxe0 type rxe netdev "$nd" || fail "rdma link add rxe0 netdev $nd"
for _ in $(seq 50); do
  rdma link show rxe0/1 2>/dev/null | grep -q 'state ACTIVE' && break
  sleep 0.1
done
rdma link show rxe0/1 2>/dev/null | grep -q 'state ACTIVE' || fail "rxe0 port not ACTIVE: $(rdma link show 2>&1)"
stage "rxe0 up on $nd ($PMLAB_SELF)"

# ---- NVDIMMs: /dev/pmem0 (fsdax, ext4 -o dax on /mnt/pmem) + /dev/dax1.0 --
if [[ $PMLAB_NVDIMM == 1 ]]; then
  modprobe -a --ignore-install nfit nd_pmem nd_btt dax_pmem device_dax ext4 || fail "modprobe nvdimm modules"
  for _ in $(seq 100); do
    [[ -e /sys/bus/nd/devices/namespace0.0 && -e /sys/bus/nd/devices/namespace1.0 ]] && break
    sleep 0.1
  done
  ready() {
    [[ -b /dev/pmem0 && -c /dev/dax1.0 ]] &&
      [[ $(cat /sys/bus/nd/devices/namespace0.0/holder 2>/dev/null) == pfn* ]]
  }
  # Fast path (every boot after the first): modes are already in the backing files.
  for _ in $(seq 30); do ready && break; sleep 0.1; done
  ns_mode() { ndctl list -n "$1" 2>/dev/null | sed -n 's/.*"mode":"\([a-z]*\)".*/\1/p'; }
  if ! ready && [[ $(ns_mode namespace0.0) != fsdax ]]; then
    log "creating fsdax namespace0.0 (once; persisted in the backing file)"
    ndctl create-namespace -f -e namespace0.0 -m fsdax >/dev/console 2>&1 || fail "ndctl create-namespace fsdax"
  fi
  if ! ready && [[ $(ns_mode namespace1.0) != devdax ]]; then
    log "creating devdax namespace1.0 (once; persisted in the backing file)"
    ndctl create-namespace -f -e namespace1.0 -m devdax >/dev/console 2>&1 || fail "ndctl create-namespace devdax"
  fi
  for _ in $(seq 100); do [[ -b /dev/pmem0 && -c /dev/dax1.0 ]] && break; sleep 0.1; done
  [[ -b /dev/pmem0 ]] || fail "/dev/pmem0 missing"
  [[ -c /dev/dax1.0 ]] || fail "/dev/dax1.0 missing"
  # --nvdimms 3: a second devdax (two APM targets in one guest).
  if [[ ${PMLAB_NVDIMMS:-2} == 3 ]]; then
    for _ in $(seq 100); do [[ -e /sys/bus/nd/devices/namespace2.0 ]] && break; sleep 0.1; done
    if [[ ! -c /dev/dax2.0 && $(ns_mode namespace2.0) != devdax ]]; then
      log "creating devdax namespace2.0 (once; persisted in the backing file)"
      ndctl create-namespace -f -e namespace2.0 -m devdax >/dev/console 2>&1 || fail "ndctl create-namespace devdax (2)"
    fi
    for _ in $(seq 100); do [[ -c /dev/dax2.0 ]] && break; sleep 0.1; done
    [[ -c /dev/dax2.0 ]] || fail "/dev/dax2.0 missing"
  fi
  if ! dumpe2fs -h /dev/pmem0 >/dev/null 2>&1; then
    log "mkfs.ext4 /dev/pmem0 (once)"
    mkfs.ext4 -q -F -b 4096 /dev/pmem0 || fail "mkfs.ext4 /dev/pmem0"
  fi
  mkdir -p /mnt/pmem
  mount -o dax /dev/pmem0 /mnt/pmem || fail "mount -o dax /dev/pmem0"
  stage "pmem ready (/mnt/pmem fsdax, /dev/dax1.0 devdax)"
fi

# ---- the command ----------------------------------------------------------
export PMIRROR_LAB_GUEST=1 PMIRROR_LAB_NODE=$PMLAB_NODE PMIRROR_LAB_SELF=$PMLAB_SELF \
  PMIRROR_LAB_PEER=$PMLAB_PEER PMIRROR_LAB_RDMA_DEV=rxe0 PMIRROR_LAB_NETDEV=$nd
if [[ $PMLAB_NVDIMM == 1 ]]; then
  export PMIRROR_LAB_PMEM_DIR=/mnt/pmem PMIRROR_LAB_DAX_DEV=/dev/dax1.0 PMIRROR_LAB_PMEM_DEV=/dev/pmem0
  if [[ ${PMLAB_NVDIMMS:-2} == 3 ]]; then export PMIRROR_LAB_DAX_DEV2=/dev/dax2.0; fi
fi
stty -F /dev/ttyS1 raw -echo clocal 2>/dev/null
stty -F /dev/ttyS2 raw -echo clocal 2>/dev/null
stage "command start"
boot_lines=$(dmesg 2>/dev/null | wc -l)
(
  # shellcheck disable=SC1091
  source /pmlab/env
  exec /bin/bash /pmlab/cmd.sh
) </dev/null >/dev/ttyS1 2>/dev/ttyS2
rc=$?
stage "command end rc=$rc"
# Closing a tty waits for the UART to drain; make sure of it before power-off.
stty -F /dev/ttyS1 raw -echo clocal 2>/dev/null
stty -F /dev/ttyS2 raw -echo clocal 2>/dev/null
# The kernel's side of a failure (rxe warnings, lockups, hung tasks), from
# while the command ran, for the host to show.
[ "$rc" = 0 ] || dmesg 2>/dev/null | tail -n +"$((boot_lines + 1))" >/pmlab/dmesg || true
echo "$rc" >/pmlab/rc.tmp && mv /pmlab/rc.tmp /pmlab/rc
bye

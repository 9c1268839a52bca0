#!/usr/bin/env bash
# The newer guests' rdma-core userland (docs/transport-rdma.md, "Native
# persistence", decision 7): Debian 13's rdma-core source (56.x: ibv_wr_flush,
# ibv_wr_atomic_write), built in place -- libibverbs, librdmacm and the rxe
# provider only -- in the cache of the chosen lab kernel. Never installed,
# never mixed with the host's rdma-core 44 (the 56 rxe provider under the
# 44 libibverbs makes ibv_qp_to_qp_ex return NULL): a pmirror build folder
# configured with the printed pkg-config folder links it with an rpath, and
# its libibverbs finds its own rxe provider in the same build.
#
#   PMIRROR_LAB_KERNEL=6.12 scripts/lab/rdma-core.sh      # prints <...>/lib/pkgconfig
#   PKG_CONFIG_PATH=$(PMIRROR_LAB_KERNEL=6.12 scripts/lab/rdma-core.sh) \
#     cmake -S . -B build-rdma56 -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
#
# The source comes through a private apt configuration in the cache (its own
# deb-src list, lists and cache folders: the host's apt state is untouched);
# the tarball is checked against the sha256 that trixie's Sources index
# gives. About 15 s of building on 2 cores; a second run does nothing.
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=scripts/lab/common.sh
source "$here/common.sh"

[[ $LAB_KERNEL != 6.1 ]] ||
  lab_die "rdma-core.sh: the 6.1 guest uses the host's rdma-core; set PMIRROR_LAB_KERNEL=6.12"
lab_check_cache_path
mkdir -p "$LAB_CACHE"
for tool in curl cmake ninja sha256sum; do
  command -v "$tool" >/dev/null || lab_die "rdma-core.sh: $tool missing"
done

pa="$LAB_CACHE/apt-src"
apt_src=(-o "Dir::Etc::sourcelist=$pa/sources.list" -o Dir::Etc::sourceparts=-
         -o "Dir::State::Lists=$pa/lists" -o "Dir::Cache=$pa/cache" -o Debug::NoLocking=1)
if [[ ! -f $pa/updated ]]; then
  mkdir -p "$pa/lists/partial" "$pa/cache/archives/partial"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
    >"$pa/sources.list"
  apt-get -qq "${apt_src[@]}" update >&2 || lab_die "rdma-core.sh: apt-get update of trixie's sources failed"
  touch "$pa/updated"
fi
record=$(apt-cache "${apt_src[@]}" showsrc rdma-core) ||
  lab_die "rdma-core.sh: no rdma-core in trixie's sources"
version=$(sed -n 's/^Version: //p' <<<"$record" | head -n1)
upstream=${version%-*}
tarball="rdma-core_$upstream.orig.tar.gz"
sha=$(awk -v f="$tarball" '/^Checksums-Sha256:/ {on=1; next} /^[^ ]/ {on=0} on && $3 == f {print $1; exit}' \
  <<<"$record")
directory=$(sed -n 's/^Directory: //p' <<<"$record" | head -n1)
[[ -n $upstream && -n $sha && -n $directory ]] ||
  lab_die "rdma-core.sh: cannot read version, checksum or folder of $tarball from trixie's sources"

src="$LAB_CACHE/rdma-core-$upstream"
build="$src/build"
if [[ ! -f $build/.built ]]; then
  if [[ ! -d $src ]]; then
    curl -fsSL -o "$LAB_CACHE/$tarball" "http://deb.debian.org/debian/$directory/$tarball" ||
      lab_die "rdma-core.sh: downloading $tarball failed"
    echo "$sha  $LAB_CACHE/$tarball" | sha256sum -c --quiet - ||
      lab_die "rdma-core.sh: $tarball does not match trixie's sha256"
    tar -xzf "$LAB_CACHE/$tarball" -C "$LAB_CACHE"
    rm -f "$LAB_CACHE/$tarball"
  fi
  mkdir -p "$build"
  echo "rdma-core.sh: building rdma-core $upstream in $build" >&2
  (cd "$build" &&
     cmake -G Ninja -DIN_PLACE=1 -DNO_MAN_PAGES=1 -DNO_PYVERBS=1 -DENABLE_STATIC=0 \
       -DCMAKE_BUILD_TYPE=Release .. >"$build/cmake.log" 2>&1 &&
     ninja lib/libibverbs.so lib/librdmacm.so lib/librxe-rdmav34.so >"$build/ninja.log" 2>&1) || {
    tail -n 30 "$build/cmake.log" "$build/ninja.log" >&2 2>/dev/null
    lab_die "rdma-core.sh: building rdma-core $upstream failed (logs in $build)"
  }
  touch "$build/.built"
fi
[[ -f $build/lib/pkgconfig/libibverbs.pc ]] || lab_die "rdma-core.sh: no libibverbs.pc in $build/lib/pkgconfig"
echo "$build/lib/pkgconfig"

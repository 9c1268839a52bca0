#!/usr/bin/env bash
# The Debian packages, built and proven (docs/packaging.md):
#   1. dpkg-buildpackage -us -uc -b --post-clean on a copy of the tree, in
#      build-package/, which is left with the same files as before;
#   2. lintian: no error, no warning;
#   3. the binaries carry the hardening (fortify, stack protector, relro,
#      BIND_NOW, PIE) and are stripped; their sizes are printed;
#   4. dpkg -i of pmirrord, libpmirror0, libpmirror-dev and pmirror-run;
#   5. the installed files: --version, systemd-analyze verify on the
#      installed unit, the man pages, the bash completion, the conffile;
#   6. the quick start against the installed binaries;
#   7. an external C program (pkg-config) and CMake project (find_package)
#      built against libpmirror-dev mirror writes to the installed pmirrord;
#   8. pmirrord used once (a volume, a secret in /etc/pmirror, the default
#      state pool), then the packages purged: nothing of theirs is left in
#      /etc/pmirror, /var/lib/pmirror, /run/pmirror or systemd's folders.
#      A machine that had pmirror before keeps it: then nothing is purged,
#      and a cluster file that was there is put back (PMIRROR_PACKAGE_KEEP=1
#      leaves the packages installed).
# Run as root on Debian 12 (scripts/test.sh calls it; PMIRROR_SKIP_PACKAGE=1
# skips it there). Build dependencies come from scripts/install-deps.sh.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${PMIRROR_PACKAGE_DIR:-$repo/build-package}
packages=(pmirrord libpmirror0 libpmirror-dev pmirror-run)

step() { echo "== package: $*"; }
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
[[ ${EUID} -eq 0 ]] || fail "run as root (dpkg -i)"

# The Debian version's upstream part is the project's (include/pmirror/version.h).
version=$(dpkg-parsechangelog -l "$repo/debian/changelog" -SVersion)
upstream=${version%-*}
header_version=$(awk '/^#define PMIRROR_VERSION_(MAJOR|MINOR|PATCH) / { v = v (v == "" ? "" : ".") $3 }
                      END { print v }' "$repo/include/pmirror/version.h")
[[ $upstream == "$header_version" ]] ||
  fail "debian/changelog says $version, include/pmirror/version.h $header_version: add a changelog entry (dch -v $header_version-1)"

# ---- 1. build -------------------------------------------------------------
step "dpkg-buildpackage -us -uc -b --post-clean ($version) in $out"
rm -rf "$out"
source_copy=$out/pmirror-$upstream
mkdir -p "$source_copy"
# The tree as it is (uncommitted changes too), without build trees or git.
tar -C "$repo" --exclude=./.git --exclude='./build*' --exclude=./.lab-cache --exclude=./out \
  -cf - . | tar -C "$source_copy" -xf -
# What the tree holds before the build: the build must leave it so.
tree_files() { (cd "$source_copy" && find . | LC_ALL=C sort); }
files_before=$(tree_files)
started=$SECONDS
# Line tables only (-g1 after Debian's -g: the last one counts), as
# scripts/build.sh builds: the debug symbols package is smaller and the
# build about a quarter faster, which CI's 60 minutes need; nothing the
# steps below check depends on it. PMIRROR_PACKAGE_FULL_DEBUG_INFO=1 builds
# with Debian's flags alone.
if [[ ${PMIRROR_PACKAGE_FULL_DEBUG_INFO:-0} != 1 ]]; then
  export DEB_CFLAGS_APPEND=-g1 DEB_CXXFLAGS_APPEND=-g1
fi
if ! (cd "$source_copy" && dpkg-buildpackage -us -uc -b --post-clean) >"$out/build.log" 2>&1; then
  tail -50 "$out/build.log" >&2
  fail "dpkg-buildpackage failed; the whole log is $out/build.log"
fi
build_seconds=$((SECONDS - started))
left=$(diff <(echo "$files_before") <(tree_files) | grep '^[<>]' || true)
[[ -z $left ]] || fail "the package build changed the tree ('>' left behind, '<' removed); debian/rules clean must undo it:
$left"
echo "the tree after the build: as before (debian/rules clean undid the build)"
arch=$(dpkg --print-architecture)
changes=$out/pmirror_${version}_${arch}.changes
debs=()
for package in "${packages[@]}"; do
  deb=$out/${package}_${version}_${arch}.deb
  [[ -f $deb ]] || fail "no $deb"
  debs+=("$deb")
done
echo "built in ${build_seconds}s:"
(cd "$out" && ls -l ./*.deb | awk '{ print "  " $5 "\t" $NF }')

# ---- 2. lintian -------------------------------------------------------------
step "lintian --fail-on error,warning"
lintian --fail-on error,warning --info "$changes" || fail "lintian (above)"
echo "lintian: no error or warning"

# ---- 3. hardening, stripping, sizes ----------------------------------------
step "hardening and sizes"
unpacked=$out/unpacked
for deb in "${debs[@]}"; do dpkg-deb -x "$deb" "$unpacked"; done
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
library=$(echo "$unpacked"/usr/lib/"$multiarch"/libpmirror.so.0.*)
for binary in "$unpacked/usr/sbin/pmirrord" "$unpacked/usr/sbin/pmirrorctl" "$library"; do
  name=$(basename "$binary")
  headers=$(readelf -lW "$binary")
  dynamic=$(readelf -dW "$binary")
  symbols=$(readelf -sW --dyn-syms "$binary")
  grep -q GNU_RELRO <<<"$headers" || fail "$name: no RELRO"
  grep -Eq 'BIND_NOW|FLAGS_1.*NOW' <<<"$dynamic" || fail "$name: no BIND_NOW"
  grep -q __stack_chk_fail <<<"$symbols" || fail "$name: no stack protector"
  grep -Eq '__[a-z_]+_chk@' <<<"$symbols" || fail "$name: no fortified function (_FORTIFY_SOURCE)"
  [[ $name == libpmirror* ]] || readelf -hW "$binary" | grep -q 'Type:.*DYN' || fail "$name: not PIE"
  readelf -SW "$binary" | grep -q '\.debug_info' && fail "$name: not stripped"
  printf '  %-22s %9d bytes installed (stripped; hardened: relro, bindnow, stack protector, fortify)\n' \
    "$name" "$(stat -c %s "$binary")"
done
for built in "$repo/build/daemon/pmirrord" "$repo/build/lib/initiator/libpmirror.so.$upstream"; do
  [[ -f $built ]] && printf '  %-22s %9d bytes in build/ (RelWithDebInfo, unstripped)\n' \
    "$(basename "$built")" "$(stat -c %s "$built")"
done
for deb in "$out"/*.deb; do
  printf '  %-40s Installed-Size %6s KiB\n' "$(basename "$deb")" "$(dpkg-deb -f "$deb" Installed-Size)"
done

# The maintainer scripts never enable pmirrord, nor stop or restart it on
# an upgrade (docs/packaging.md); only a removal stops it.
scripts=$out/pmirrord.control
dpkg-deb -e "$out/pmirrord_${version}_${arch}.deb" "$scripts"
grep -q "deb-systemd-helper enable" "$scripts/postinst" &&
  ! grep -q "was-enabled" "$scripts/postinst" && fail "postinst enables pmirrord"
grep -q "restart" "$scripts/postinst" && fail "postinst restarts pmirrord"
[[ -f $scripts/preinst ]] && grep -q "stop" "$scripts/preinst" && fail "preinst stops pmirrord on upgrade"
grep -A1 '"$1" = remove' "$scripts/prerm" | grep -q 'deb-systemd-invoke stop' ||
  fail "prerm does not stop pmirrord on removal"
echo "maintainer scripts: no enable, no stop or restart on upgrade, stop on removal"

# ---- 4. install -------------------------------------------------------------
# A developer's machine is left as found: what was installed before is not
# purged afterwards, and a cluster file the package does not own is kept
# aside and put back (purging would delete it as the package's conffile).
preinstalled=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" &&
    preinstalled+=("$package")
done
# Step 8 purges and looks for leftovers only on a machine without pmirror:
# elsewhere the state and secrets there are someone's.
pristine=1
((${#preinstalled[@]} == 0)) || pristine=0
for path in /etc/pmirror /var/lib/pmirror; do [[ -e $path ]] && pristine=0; done
saved_cluster_file=
if [[ -e /etc/pmirror/cluster.yaml ]] && ! dpkg -S /etc/pmirror/cluster.yaml >/dev/null 2>&1; then
  saved_cluster_file=$out/cluster.yaml.saved
  cp -a /etc/pmirror/cluster.yaml "$saved_cluster_file"
fi
purged=0
use_pid=
cleanup() {
  [[ -n $use_pid ]] && kill "$use_pid" 2>/dev/null && wait "$use_pid" 2>/dev/null
  if ((purged)); then
    return
  elif [[ ${PMIRROR_PACKAGE_KEEP:-0} == 1 ]]; then
    echo "package: left installed (PMIRROR_PACKAGE_KEEP=1): ${packages[*]}"
    return
  fi
  if ((${#preinstalled[@]})); then
    echo "package: ${preinstalled[*]} were installed before this test; left installed (now $version)"
  else
    dpkg -P "${packages[@]}" >"$out/purge.log" 2>&1 || cat "$out/purge.log" >&2
  fi
  if [[ -n $saved_cluster_file ]]; then
    mkdir -p /etc/pmirror
    cp -a "$saved_cluster_file" /etc/pmirror/cluster.yaml
  fi
}
trap cleanup EXIT

step "dpkg -i ${packages[*]}"
# confold: a cluster file already there stays as it is.
DEBIAN_FRONTEND=noninteractive dpkg -i --force-confold "${debs[@]}" >"$out/install.log" 2>&1 ||
  { cat "$out/install.log" >&2; fail "dpkg -i"; }
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" | grep -q "install ok installed" ||
    fail "$package is not installed after dpkg -i"
done

# ---- 5. the installed files -------------------------------------------------
step "installed files"
[[ $(/usr/sbin/pmirrord --version) == "pmirrord $upstream" ]] || fail "pmirrord --version"
[[ $(/usr/sbin/pmirrorctl --version) == "pmirrorctl $upstream" ]] || fail "pmirrorctl --version"
unit=$(dpkg -L pmirrord | grep '/systemd/system/pmirrord.service$') || fail "no unit in pmirrord"
grep -qx 'ExecStart=/usr/sbin/pmirrord --config /etc/pmirror/cluster.yaml' "$unit" ||
  fail "$unit does not start /usr/sbin/pmirrord with /etc/pmirror/cluster.yaml"
# verify also runs `man` for every Documentation=man: page.
analyzed=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify $unit: $analyzed"
[[ -z $analyzed ]] || fail "systemd-analyze verify $unit warns: $analyzed"
echo "systemd-analyze verify $unit: clean"
[[ $(/usr/sbin/pmirror-promoter --version) == "pmirror-promoter $upstream" ]] ||
  fail "pmirror-promoter --version"
promoter_unit=$(dpkg -L pmirrord | grep '/systemd/system/pmirror-promoter.service$') ||
  fail "no pmirror-promoter unit in pmirrord"
analyzed=$(systemd-analyze verify "$promoter_unit" 2>&1) ||
  fail "systemd-analyze verify $promoter_unit: $analyzed"
[[ -z $analyzed ]] || fail "systemd-analyze verify $promoter_unit warns: $analyzed"
echo "systemd-analyze verify $promoter_unit: clean"
# The Pacemaker resource agent: installed where Pacemaker looks
# (OCF_ROOT=/usr/lib/ocf), executable, and its meta-data valid against the
# OCF DTD when resource-agents is there to check it.
agent=/usr/lib/ocf/resource.d/pmirror/pmirror
dpkg -L pmirrord | grep -qx "$agent" || fail "no $agent in pmirrord"
[[ -x $agent ]] || fail "$agent is not executable"
metadata=$(OCF_ROOT=/usr/lib/ocf "$agent" meta-data) || fail "$agent meta-data"
grep -q '<resource-agent name="pmirror"' <<<"$metadata" || fail "$agent meta-data: no resource-agent"
if [[ -f /usr/share/resource-agents/ra-api-1.dtd ]] && command -v xmllint >/dev/null; then
  (cd /usr/share/resource-agents && xmllint --noout --valid - <<<"$metadata") ||
    fail "$agent meta-data is not valid against ra-api-1.dtd"
fi
echo "  ocf:pmirror:pmirror: $agent"
for page in "pmirrorctl" "5 pmirror-cluster.yaml" "pmirror_persist" "pmirrord" "pmirror-promoter" "libpmirror" \
  "pmirror_wait" "pmirror_cfg_set_ack"; do
  # shellcheck disable=SC2086  # "5 name" is two words
  path=$(man -w $page) || fail "man -w $page finds nothing"
  # shellcheck disable=SC2086
  text=$(MANPAGER=cat MANWIDTH=80 man $page 2>&1) || fail "man $page"
  grep -q NAME <<<"$text" || fail "man $page shows no NAME section"
  echo "  man $page: $path"
done
MANPAGER=cat MANWIDTH=200 man pmirror_wait | grep -q 'pmirror_wait(volume' ||
  fail "man pmirror_wait does not show pmirror_persist(3)"
dpkg-query -W -f='${Conffiles}\n' pmirrord | grep -q ' /etc/pmirror/cluster.yaml ' ||
  fail "/etc/pmirror/cluster.yaml is not a conffile of pmirrord"
if [[ -z $saved_cluster_file ]]; then
  # The installed cluster file serves nothing: pmirrord refuses it.
  set +e
  refused=$(/usr/sbin/pmirrord --check-config 2>&1)
  status=$?
  set -e
  [[ $status == 2 ]] || fail "pmirrord accepts the installed cluster file (exit $status): $refused"
  echo "pmirrord refuses the installed cluster file (exit 2): $refused"
fi
# Completion: the subcommands, from the installed script.
completion=/usr/share/bash-completion/completions/pmirrorctl
offered=$(bash -c "source /usr/share/bash-completion/bash_completion; source $completion
  COMP_WORDS=(pmirrorctl ''); COMP_CWORD=1; COMP_LINE='pmirrorctl '; COMP_POINT=11
  _pmirrorctl; echo \${COMPREPLY[*]}")
[[ $offered == *status*verify* ]] || fail "the installed completion offers '$offered'"
echo "bash completion offers: $offered"

# ---- 6. the quick start -----------------------------------------------------
step "quick start against the installed binaries"
PMIRROR_QUICKSTART_INSTALLED=1 PMIRROR_PORT=${PMIRROR_PORT:-17460} "$repo/scripts/quickstart.sh"

# ---- 7. external programs ---------------------------------------------------
step "external C (pkg-config) and CMake (find_package) programs against libpmirror-dev"
"$repo/tests/external/install_and_mirror.sh" --installed

# ---- 8. use, then purge: nothing of pmirror's is left ----------------------
if ((pristine)) && [[ ${PMIRROR_PACKAGE_KEEP:-0} != 1 ]]; then
  step "pmirrord used once, then dpkg --purge ${packages[*]}: nothing left"
  # What a node's first use creates, as the installed cluster file says: a
  # secret in /etc/pmirror, the default state pool in /var/lib/pmirror, the
  # control socket in /run/pmirror. The volume lives outside all three.
  use=$out/use
  mkdir -p "$use" /run/pmirror
  (umask 077 && head -c 32 /dev/urandom | base64 >/etc/pmirror/pkgtest.secret)
  cat >/etc/pmirror/cluster.yaml <<YAML
nodes:
  - {name: pkgtest-app, address: 192.0.2.1, port: 17471}
  - {name: pkgtest-replica, address: 127.0.0.1, port: ${PMIRROR_PORT:-17460}}
volumes:
  - name: pkgtest
    size: 1MiB
    primary: pkgtest-app
    replicas: [pkgtest-replica]
    path: $use/pkgtest.img
    create: true
    allowed_peers: [pkgtest]
    secret_file: /etc/pmirror/pkgtest.secret
YAML
  /usr/sbin/pmirrord --node pkgtest-replica --foreground >"$out/use.log" 2>&1 &
  use_pid=$!
  for _ in $(seq 300); do
    /usr/sbin/pmirrorctl status >/dev/null 2>&1 && break
    kill -0 "$use_pid" 2>/dev/null || { cat "$out/use.log" >&2; fail "pmirrord did not start"; }
    sleep 0.1
  done
  /usr/sbin/pmirrorctl status >/dev/null || { cat "$out/use.log" >&2; fail "pmirrord does not answer"; }
  kill "$use_pid"
  wait "$use_pid" || true
  use_pid=
  [[ -f /var/lib/pmirror/pmirrord.state ]] || fail "pmirrord made no /var/lib/pmirror/pmirrord.state"
  # Enabled, as an operator does: the purge takes the links away too.
  enabled=0
  systemctl enable pmirrord.service >/dev/null 2>&1 && enabled=1
  dpkg -P "${packages[@]}" >"$out/purge.log" 2>&1 || { cat "$out/purge.log" >&2; fail "dpkg -P"; }
  purged=1
  # libpmirror makes /run/pmirror for an application's control socket
  # (initiator-PID.sock): while some application runs, the folder is its,
  # not the package's leftover. Anything else there is.
  runtime_excused=
  if [[ -d /run/pmirror ]]; then
    runtime_excused=/run/pmirror
    for entry in /run/pmirror/*; do
      [[ -e $entry ]] || continue
      # An application's socket while it runs; its metrics-owner lock
      # (initiator-PID.metrics-owner) whenever: libpmirror's, not the package's.
      if [[ $(basename "$entry") =~ ^initiator-([0-9]+)\.(sock|metrics-owner)$ ]] &&
        [[ ${BASH_REMATCH[2]} == metrics-owner || -d /proc/${BASH_REMATCH[1]} ]]; then
        continue
      fi
      runtime_excused=
    done
    [[ -n $runtime_excused ]] &&
      echo "note: /run/pmirror holds applications' runtime files only:" /run/pmirror/*
  fi
  for package in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
    [[ -z $status || $status == *not-installed ]] || fail "$package after dpkg -P: $status"
  done
  left=$(find /etc/pmirror /var/lib/pmirror /run/pmirror /usr/share/doc/pmirrord \
    /etc/systemd /lib/systemd/system /var/lib/systemd \( -name '*pmirror*' -o -path '*pmirror/*' \) \
    2>/dev/null | grep -v "^${runtime_excused:-/nothing-excused}\(/\|$\)" || true)
  [[ -z $left ]] || { cat "$out/purge.log" >&2; fail "dpkg -P left:
$left"; }
  [[ -f $use/pkgtest.img ]] || fail "dpkg -P removed the volume $use/pkgtest.img"
  how=; ((enabled)) && how=" (the unit was enabled)"
  echo "purged: no /etc/pmirror, /var/lib/pmirror, /run/pmirror, unit or link left$how; the volume outside them kept"
else
  echo "package: step 8 (purge) skipped: pmirror was on this machine before, or PMIRROR_PACKAGE_KEEP=1"
fi

step "OK: built in ${build_seconds}s, lintian clean, installed, verified, purged clean"

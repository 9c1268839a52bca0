#!/usr/bin/env bash
# The proof of libpmirror's API boundary: install the build into an empty
# prefix, build an external C program with pkg-config (libpmirror.pc) and an
# external C++ project with CMake's find_package(pmirror) (pmirror::pmirror)
# against that tree alone (include/pmirror/ and libpmirror.so; nothing from
# the source or build tree), run them against the installed pmirrord
# serving file-backed volumes over tcp on loopback, and check that the
# replicas hold what the programs wrote.
#
#   install_and_mirror.sh CMAKE BUILD_DIR LIBDIR [SANITIZE]   (ctest)
#   install_and_mirror.sh --installed                       (the packages)
# LIBDIR: where libraries go under the prefix (lib/<multiarch> on Debian).
# --installed uses what the Debian packages installed under /usr
# (libpmirror-dev, pmirrord) instead of installing anything
# (scripts/package-test.sh).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
if [[ ${1:-} == --installed ]]; then
  installed=1
  cmake_command=cmake
  build_dir=
  sanitize=OFF
else
  installed=0
  cmake_command=$1
  build_dir=$2
  libdir=$3
  sanitize=${4:-OFF}
fi

work=$(mktemp -d /tmp/pmirror-external.XXXXXX)
daemon_pid=
cleanup() {
  if [[ -n $daemon_pid ]]; then
    kill "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

if ((installed)); then
  prefix=/usr
  pmirrord=/usr/sbin/pmirrord
  doc=/usr/share/doc/libpmirror-dev/initiator.md
  pkg_config=(pkg-config)
  cmake_prefix=()
else
  prefix=$work/prefix
  echo "== cmake --install $build_dir --prefix $prefix"
  "$cmake_command" --install "$build_dir" --prefix "$prefix" >"$work/install.log" ||
    { cat "$work/install.log" >&2; fail "install failed"; }
  pmirrord=$prefix/sbin/pmirrord
  doc=$prefix/share/doc/pmirror/initiator.md
  # Only this prefix's libpmirror.pc, whatever else the machine has.
  pkg_config=(env PKG_CONFIG_LIBDIR="$prefix/$libdir/pkgconfig" pkg-config)
  cmake_prefix=(-DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
fi
include=$prefix/include
lib=$("${pkg_config[@]}" --variable=libdir libpmirror) || fail "pkg-config finds no libpmirror"
[[ -f $lib/libpmirror.so ]] || fail "no $lib/libpmirror.so"
if ((!installed)); then
  [[ $(ls "$include") == pmirror ]] || fail "include/ holds more than pmirror/: $(ls "$include")"
fi
echo "installed headers: $(cd "$include" && echo pmirror/*)"

echo "== the C program, with pkg-config --cflags --libs libpmirror"
warnings=(-Wall -Wextra -Werror)
sanitizer=()
[[ $sanitize == ON ]] && sanitizer=(-fsanitize=address,undefined)
# A program linked to a ThreadSanitizer libpmirror must be instrumented too.
[[ $sanitize == TSAN ]] && sanitizer=(-fsanitize=thread)
read -r -a cflags <<<"$("${pkg_config[@]}" --cflags libpmirror)"
read -r -a libs <<<"$("${pkg_config[@]}" --libs libpmirror)"
cc -std=c11 "${warnings[@]}" "${sanitizer[@]}" "${cflags[@]}" -MD -MF "$work/mirror-c.d" \
  "$here/mirror.c" -o "$work/mirror-c" "${libs[@]}" -Wl,-rpath,"$lib" ||
  fail "the C program does not build with pkg-config's flags"

echo "== the C++ program, a CMake project with find_package(pmirror)"
"$cmake_command" -S "$here/project" -B "$work/project" -G Ninja "${cmake_prefix[@]}" \
  -DCMAKE_CXX_FLAGS="${warnings[*]} ${sanitizer[*]}" \
  -DCMAKE_EXE_LINKER_FLAGS="${sanitizer[*]}" >"$work/project.log" 2>&1 ||
  { cat "$work/project.log" >&2; fail "find_package(pmirror) failed"; }
"$cmake_command" --build "$work/project" >>"$work/project.log" 2>&1 ||
  { cat "$work/project.log" >&2; fail "the C++ program does not build against pmirror::pmirror"; }
cp "$work/project/mirror-cpp" "$work/mirror-cpp"
ninja -C "$work/project" -t deps >"$work/mirror-cpp.d"

# Every header they read is the system's or the installed pmirror/ ones:
# none from the source or build tree, no other pmirror header.
for deps in "$work/mirror-c.d" "$work/mirror-cpp.d"; do
  for path in $(sed -e 's/^[^:]*://' -e 's/\\$//' -e 's/#deps.*//' "$deps"); do
    [[ -e $path ]] || continue
    real=$(realpath "$path")
    case $real in
      "$here"/mirror.c | "$here"/mirror.cpp) ;;
      "$include"/pmirror/*) ;;
      "$source_dir"/*) fail "$(basename "$deps" .d) read $real from the tree" ;;
      *pmirror*) fail "$(basename "$deps" .d) read $real, not the installed header" ;;
    esac
  done
done
for program in mirror-c mirror-cpp; do
  resolved=$(ldd "$work/$program" | awk '/libpmirror/ { print $3 }')
  [[ $(realpath "$resolved") == "$(realpath "$lib")"/* ]] ||
    fail "$program loads libpmirror from '$resolved', not $lib"
done

# The examples of the installed docs/initiator.md compile the same way.
[[ -f $doc ]] || fail "no $doc"
awk -v dir="$work" '
  /^```(c|cpp)$/ { lang = substr($0, 4); file = dir "/doc-example-" (++n) "." lang; next }
  /^```/ { file = ""; next }
  file != "" { print > file }' "$doc"
examples=("$work"/doc-example-*)
(( ${#examples[@]} >= 3 )) || fail "expected C and C++ examples in $doc, found ${#examples[@]}"
for example in "${examples[@]}"; do
  case $example in
    *.c) cc -std=c11 "${warnings[@]}" "${cflags[@]}" -fsyntax-only "$example" ;;
    *.cpp) c++ -std=c++17 "${warnings[@]}" "${cflags[@]}" -fsyntax-only "$example" ;;
  esac || { cat -n "$example" >&2; fail "an example of docs/initiator.md does not compile"; }
done
echo "the ${#examples[@]} examples of docs/initiator.md compile"

echo "== starting the installed pmirrord, $pmirrord (tcp, loopback)"
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port=$(free_port)
secret="external programs' secret"
{
  cat <<YAML
daemon:
  control_socket: $work/pmirrord.sock
  state_pool: $work/pmirrord.state
  log_level: info
nodes:
  - {name: app, address: 127.0.0.1, port: $(free_port), state_pool: $work/app.state, control_socket: $work/app.sock}
  - {name: target, address: 127.0.0.1, port: $port, transport: tcp}
volumes:
YAML
  for volume in c1 c2 cpp; do
    cat <<YAML
  - name: $volume
    size: 1MiB
    primary: app
    replicas: [target]
    paths: {app: $work/app-$volume.img, target: $work/target-$volume.img}
    create: true
    allowed_peers: [app]
    secret: "$secret"
YAML
  done
} >"$work/cluster.yaml"
"$pmirrord" --config "$work/cluster.yaml" --node target --foreground \
  >"$work/pmirrord.log" 2>&1 &
daemon_pid=$!
for attempt in $(seq 300); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$work/pmirrord.log" >&2; fail "pmirrord exited"; }
  [[ $attempt == 300 ]] && { cat "$work/pmirrord.log" >&2; fail "pmirrord never listened"; }
  sleep 0.1
done

message_c1="written by an external C program, opened from the cluster file"
message_c2="written by an external C program, opened through a pmirror_cfg"
message_cpp="written by an external C++ program through pmirror.hpp"
# The application's stdout holds only what the application wrote: the
# library logs to stderr ("... pmirror info: ..."), at the threshold that
# PMIRROR_LOG_LEVEL names (default info).
only_the_program_on_stdout() {  # program stdout-file
  if grep -v "^$1: " "$2"; then
    fail "$1's stdout holds lines the program did not write (above)"
  fi
}
echo "== mirror-c (default log level)"
"$work/mirror-c" "$work/cluster.yaml" "$work/app-c2.img" "$port" "$secret" "$message_c1" \
  "$message_c2" >"$work/mirror-c.out" 2>"$work/mirror-c.err" ||
  { cat "$work/mirror-c.out" "$work/mirror-c.err" "$work/pmirrord.log" >&2; fail "mirror-c failed"; }
cat "$work/mirror-c.out" "$work/mirror-c.err"
only_the_program_on_stdout mirror-c "$work/mirror-c.out"
grep -q ' pmirror info: ' "$work/mirror-c.err" ||
  fail "libpmirror logged nothing to stderr at the default level (info)"
echo "== mirror-cpp (PMIRROR_LOG_LEVEL=warn)"
PMIRROR_LOG_LEVEL=warn "$work/mirror-cpp" "$work/app-cpp.img" "$port" "$secret" "$message_cpp" \
  >"$work/mirror-cpp.out" 2>"$work/mirror-cpp.err" ||
  { cat "$work/mirror-cpp.out" "$work/mirror-cpp.err" "$work/pmirrord.log" >&2; fail "mirror-cpp failed"; }
cat "$work/mirror-cpp.out" "$work/mirror-cpp.err"
only_the_program_on_stdout mirror-cpp "$work/mirror-cpp.out"
if grep ' pmirror info: ' "$work/mirror-cpp.err"; then
  fail "PMIRROR_LOG_LEVEL=warn let info lines through (above)"
fi

kill "$daemon_pid"
wait "$daemon_pid" || true
daemon_pid=

echo "== comparing the replicas with what the programs wrote"
expect_at() {  # file offset text
  local found
  found=$(dd if="$1" bs=1 skip="$2" count="${#3}" status=none)
  [[ $found == "$3" ]] || fail "$1 at $2 holds '$found', not '$3'"
}
expect_at "$work/target-c1.img" 4096 "$message_c1"
expect_at "$work/target-c2.img" 4096 "$message_c2"
expect_at "$work/target-cpp.img" 4096 "$message_cpp"
for volume in c1 c2 cpp; do
  cmp "$work/app-$volume.img" "$work/target-$volume.img" ||
    fail "the replica of $volume differs from the local copy"
done
echo "OK: the external C program (pkg-config) and C++ project (find_package), built against" \
     "the installed tree only ($prefix), mirrored their writes to pmirrord"

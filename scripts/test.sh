#!/usr/bin/env bash
# Installs what pmirror needs, builds it, and runs every test: unit and
# integration tests (ctest), the same under ASan+UBSan, the quick start,
# the Debian packages (scripts/package-test.sh), and the rdma tests in the
# QEMU lab (scripts/lab/test.sh); with PMIRROR_EXTENDED=1
# (scripts/test-extended.sh) also the ThreadSanitizer pass, the fuzz
# harnesses for a bounded time (scripts/fuzz.sh) and longer runs.
# Run as root on Debian 12. `.ci/run` calls this. docs/testing.md.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Each stage's wall time, printed at the end (also when a stage fails):
# docs/testing.md keeps the budget (the whole run under 60 min on 2 cores).
stage_names=() stage_seconds=() stage_started=$SECONDS current_stage=""
stage() {
  if [[ -n $current_stage ]]; then
    stage_names+=("$current_stage")
    stage_seconds+=($((SECONDS - stage_started)))
  fi
  current_stage=$1 stage_started=$SECONDS
  [[ -n $1 ]] && echo "== $1"
  return 0
}
print_stage_times() {
  local status=$?
  stage ""
  echo "== time per stage (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
  for i in "${!stage_names[@]}"; do
    printf '%6d s  %s\n' "${stage_seconds[$i]}" "${stage_names[$i]}"
  done
  printf '%6d s  total\n' "$SECONDS"
  return $status
}
trap print_stage_times EXIT

stage "install dependencies"
"$repo/scripts/install-deps.sh"

stage "build"
"$repo/scripts/build.sh"
stage "tests"
(cd "$repo/build" && ctest --output-on-failure --timeout 600 -j 2)

sanitizer_skip='^(InsufficientTest\.APersistWiderThanTheActivityLogArrivesWhole|FailoverTest\.FrozenPrimaryIsFencedAndComesBackAsAReplica|ocf_agent)$'

if [[ ${PMIRROR_SKIP_ASAN:-0} != 1 ]]; then
  stage "build with ASan+UBSan"
  "$repo/scripts/build.sh" --asan
  stage "tests under ASan+UBSan"
  # Not here (nor under TSan): tests whose time goes into one long run of
  # code that shorter tests of the pass cover (a 288 MiB persist; a
  # primary frozen for 30 s), and the Pacemaker agent's (a shell script
  # driving pmirrord through paths the other tests cover). The release pass
  # runs them; docs/testing.md, "Time each stage takes".
  # Nor the one-writer crash sweeps (a target crashed at every operation
  # in turn: the same paths hundreds of times, about 45 s of the release
  # pass and three times that here); the several-writers, both-sides and
  # initiator-process crash tests stay.
  asan_skip="${sanitizer_skip%)\$}|CrashTest\.(Apm|Gpspm)(Target|Async).*|CrashTest\.(OrderedGroups|NativeFlush).*)\$"
  (cd "$repo/build-asan" && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure --timeout 900 -j 2 \
    -E "$asan_skip")
fi

# ThreadSanitizer (a third build and a third pass, about 900 s on CI's
# machine) went beyond CI's 60 minutes with issue 26 (CI's run of stop 35:
# 4049 s): it runs with PMIRROR_EXTENDED=1, before an issue that touches
# threads, locks or the data path is resolved (docs/testing.md).
extended=${PMIRROR_EXTENDED:-0}

if [[ $extended == 1 && ${PMIRROR_SKIP_TSAN:-0} != 1 ]]; then
  stage "build with ThreadSanitizer"
  "$repo/scripts/build.sh" --tsan
  stage "tests under ThreadSanitizer"
  # Every process the tests start (pmirrord, pmirrorctl, tools) inherits
  # TSAN_OPTIONS and writes its reports next to the others: a race in a
  # daemon fails the pass even when the test that ran it passed.
  reports=$repo/build-tsan/tsan-reports
  rm -rf "$reports" && mkdir -p "$reports"
  tsan_status=0
  # The build has no single-threaded test programs (SINGLE_THREADED in
  # tests/: parsers, codecs, formats) nor fuzz corpus replays: TSan has
  # nothing to find there.
  # Not here, beside the ASan pass's skips: tests with one thread of ours
  # that take minutes under TSan (pmemobj pools killed in a loop; the
  # returning old primary's 80 s), the etcd promoter's and client's,
  # whose threads are etcd's (Go) and pmirrord's, which the other tests
  # here cover; the one-writer crash tests (a target killed at every
  # operation in turn: hundreds of process starts, one writer thread; the
  # several-writers ones stay), the installed-tree programs (a cmake build
  # of two programs) and the Pacemaker agent's. The other passes run them; docs/testing.md, "Time each
  # stage takes".
  tsan_skip='^(InsufficientTest\.APersistWiderThanTheActivityLogArrivesWhole|MetadataTest\..*SurviveSigkill|RecoveryTest\.PromotedReplicaResyncsTheReturningOldPrimary|FailoverTest\..*|EtcdClient[A-Za-z]*\..*|CrashTest\.(Apm|Gpspm)(Target|Async).*|CrashTest\.(OrderedGroups|NativeFlush).*|CrashTest\.(BothSides|Negative|InitiatorProcess).*|external_programs_mirror_through_the_installed_tree|ocf_agent)$'
  (cd "$repo/build-tsan" &&
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 log_path=$reports/tsan suppressions=$repo/tests/sanitizers/tsan.supp" \
      ctest --output-on-failure --timeout 900 -j 2 -E "$tsan_skip") || tsan_status=$?
  if compgen -G "$reports/tsan.*" >/dev/null; then
    echo "ThreadSanitizer reported (tests/sanitizers/tsan.supp lists what is suppressed and why):"
    cat "$reports"/tsan.*
    tsan_status=1
  fi
  ((tsan_status == 0)) || exit "$tsan_status"
fi

# Fuzzing does not fit CI's 60 minutes on 2 cores beside three builds, the
# packages and the lab (docs/testing.md): it runs with PMIRROR_EXTENDED=1
# (scripts/test-extended.sh), before an issue that touches a parser is
# resolved. Every ctest run still replays the fuzz corpora.

if [[ $extended == 1 && ${PMIRROR_SKIP_FUZZ:-0} != 1 ]]; then
  stage "fuzzing: each harness for ${PMIRROR_FUZZ_SECONDS:-60} s"
  "$repo/scripts/fuzz.sh"
fi

# Also beyond CI's time: the crash tests, each PMDK program under pmirror-run
# killed at 50 random moments in each durability mode (CI's ctest kills
# each 4 times, 2 per mode; docs/pmdk.md, "Crash tests"), the tcp-only
# build (a fourth build, of pmirrord, pmirrorctl and libpmirror), and a three-node
# Pacemaker cluster losing its primary's node (docs/failover.md, section 3;
# a few minutes, namespaces).
if [[ $extended == 1 ]]; then
  stage "pmirror-run under kill -9, 50 times per program and durability mode"
  kill_status=0
  for mode in observed drain; do
    for program in pmemobj-counters:16MiB pmemobj-two-counters:16MiB pmemlog-records:16MiB \
      pmemblk-records:32MiB; do
      PMIRROR_TEST_DURABILITY=$mode "$repo/tests/pmdk/kill_test.sh" "$repo/build/daemon/pmirror-run" \
        "$repo/build/daemon/pmirrord" "$repo/build/examples/${program%%:*}" 50 "${program#*:}" ||
        kill_status=1
    done
  done
  # The log line written inside the next transaction (observation points
  # inside a libpmemobj transaction).
  TWO_COUNTERS_LOG_IN_TX=1 PMIRROR_TEST_DURABILITY=observed "$repo/tests/pmdk/kill_test.sh" \
    "$repo/build/daemon/pmirror-run" "$repo/build/daemon/pmirrord" \
    "$repo/build/examples/pmemobj-two-counters" 50 16MiB || kill_status=1
  ((kill_status == 0)) || { echo "the crash tests failed (above)" >&2; exit 1; }
  stage "a tcp-only build (PMIRROR_RDMA=OFF)"
  "$repo/tests/unit/transport/rdma_off_build.sh" "$repo"
  stage "Pacemaker: three nodes, the primary's cut off"
  "$repo/scripts/pacemaker-cluster.sh" 3
fi

if [[ ${PMIRROR_SKIP_SOAK:-0} != 1 ]]; then
  if [[ $extended == 1 ]]; then
    stage "soak: 60 min of mixed faults on 50 volumes (scripts/soak.sh --long)"
    "$repo/scripts/soak.sh" --long
  else
    stage "soak: 90 s of mixed faults (scripts/soak.sh --short)"
    "$repo/scripts/soak.sh" --short
  fi
fi

stage "quick start"
PMIRROR_PORT=${PMIRROR_PORT:-17450} "$repo/scripts/quickstart.sh"

# ---- Debian packages (scripts/package-test.sh): build, lintian, dpkg -i,
# the installed unit, man pages, quick start and external programs against
# the packages, then purge. PMIRROR_SKIP_PACKAGE=1 skips it.
if [[ ${PMIRROR_SKIP_PACKAGE:-0} != 1 ]]; then
  stage "Debian packages"
  "$repo/scripts/package-test.sh"
fi
# ---- end of the Debian packages

if [[ ${PMIRROR_SKIP_LAB:-0} != 1 ]]; then
  stage "rdma tests in the QEMU lab (Soft-RoCE + NVDIMMs)"
  "$repo/scripts/lab/test.sh"
fi

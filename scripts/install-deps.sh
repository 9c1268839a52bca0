#!/usr/bin/env bash
# Installs everything pmirror needs to build and test on Debian 12.
# Idempotent: packages already present are skipped by apt. Run as root.
set -euo pipefail

packages=(
  build-essential cmake pkg-config ninja-build git
  libpmem-dev libpmemobj-dev pmdk-tools
  # pmirror-run's libpmemlog and libpmemblk examples and tests
  libpmemlog-dev libpmemblk-dev
  libibverbs-dev librdmacm-dev ibverbs-providers
  libspdlog-dev libfmt-dev libcli11-dev libyaml-cpp-dev
  googletest libgtest-dev libgmock-dev
  nlohmann-json3-dev libssl-dev libxxhash-dev libsystemd-dev
  # the metrics endpoint: prometheus-cpp's text format served by civetweb;
  # promtool (in Debian's prometheus) checks a scrape in metrics_test
  prometheus-cpp-dev libcivetweb-dev prometheus
  # pmirror-promoter: etcd's JSON gateway over libcurl; etcd for its tests
  libcurl4-openssl-dev etcd-server etcd-client
  # the Pacemaker resource agent's test (ocf/pmirror: jq; ocf-tester, xmllint)
  jq resource-agents libxml2-utils
  systemd
  # scripts/soak.sh: namespaces and links (iproute2), network faults (nftables), its report (python3)
  procps iproute2 nftables python3
  # a test that finds a hang prints the hung process's stacks (tests/pmdk/lib.sh)
  gdb
  # scripts/fuzz.sh: clang with libFuzzer and the sanitizer runtimes
  clang libclang-rt-dev
  # man pages, and the Debian packages (scripts/package-test.sh)
  scdoc debhelper dpkg-dev fakeroot lintian man-db bash-completion
)

if [[ ${EUID} -ne 0 ]]; then
  echo "install-deps: run as root (apt-get needs it)" >&2
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all packages present"
fi

#!/usr/bin/env bash
# completion/pmirrorctl.bash, driven as bash does on <TAB>, with the built
# pmirrorctl answering `__complete` from config/cluster.example.yaml.
#   completion_test.sh PMIRRORCTL SOURCE_DIR
set -euo pipefail
pmirrorctl=$1
source_dir=$2
bash_completion=/usr/share/bash-completion/bash_completion
if [[ ! -f $bash_completion ]]; then
  echo "SKIP: $bash_completion missing (Debian package bash-completion)"
  exit 0
fi
work=$(mktemp -d /tmp/pmirror-completion.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
ln -s "$pmirrorctl" "$work/bin/pmirrorctl"
# A second cluster file, for `config check FILE --node`.
printf '%s\n' 'nodes: [{name: other1, address: 10.1.0.1}, {name: other2, address: 10.1.0.2}]' \
  'volumes: [{name: v, size: 1MiB, primary: other1, replicas: [other2], path: /tmp/v,' \
  '  allowed_peers: [a], secret: "0123456789abcdef0123"}]' >"$work/other.yaml"

failures=0
# expect "WORDS TYPED" "EXPECTED COMPLETIONS": the last word is completed.
expect() {
  local line=$1 expected=$2 got
  got=$(PATH="$work/bin:$PATH" PMIRROR_CLUSTER_FILE="$source_dir/config/cluster.example.yaml" \
    bash -c 'source "$1"; source "$2"
      read -r -a COMP_WORDS <<<"$3"
      [[ $3 == *" " ]] && COMP_WORDS+=("")
      COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMP_LINE=$3; COMP_POINT=${#3}
      _pmirrorctl; printf "%s\n" "${COMPREPLY[@]}" | sort | xargs' \
    _ "$bash_completion" "$source_dir/completion/pmirrorctl.bash" "$line")
  if [[ $got == "$expected" ]]; then
    echo "ok   '$line' -> $got"
  else
    echo "FAIL '$line' -> '$got', expected '$expected'"
    failures=$((failures + 1))
  fi
}
expect "pmirrorctl " "config connect demote disconnect down events promote reload resync status up verify"
expect "pmirrorctl st" "status"
expect "pmirrorctl --timeout 100 ve" "verify"
expect "pmirrorctl --" "--help --runtime-dir --socket --timeout --version"
expect "pmirrorctl status " "db0 log0"
expect "pmirrorctl status db0 " ""
expect "pmirrorctl resync " "db0 log0"
expect "pmirrorctl resync db0 --peer " "node1 node2 node3"
expect "pmirrorctl resync db0 --" "--full --help --json --peer --wait"
expect "pmirrorctl verify db0 --" "--help --json --mark-dirty --peer"
expect "pmirrorctl promote d" "db0"
expect "pmirrorctl down " "db0 log0"
expect "pmirrorctl up --" "--help --json"
expect "pmirrorctl disconnect db0 --peer " "node1 node2 node3"
expect "pmirrorctl connect db0 --" "--help --json --peer"
expect "pmirrorctl events --" "--count --help --json --now"
expect "pmirrorctl reload --" "--dry-run --help --json"
expect "pmirrorctl config " "check show"
expect "pmirrorctl config show $work/other.yaml --node " "other1 other2"
expect "pmirrorctl config show $work/other.yaml --" "--help --node --volume"
expect "pmirrorctl config check $work/other.yaml --node " "other1 other2"
expect "pmirrorctl config check $work/other.yaml --" "--engine --help --node --volume"
expect "pmirrorctl config check $work/other.yaml --engine " "etcd none pacemaker"
if ((failures)); then
  echo "$failures completion(s) wrong"
  exit 1
fi

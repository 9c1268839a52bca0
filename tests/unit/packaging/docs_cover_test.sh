#!/usr/bin/env bash
# Every subcommand and option that `--help` of pmirrorctl and pmirrord shows
# is in their man page source (man/*.8.scd), pmirrorctl's also in the bash
# completion; every C function pmirror.h exports is named by a man page.
#   docs_cover_test.sh PMIRRORCTL PMIRRORD SOURCE_DIR
set -euo pipefail
pmirrorctl=$1
pmirrord=$2
source_dir=$3
problems=0
problem() {
  echo "$*" >&2
  problems=$((problems + 1))
}
# Long options in a --help text (the help flag itself aside).
options_of() { grep -oE -- '--[a-z][a-z-]*' | grep -vx -- '--help' | sort -u; }
# Subcommands in a CLI11 --help text.
subcommands_of() { sed -n '/^Subcommands:/,/^$/p' | awk 'NR > 1 && NF { print $1 }'; }

man_ctl=$source_dir/man/pmirrorctl.8.scd
man_d=$source_dir/man/pmirrord.8.scd
completion=$source_dir/completion/pmirrorctl.bash

check_in() {  # WORD FILE WHAT
  grep -qF -- "$1" "$2" || problem "$3 $1 is not in $(basename "$2")"
}

# pmirrorctl: its subcommands, and each one's (config: check's) options.
mapfile -t commands < <("$pmirrorctl" --help | subcommands_of)
((${#commands[@]} >= 7)) || problem "pmirrorctl --help lists ${#commands[@]} subcommands"
for option in $("$pmirrorctl" --help | options_of); do
  check_in "$option" "$man_ctl" "pmirrorctl option"
  check_in "$option" "$completion" "pmirrorctl option"
done
for command in "${commands[@]}"; do
  [[ $command == config ]] || check_in "*$command*" "$man_ctl" "pmirrorctl subcommand"
  grep -qE "(^|[ '])$command([ '|)]|$)" "$completion" || problem "subcommand $command is not completed"
  invocations=("$command")
  if [[ $command == config ]]; then
    invocations=()
    for sub in $("$pmirrorctl" config --help | subcommands_of); do
      check_in "*config $sub*" "$man_ctl" "pmirrorctl subcommand"
      invocations+=("config $sub")
    done
  fi
  for invocation in "${invocations[@]}"; do
    # shellcheck disable=SC2086  # "config check" is two words
    for option in $("$pmirrorctl" $invocation --help | options_of); do
      check_in "$option" "$man_ctl" "pmirrorctl $invocation option"
      check_in "$option" "$completion" "pmirrorctl $invocation option"
    done
  done
done

# pmirrord's options.
for option in $("$pmirrord" --help | options_of); do
  check_in "$option" "$man_d" "pmirrord option"
done

# Every exported C function is a page or on a page's NAME line (an alias).
names=$(for page in "$source_dir"/man/*.3.scd; do
  awk '/^# NAME$/ { getline; getline; sub(/ - .*/, ""); gsub(/, /, "\n"); print; exit }' "$page"
done | sort -u)
for function in $(grep -oE 'PMIRROR_EXPORT [^(]*\bpmirror_[a-z0-9_]+\(' \
  "$source_dir/include/pmirror/pmirror.h" | grep -oE 'pmirror_[a-z0-9_]+' | sort -u); do
  grep -qx "$function" <<<"$names" || problem "$function has no man page (man/*.3.scd NAME lines)"
done

echo "$problems problem(s)"
((problems == 0))

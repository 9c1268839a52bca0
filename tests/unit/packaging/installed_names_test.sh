#!/usr/bin/env bash
# What the installed programs and libraries say (messages, --help) and the
# installed text (headers, units, the example cluster file) name installed
# things: a man page or /usr/share/doc/..., never a path of the source tree
# (docs/config.md, config/cluster.example.yaml) that does not exist on an
# installed system.
#   installed_names_test.sh PROGRAM_LIBRARY_TEXT_FILE_OR_FOLDER...
set -euo pipefail
# docs/X.md or config/X.yaml not inside a longer path (/usr/share/doc/...).
source_path='(^|[^/A-Za-z0-9_.-])(docs|config)/[A-Za-z0-9_.-]+\.(md|yaml)'
problems=0
problem() {
  echo "$*" >&2
  problems=$((problems + 1))
}

for file in "$@"; do
  if [[ -d $file || ( -f $file && $(head -c 4 "$file") != $'\x7fELF' ) ]]; then
    while IFS= read -r text; do
      problem "installed text names a source path: $text"
    done < <(grep -rEn "$source_path" "$file" || true)
    continue
  fi
  [[ -s $file ]] || { problem "$file: missing"; continue; }
  while IFS= read -r text; do
    problem "$(basename "$file") names a source path: $text"
  done < <(strings -a -n 6 "$file" | grep -E "$source_path" || true)
  # The help text as shown (CLI11 builds it from pieces), every subcommand's too.
  if [[ -x $file && ! $file =~ \.so ]]; then
    help=$("$file" --help 2>&1 || true)
    [[ $help == *--help* ]] || problem "$(basename "$file") --help shows no help"
    for command in $(sed -n '/^Subcommands:/,/^$/p' <<<"$help" | awk 'NR > 1 && NF { print $1 }'); do
      help+=$'\n'$("$file" "$command" --help 2>&1 || true)
    done
    while IFS= read -r text; do
      problem "$(basename "$file") --help names a source path: $text"
    done < <(grep -E "$source_path" <<<"$help" || true)
  fi
done

echo "$# file(s), $problems problem(s)"
((problems == 0))

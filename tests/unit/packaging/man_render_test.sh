#!/usr/bin/env bash
# The built man pages read as written once man(1) renders them: scdoc takes
# a backslash as an escape even in literal blocks (write `\\n` for C's \n,
# or the example prints "n") and `++` at the end of a line as a line break
# (write `C\+\+`, or "C++" at a line's end becomes "C" and a break); and
# they name installed documents, never docs/*.md of the source tree.
#   man_render_test.sh MAN_BUILD_DIR SOURCE_DIR
set -euo pipefail
man_dir=$1
source_dir=$2
problems=0
problem() {
  echo "$*" >&2
  problems=$((problems + 1))
}

pages=("$man_dir"/*.[1-8])
((${#pages[@]} >= 10)) || problem "only ${#pages[@]} man pages in $man_dir"
for page in "${pages[@]}"; do
  name=$(basename "$page")
  source=$source_dir/man/$name.scd
  [[ -f $source ]] || { problem "$name: no source $source"; continue; }
  text=$(MANWIDTH=80 MAN_KEEP_FORMATTING= man --warnings -l "$page" 2>/dev/null | col -b)
  [[ -n $text ]] || { problem "$name: man renders nothing"; continue; }

  # A string in a printf-family call that ends in a bare n: the \n of the
  # source lost its backslash.
  while IFS= read -r line; do
    problem "$name: an example prints 'n' where '\\n' was meant: ${line#"${line%%[! ]*}"}"
  done < <(grep -E '(printf|puts)\(([a-z]+, )?"([^"\\]|\\.)*[^\\%]n"' <<<"$text" || true)
  # Every \n in the source's literal blocks renders as \n.
  want=$(awk '/^```/ { inside = !inside; next } inside' "$source" | { grep -oF '\n' || true; } | wc -l)
  got=$({ grep -oF '\n' <<<"$text" || true; } | wc -l)
  ((got >= want)) || problem "$name: the source's examples have $want \\n, the page shows $got"

  # "C" ending a line where "C++" was meant, and every C++ of the source
  # (its escapes \+ undone) is on the page.
  while IFS= read -r line; do
    problem "$name: a line ends in a lone 'C' (C++ broken by scdoc's '++' line break?): $line"
  done < <(grep -E '(^|[^A-Za-z])C$' <<<"$text" || true)
  # Installed pages name installed documents, not the source tree's.
  while IFS= read -r line; do
    problem "$name: names a source-tree path: ${line#"${line%%[! ]*}"}"
  done < <(grep -E '(^|[^/A-Za-z0-9_.-])(docs|config)/[A-Za-z0-9_.-]+\.(md|yaml)' <<<"$text" || true)
  want=$(sed 's/\\+/+/g' "$source" | { grep -oF 'C++' || true; } | wc -l)
  got=$({ grep -oF 'C++' <<<"$text" || true; } | wc -l)
  ((got == want)) || problem "$name: the source says C++ $want times, the page $got"
done

echo "${#pages[@]} page(s), $problems problem(s)"
((problems == 0))

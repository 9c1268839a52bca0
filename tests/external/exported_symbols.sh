#!/usr/bin/env bash
# libpmirror.so exports its API and nothing else: every defined dynamic
# symbol is a C function declared in pmirror.h or one of the public C++
# API's functions below (include/pmirror/pmirror.hpp, status.hpp), and each
# of those is there. Run by ctest: exported_symbols.sh LIBPMIRROR.so PMIRROR.h
set -euo pipefail
library=$1
header=$2

# The public C++ API, as the demangled names of what it must export.
# A new public C++ function goes here (and in lib/initiator/libpmirror.map).
cxx_api=(
  'pmirror::errc_name(pmirror::Errc)'
  'pmirror::replica_state_name(pmirror::ReplicaState)'
  'pmirror::set_log_function(std::function<void (pmirror::LogLevel, std::basic_string_view<char, std::char_traits<char> >)>)'
  'pmirror::set_log_threshold(pmirror::LogLevel)'
  'pmirror::Status::to_string[abi:cxx11]() const'
  'pmirror::Status::with_context(std::basic_string_view<char, std::char_traits<char> >) const'
  'pmirror::Volume::~Volume()'
  'pmirror::Volume::open(pmirror::VolumeOptions const&)'
  'pmirror::Volume::open_from_config(std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&)'
  'pmirror::Volume::open_from_config(std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&, std::function<void (pmirror::VolumeOptions&)> const&)'
  'pmirror::Volume::data() const'
  'pmirror::Volume::size() const'
  'pmirror::Volume::is_pmem() const'
  'pmirror::Volume::persist(unsigned long, unsigned long)'
  'pmirror::Volume::write(unsigned long, void const*, unsigned long)'
  'pmirror::Volume::persist_async(unsigned long, unsigned long)'
  'pmirror::Volume::persist_async(pmirror::PersistRange const*, unsigned long, void const*)'
  'pmirror::Volume::persist_ordered_async(pmirror::PersistRange const*, unsigned long, unsigned int const*, unsigned long, void const*)'
  'pmirror::Volume::wait(unsigned long)'
  'pmirror::Volume::drain()'
  'pmirror::Volume::resync(std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&, bool)'
  'pmirror::Volume::verify(std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&, bool)'
  'pmirror::Volume::replicas() const'
  'pmirror::Volume::status_json[abi:cxx11]() const'
)

# Every defined dynamic symbol, without its version (name@@PMIRROR_0); the
# version node itself (an absolute symbol) is not code.
mapfile -t exported < <(nm -D --defined-only "$library" | awk '$2 != "A" { print $3 }' |
                        sed 's/@.*//' | sort -u)
mapfile -t c_api < <(grep -o 'PMIRROR_EXPORT [^(]*\bpmirror_[a-z0-9_]*(' "$header" |
                     grep -o 'pmirror_[a-z0-9_]*(' | tr -d '(' | sort -u)
if (( ${#c_api[@]} == 0 )); then
  echo "no PMIRROR_EXPORT function found in $header" >&2
  exit 1
fi

declare -A allowed=()
for name in "${c_api[@]}"; do allowed[$name]=1; done
declare -A cxx_allowed=()
for name in "${cxx_api[@]}"; do cxx_allowed[$name]=1; done

problems=0
declare -A seen=()
for symbol in "${exported[@]}"; do
  if [[ -n ${allowed[$symbol]:-} ]]; then
    seen[$symbol]=1
    continue
  fi
  demangled=$(c++filt "$symbol")
  if [[ -n ${cxx_allowed[$demangled]:-} ]]; then
    seen[$demangled]=1
    continue
  fi
  echo "exported but not public API: $demangled ($symbol)" >&2
  problems=$((problems + 1))
done
for name in "${c_api[@]}" "${cxx_api[@]}"; do
  if [[ -z ${seen[$name]:-} ]]; then
    echo "public API but not exported: $name" >&2
    problems=$((problems + 1))
  fi
done

echo "$library: ${#exported[@]} defined dynamic symbols; ${#c_api[@]} C functions in" \
     "$(basename "$header"), ${#cxx_api[@]} C++ functions; $problems problems"
(( problems == 0 ))

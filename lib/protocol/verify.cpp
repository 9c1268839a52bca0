// hash_chunks: kept apart from protocol.cpp so that the fuzz target, which
// compiles protocol.cpp alone, needs no libxxhash.
#include <xxhash.h>

#include <algorithm>

#include "protocol/protocol.h"

namespace pmirror::protocol {

std::vector<uint64_t> hash_chunks(std::span<const std::byte> data, uint64_t chunk_size) {
  std::vector<uint64_t> hashes;
  if (chunk_size == 0) return hashes;
  hashes.reserve(chunk_count(data.size(), chunk_size));
  for (uint64_t at = 0; at < data.size(); at += chunk_size) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_size, data.size() - at));
    hashes.push_back(XXH3_64bits(data.data() + at, n));
  }
  return hashes;
}

}  // namespace pmirror::protocol

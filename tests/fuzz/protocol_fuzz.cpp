// libFuzzer harness for protocol::decode. Built only with -DPMIRROR_FUZZ=ON
// and clang (tests/unit/protocol/CMakeLists.txt):
//   CXX=clang++ CC=clang cmake -S . -B build-fuzz -G Ninja -DPMIRROR_FUZZ=ON
//   cmake --build build-fuzz --target protocol_fuzz
//   build-fuzz/tests/unit/protocol/protocol_fuzz -max_len=4200
// Checks, besides memory safety: whatever decode accepts re-encodes to the
// identical bytes (one canonical encoding per message).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "protocol/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::byte> input(size);
  for (size_t i = 0; i < size; ++i) input[i] = static_cast<std::byte>(data[i]);
  pmirror::Result<pmirror::protocol::Message> message = pmirror::protocol::decode(input);
  if (!message.ok()) return 0;
  std::vector<std::byte> again;
  if (!pmirror::protocol::encode(*message, again).ok() || again != input) std::abort();
  return 0;
}

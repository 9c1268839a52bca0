// Fuzz harness: protocol::decode on every byte string a peer could send
// (docs/testing.md). Checks, besides memory safety
// and undefined behaviour:
//  - whatever decode accepts re-encodes to the identical bytes (one
//    canonical encoding per message, so no two peers disagree about one);
//  - a rejection is kProtocolError or kUnsupported with a message;
//  - the receiver's checks that follow decode (check_ranges,
//    check_verify_request) accept only what lies inside the region, and an
//    ErrorReply's Status turns back into an ErrorReply that encodes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <variant>
#include <vector>

#include "protocol/protocol.h"

namespace {

using namespace pmirror;
using namespace pmirror::protocol;

// A region of a size a target could have: 1 GiB.
constexpr uint64_t kRegionSize = uint64_t{1} << 30;

void require(bool condition) {
  if (!condition) std::abort();
}

void check_ranges_inside(const std::vector<Range>& ranges) {
  if (!check_ranges(ranges, kRegionSize).ok()) return;
  for (const Range& range : ranges) {
    require(range.length > 0);
    require(range.offset < kRegionSize && range.length <= kRegionSize - range.offset);
  }
}

void check_accepted(const Message& message) {
  if (const auto* commit = std::get_if<Commit>(&message)) {
    check_ranges_inside(commit->ranges);
  } else if (const auto* persist = std::get_if<PersistRequest>(&message)) {
    check_ranges_inside(persist->ranges);
  } else if (const auto* verify = std::get_if<VerifyRequest>(&message)) {
    if (check_verify_request(*verify, kRegionSize).ok()) {
      require(verify->length > 0 && verify->offset <= kRegionSize &&
              verify->length <= kRegionSize - verify->offset);
      require(chunk_count(verify->length, verify->chunk_size) <= kMaxVerifyChunks);
    }
  } else if (const auto* error = std::get_if<ErrorReply>(&message)) {
    Status status = to_status(*error);
    require(!status.ok());
    std::vector<std::byte> again;
    require(encode(make_error_reply(status), again).ok());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::byte> input(size);
  for (size_t i = 0; i < size; ++i) input[i] = static_cast<std::byte>(data[i]);
  Result<Message> message = decode(input);
  if (!message.ok()) {
    require(message.status().code() == Errc::kProtocolError ||
            message.status().code() == Errc::kUnsupported);
    require(!message.status().message().empty());
    return 0;
  }
  std::vector<std::byte> again;
  require(encode(*message, again).ok() && again == input);
  check_accepted(*message);
  return 0;
}

// The pmirror wire protocol: the two-sided messages (Send/Recv) that an
// initiator and a target exchange. Data itself moves by one-sided Write/Read
// (transport.h); these messages set up the session and carry bookkeeping.
//
// Every message: a 16-byte little-endian header, then the payload.
//   u32 magic 'PMIR' (0x52494d50)  u16 version  u16 type
//   u32 payload_length             u32 reserved (0)
// docs/protocol.md is the reference; keep it in step with this file.
//
// decode() validates every field: wrong magic, unknown type, a length that
// disagrees with the bytes received or exceeds the limits, strings that are
// too long or contain NULs, range lists that are empty, too long or
// overflow, nonzero reserved fields, trailing bytes -- all come back as
// kProtocolError with a message naming the field. A different protocol
// version comes back as kUnsupported naming both versions, so the receiver
// can forward that Status in an ErrorReply. Bounds against a volume's size
// are checked by the receiver (check_ranges), which knows the size.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/status.h"

namespace pmirror::protocol {

inline constexpr uint32_t kMagic = 0x52494d50;  // "PMIR" little-endian
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHeaderSize = 16;
inline constexpr size_t kMaxMessageSize = 4096;  // header + payload, = a receive slot
inline constexpr size_t kMaxNameLength = 64;     // volume name, identity
inline constexpr size_t kMaxErrorText = 512;
inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kMacSize = 32;  // HMAC-SHA256
// Ranges that fit in one Commit/PersistRequest next to its fixed fields.
inline constexpr size_t kMaxRangesPerMessage = 200;

enum class MessageType : uint16_t {
  kHello = 1,             // initiator -> target: open a session
  kChallenge = 2,         // target -> initiator: target's nonce
  kAuthResponse = 3,      // initiator -> target: MAC over both nonces
  kVolumeDescriptor = 4,  // target -> initiator: session accepted, how to reach the region
  kCommit = 5,            // initiator -> target: bookkeeping after an APM flush
  kCommitAck = 6,         // target -> initiator: bookkeeping recorded (returns a credit)
  kPersistRequest = 7,    // initiator -> target: GPSPM, persist these ranges, then ack
  kPersistAck = 8,        // target -> initiator: ranges durable
  kError = 9,             // either way: request refused / session ending, with reason
  kGoodbye = 10,          // initiator -> target: orderly close
  kPing = 11,             // either way: liveness
  kPong = 12,
};

// Persistency methods a target can guarantee (bit set on the wire).
enum PersistMethod : uint32_t {
  kMethodApm = 1u << 0,    // Read after Write flushes into the persistence domain
  kMethodGpspm = 1u << 1,  // target persists on request (Send), then acks
};

struct Range {
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const Range&) const = default;
};

struct Hello {
  std::string volume;    // which volume to open
  std::string identity;  // who is asking (checked against allowed peers)
  std::array<uint8_t, kNonceSize> client_nonce{};
  uint32_t flags = 0;  // reserved, 0
  bool operator==(const Hello&) const = default;
};

struct Challenge {
  std::array<uint8_t, kNonceSize> server_nonce{};
  bool operator==(const Challenge&) const = default;
};

struct AuthResponse {
  std::array<uint8_t, kMacSize> mac{};  // auth::initiator_proof(...)
  bool operator==(const AuthResponse&) const = default;
};

struct VolumeDescriptor {
  uint64_t region_size = 0;
  uint64_t remote_address = 0;
  uint32_t rkey = 0;
  uint32_t methods = 0;                 // PersistMethod bits the target guarantees
  uint64_t generation = 0;              // the target's current generation for the volume
  uint64_t last_sequence = 0;           // last sequence the target recorded
  uint32_t recv_slots = 0;              // how many messages may be in flight to the target
  std::array<uint8_t, kMacSize> mac{};  // auth::target_proof(...): the target knows the secret too
  bool operator==(const VolumeDescriptor&) const = default;
};

struct Commit {
  uint64_t sequence = 0;
  uint64_t generation = 0;
  std::vector<Range> ranges;  // 1..kMaxRangesPerMessage
  bool operator==(const Commit&) const = default;
};

struct CommitAck {
  uint64_t sequence = 0;
  bool operator==(const CommitAck&) const = default;
};

// A PersistRequest with this sequence carries no bookkeeping: the target
// persists the ranges and acks, but records nothing. Initiators use it to
// bring a replica's copy up to date (resync) under GPSPM.
inline constexpr uint64_t kResyncSequence = 0;

struct PersistRequest {
  uint64_t sequence = 0;
  uint64_t generation = 0;
  std::vector<Range> ranges;  // 1..kMaxRangesPerMessage
  bool operator==(const PersistRequest&) const = default;
};

struct PersistAck {
  uint64_t sequence = 0;
  bool operator==(const PersistAck&) const = default;
};

struct ErrorReply {
  Errc code = Errc::kInternal;
  std::string text;  // at most kMaxErrorText bytes
  bool operator==(const ErrorReply&) const = default;
};

struct Goodbye {
  bool operator==(const Goodbye&) const = default;
};

struct Ping {
  uint64_t token = 0;
  bool operator==(const Ping&) const = default;
};

struct Pong {
  uint64_t token = 0;
  bool operator==(const Pong&) const = default;
};

using Message = std::variant<Hello, Challenge, AuthResponse, VolumeDescriptor, Commit, CommitAck,
                             PersistRequest, PersistAck, ErrorReply, Goodbye, Ping, Pong>;

MessageType type_of(const Message& message);
std::string_view type_name(MessageType type);

// Serialises into out (cleared first). Fails only for messages that break
// the limits (too many ranges, a name too long) -- a bug in the caller.
Status encode(const Message& message, std::vector<std::byte>& out);
// Parses one whole message (exactly the bytes received).
Result<Message> decode(std::span<const std::byte> bytes);

// Every range non-empty, inside [0, region_size), and offset+length not
// overflowing. The target calls this before touching its region.
Status check_ranges(std::span<const Range> ranges, uint64_t region_size);

// A volume name: 1..kMaxNameLength bytes of [A-Za-z0-9._-]. kInvalidArgument
// otherwise (decode() reports the same rule as kProtocolError).
Status check_name(std::string_view name);

// An ErrorReply carrying status (which must not be ok): the code as is, the
// message cut to kMaxErrorText bytes (on a UTF-8 boundary) with NULs
// replaced, so encode() always accepts it.
ErrorReply make_error_reply(const Status& status);
// The Status a received ErrorReply stands for ("<text>" with its code).
Status to_status(const ErrorReply& reply);

}  // namespace pmirror::protocol

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
inline constexpr uint16_t kVersion = 2;
inline constexpr size_t kHeaderSize = 16;
inline constexpr size_t kMaxMessageSize = 4096;  // header + payload, = a receive slot
inline constexpr size_t kMaxNameLength = 64;     // volume name, identity
inline constexpr size_t kMaxErrorText = 512;
inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kMacSize = 32;  // HMAC-SHA256
// Ranges that fit in one Commit/PersistRequest next to its fixed fields.
inline constexpr size_t kMaxRangesPerMessage = 200;
// Activity-log extents a VolumeDescriptor may report (= the metadata's
// kActivityLogSlots).
inline constexpr size_t kMaxActivityExtents = 64;
// Previous generations a VolumeDescriptor carries (= metadata::kHistory).
inline constexpr size_t kGenerationHistory = 4;
// Chunks one VerifyRequest may cover, hashes one VerifyReply carries.
inline constexpr size_t kMaxVerifyChunks = 256;
// VerifyRequest.chunk_size: a power of two in this range.
inline constexpr uint64_t kMinVerifyChunkSize = 512;
inline constexpr uint64_t kMaxVerifyChunkSize = 1ull << 20;

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
  kSetGeneration = 13,  // initiator -> target: adopt this data generation
  kGenerationAck = 14,  // target -> initiator: generation recorded in the copy's metadata
  kVerifyRequest = 15,  // initiator -> target: hash these chunks of your copy
  kVerifyReply = 16,    // target -> initiator: the hashes
  kFenceAck = 17,       // target -> promoted node: the fence (a Hello with kHelloFence) is in force
};

// Persistency methods a target can guarantee (bit set on the wire).
enum PersistMethod : uint32_t {
  kMethodApm = 1u << 0,    // Read after Write flushes into the persistence domain
  kMethodGpspm = 1u << 1,  // target persists on request (Send), then acks
  // With APM: the target makes each Write durable before it executes the
  // next operation of the connection (tcp onto pmem: a cache-line flush per
  // Write), so placement order is durability order, and an ordered
  // persist's groups need no flush Read between them. Only declared to an
  // initiator whose Hello set kHelloPlacementOrder.
  kMethodPlacementOrder = 1u << 2,
  // A FLUSH (the fabric's verb: persistent, range) after Writes makes them
  // durable, on any platform: the copy is pmem, registered for FLUSH on a
  // device that has it (docs/transport-rdma.md, "Native persistence").
  // Only with APM (the one-sided path), only to an initiator whose Hello
  // set kHelloNativeFlush.
  kMethodNativeFlush = 1u << 3,
  // With native flush: the initiator records each persist's sequence
  // itself, with the fabric's ATOMIC WRITE behind the persist's FLUSH, into
  // the commit word the target registered (VolumeDescriptor.commit_address
  // and commit_rkey), and sends no Commits; the target reads the word when
  // it needs it (docs/protocol.md, "One-sided commit"). Only to an initiator
  // whose Hello set kHelloOneSidedCommit.
  kMethodOneSidedCommit = 1u << 4,
};
inline constexpr uint32_t kMethodsKnown =
    kMethodApm | kMethodGpspm | kMethodPlacementOrder | kMethodNativeFlush | kMethodOneSidedCommit;

// VolumeDescriptor.copy_flags: the state of the target's copy (its
// metadata pool, lib/metadata).
enum CopyFlag : uint32_t {
  // The copy holds one generation's data; clear while a resync into it is
  // under way (its bytes are then a mix of two generations).
  kCopyConsistent = 1u << 0,
  // The copy was promoted on its node (it refuses sessions, so a
  // descriptor never carries this bit today; defined for completeness).
  kCopyPromoted = 1u << 1,
  // The copy was a primary that did not close cleanly: the
  // activity_extents name what may differ from the other copies.
  kCopyUnclean = 1u << 2,
};
inline constexpr uint32_t kCopyFlagsKnown = kCopyConsistent | kCopyPromoted | kCopyUnclean;

// SetGeneration.flags.
enum GenerationFlag : uint32_t {
  // The copy now holds exactly this generation's data (resync done, or in
  // sync already). Clear: a resync into the copy starts now.
  kGenerationConsistent = 1u << 0,
};
inline constexpr uint32_t kGenerationFlagsKnown = kGenerationConsistent;

struct Range {
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const Range&) const = default;
};

// Hello.flags: what the initiator understands beyond version 2's basics.
enum HelloFlag : uint32_t {
  // A CommitAck acknowledges every Commit up to its sequence (and returns
  // their credits): the target may answer a run of Commits with one.
  kHelloCumulativeAcks = 1u << 0,
  // Not a writer: a fence (docs/failover.md). The identity is a node of
  // the volume where it was just promoted, lineage.current the promoted
  // copy's new generation (kHelloLineage is required). The target answers
  // the AuthResponse with FenceAck once the fence is in force, not with a
  // VolumeDescriptor.
  kHelloFence = 1u << 1,
  // The Hello ends with `lineage`: the data generations of the initiator's
  // copy, which a fenced target checks (a primary whose copy does not
  // descend from the promoted one is refused with kFenced).
  kHelloLineage = 1u << 2,
  // The initiator understands VolumeDescriptor.methods' kMethodPlacementOrder
  // (an initiator that predates it refuses a descriptor with that bit).
  kHelloPlacementOrder = 1u << 3,
  // The initiator understands VolumeDescriptor.methods' kMethodNativeFlush.
  kHelloNativeFlush = 1u << 4,
  // The initiator understands VolumeDescriptor.methods' kMethodOneSidedCommit
  // (and the descriptor's commit word fields that come with it).
  kHelloOneSidedCommit = 1u << 5,
  // The initiator's copy was promoted (pmirrorctl promote, not demoted
  // since): a new primary. A target whose copy no fence reached records
  // one at the lineage's current generation: the new primary's first
  // handshake is the fence (docs/failover.md, section 1). Only with
  // kHelloLineage, never with kHelloFence.
  kHelloPromoted = 1u << 6,
};
inline constexpr uint32_t kHelloFlagsKnown = kHelloCumulativeAcks | kHelloFence | kHelloLineage |
                                             kHelloPlacementOrder | kHelloNativeFlush |
                                             kHelloOneSidedCommit | kHelloPromoted;

// The data generations of the initiator's copy, as it knows them.
struct Lineage {
  uint64_t current = 0;
  std::array<uint64_t, kGenerationHistory> history{};  // newest first, 0 = unused
  // The generation the initiator was at when it left this target behind
  // (it tracks the target's copy since then); 0: it did not.
  uint64_t left_behind_at = 0;
  // True when g (nonzero) is one of the above.
  bool knows(uint64_t g) const;
  bool operator==(const Lineage&) const = default;
};

struct Hello {
  std::string volume;    // which volume to open
  std::string identity;  // who is asking (checked against allowed peers)
  std::array<uint8_t, kNonceSize> client_nonce{};
  uint32_t flags = 0;  // HelloFlag bits
  Lineage lineage;     // on the wire only with kHelloLineage (else all 0)
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
  uint32_t methods = 0;        // PersistMethod bits the target guarantees
  uint64_t generation = 0;     // the session bookkeeping generation (state pool), for Commits
  uint64_t last_sequence = 0;  // last sequence the target recorded
  uint32_t recv_slots = 0;     // how many messages may be in flight to the target
  // --- the target's copy (its metadata pool) ---
  std::array<uint8_t, 16> copy_uuid{};  // which copy this is (random, fixed at creation)
  uint64_t data_generation = 0;         // the copy's current data generation; 0 = never written
  // Previous data generations, newest first; 0 = unused (always after the used ones).
  std::array<uint64_t, kGenerationHistory> generation_history{};
  uint32_t copy_flags = 0;            // CopyFlag bits
  uint64_t activity_extent_size = 0;  // bytes per activity extent
  // With kCopyUnclean: extents [i * activity_extent_size, +size) that may
  // differ from the other copies; strictly ascending, 0..kMaxActivityExtents.
  std::vector<uint64_t> activity_extents;
  std::array<uint8_t, kMacSize> mac{};  // auth::target_proof(...): the target knows the secret too
  // With kMethodOneSidedCommit only (on the wire after `mac`): the 8-byte
  // commit word's address and remote key, for ATOMIC WRITE and FLUSH.
  uint64_t commit_address = 0;
  uint32_t commit_rkey = 0;
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

// The target's copy is to hold data generation `generation` (0: the
// primary's copy has no generation yet, it never started one). Sent
// with flags 0 before a resync into the copy starts (the copy becomes
// inconsistent: a mix of generations) and with kGenerationConsistent when it
// holds that generation completely (resync done, or already in sync).
struct SetGeneration {
  uint64_t generation = 0;
  uint32_t flags = 0;  // GenerationFlag bits
  bool operator==(const SetGeneration&) const = default;
};

// The copy's metadata records `generation` (echoes SetGeneration).
struct GenerationAck {
  uint64_t generation = 0;
  bool operator==(const GenerationAck&) const = default;
};

// Hash the chunks of [offset, offset + length) of your copy: chunk i is
// [offset + i * chunk_size, +chunk_size), the last one cut at offset+length.
// offset is a multiple of chunk_size, length > 0, at most kMaxVerifyChunks
// chunks. Whether the range lies in the region is the target's check.
struct VerifyRequest {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t chunk_size = 0;  // a power of two, kMinVerifyChunkSize..kMaxVerifyChunkSize
  bool operator==(const VerifyRequest&) const = default;
};

// XXH3-64 (seed 0) of each chunk of a VerifyRequest, in order.
struct VerifyReply {
  uint64_t offset = 0;           // echoes the request
  uint64_t chunk_size = 0;       // echoes the request
  std::vector<uint64_t> hashes;  // 1..kMaxVerifyChunks
  bool operator==(const VerifyReply&) const = default;
};

// The answer to a fence's AuthResponse: the copy is fenced durably (its
// metadata records the generation; from now on it takes writes only from a
// primary whose Hello.lineage knows it) and the old primary's session has
// ended.
struct FenceAck {
  uint64_t generation = 0;        // echoes Hello.lineage.current
  uint32_t sessions_ended = 0;    // writer sessions the fence ended
  std::array<uint8_t, kMacSize> mac{};  // auth::target_proof(...), as in VolumeDescriptor
  bool operator==(const FenceAck&) const = default;
};

using Message = std::variant<Hello, Challenge, AuthResponse, VolumeDescriptor, Commit, CommitAck,
                             PersistRequest, PersistAck, ErrorReply, Goodbye, Ping, Pong,
                             SetGeneration, GenerationAck, VerifyRequest, VerifyReply, FenceAck>;

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

// How many chunks of chunk_size cover length bytes (the last may be
// short). chunk_size must be nonzero.
uint64_t chunk_count(uint64_t length, uint64_t chunk_size);
// The target's check of a decoded VerifyRequest against its region:
// offset + length must not pass region_size (kInvalidArgument naming both).
Status check_verify_request(const VerifyRequest& request, uint64_t region_size);
// What a target hashes and an initiator compares: XXH3-64 (seed 0) of each
// chunk_size piece of `data`, the last one possibly shorter. Both sides use
// this one function so the hashes cannot disagree by construction.
std::vector<uint64_t> hash_chunks(std::span<const std::byte> data, uint64_t chunk_size);
// The VerifyRequests (each at most kMaxVerifyChunks chunks) that cover
// [offset, offset + length); offset must be a multiple of chunk_size.
std::vector<VerifyRequest> split_verify(uint64_t offset, uint64_t length, uint64_t chunk_size);

// A volume name: 1..kMaxNameLength bytes of [A-Za-z0-9._-]. kInvalidArgument
// otherwise (decode() reports the same rule as kProtocolError).
Status check_name(std::string_view name);

// An ErrorReply carrying status (which must not be ok): the code as is, the
// message cut to kMaxErrorText bytes (on a UTF-8 boundary) with NULs
// replaced, so encode() always accepts it.
ErrorReply make_error_reply(const Status& status);
// The Status a received ErrorReply stands for ("<text>" with its code).
Status to_status(const ErrorReply& reply);

// Text a peer chose (an identity, an ErrorReply's text), made safe to show
// in logs, status and events: printable ASCII is kept, a backslash becomes
// "\\", every other byte "\xNN" (so the result is ASCII, hence valid
// UTF-8); longer than max_bytes, it is cut and ends in "...".
std::string printable(std::string_view text, size_t max_bytes = 256);

}  // namespace pmirror::protocol

#include "protocol/protocol.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <type_traits>

namespace pmirror::protocol {

namespace {

// ---------------------------------------------------------------------------
// Byte-wise little-endian encoding. Structs are never memcpy'd: the wire
// layout must not depend on the compiler's padding or the host's byte order.

class Writer {
 public:
  explicit Writer(std::vector<std::byte>& out) : out_(out) {}

  void u16(uint16_t v) { put_le(v, 2); }
  void u32(uint32_t v) { put_le(v, 4); }
  void u64(uint64_t v) { put_le(v, 8); }
  void bytes(std::span<const uint8_t> data) {
    for (uint8_t b : data) out_.push_back(static_cast<std::byte>(b));
  }
  // Callers validated the length (<= kMaxErrorText < 65536) beforehand.
  void str(std::string_view s) {
    u16(static_cast<uint16_t>(s.size()));
    for (char c : s) out_.push_back(static_cast<std::byte>(c));
  }
  void u64_list(const std::vector<uint64_t>& values) {
    u32(static_cast<uint32_t>(values.size()));
    for (uint64_t v : values) u64(v);
  }
  void ranges(const std::vector<Range>& ranges) {
    u32(static_cast<uint32_t>(ranges.size()));
    for (const Range& r : ranges) {
      u64(r.offset);
      u64(r.length);
    }
  }

 private:
  void put_le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xff));
  }

  std::vector<std::byte>& out_;
};

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

Status protocol_error(std::string message) {
  return Status(Errc::kProtocolError, std::move(message));
}

// Reads fixed-width fields from a span; every read is bounds-checked, and a
// short read names the field so a truncated message is easy to diagnose.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> data) : data_(data) {}

  size_t remaining() const { return data_.size() - pos_; }

  Status u16(uint16_t& out, std::string_view field) { return get_le(out, field); }
  Status u32(uint32_t& out, std::string_view field) { return get_le(out, field); }
  Status u64(uint64_t& out, std::string_view field) { return get_le(out, field); }

  Status bytes(std::span<uint8_t> out, std::string_view field) {
    PMIRROR_RETURN_IF_ERROR(need(out.size(), field));
    for (uint8_t& b : out) b = static_cast<uint8_t>(data_[pos_++]);
    return Status::Ok();
  }

  // u16 length + bytes. Content rules are checked by validate().
  Status str(std::string& out, std::string_view field) {
    uint16_t len = 0;
    PMIRROR_RETURN_IF_ERROR(u16(len, std::string(field) + " length"));
    PMIRROR_RETURN_IF_ERROR(need(len, field));
    out.assign(reinterpret_cast<const char*>(data_.data() + pos_), len);
    pos_ += len;
    return Status::Ok();
  }

  // u32 count + count * u64, count in [min, max] (checked before anything
  // is allocated for it).
  Status u64_list(std::vector<uint64_t>& out, size_t min, size_t max, std::string_view field) {
    uint32_t count = 0;
    PMIRROR_RETURN_IF_ERROR(u32(count, std::string(field) + " count"));
    if (count < min || count > max) {
      return protocol_error(std::string(field) + ": count is " + std::to_string(count) +
                            ", must be " + std::to_string(min) + ".." + std::to_string(max));
    }
    PMIRROR_RETURN_IF_ERROR(need(size_t{count} * 8, field));
    out.resize(count);
    for (uint64_t& v : out) PMIRROR_RETURN_IF_ERROR(u64(v, field));
    return Status::Ok();
  }

  // u32 count + count * (u64 offset, u64 length). The count is checked here,
  // before anything is allocated for it.
  Status ranges(std::vector<Range>& out, std::string_view field) {
    uint32_t count = 0;
    PMIRROR_RETURN_IF_ERROR(u32(count, std::string(field) + " count"));
    if (count == 0 || count > kMaxRangesPerMessage) {
      return protocol_error(std::string(field) + ": count is " + std::to_string(count) +
                            ", must be 1.." + std::to_string(kMaxRangesPerMessage));
    }
    PMIRROR_RETURN_IF_ERROR(need(size_t{count} * 16, field));
    out.resize(count);
    for (Range& r : out) {
      PMIRROR_RETURN_IF_ERROR(u64(r.offset, field));
      PMIRROR_RETURN_IF_ERROR(u64(r.length, field));
    }
    return Status::Ok();
  }

 private:
  Status need(size_t n, std::string_view field) const {
    if (remaining() < n) {
      return protocol_error("truncated message: " + std::string(field) + " needs " +
                            std::to_string(n) + " bytes, " + std::to_string(remaining()) + " left");
    }
    return Status::Ok();
  }

  template <typename T>
  Status get_le(T& out, std::string_view field) {
    PMIRROR_RETURN_IF_ERROR(need(sizeof(T), field));
    std::make_unsigned_t<T> v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      v |= static_cast<std::make_unsigned_t<T>>(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
    }
    pos_ += sizeof(T);
    out = v;
    return Status::Ok();
  }

  std::span<const std::byte> data_;
  size_t pos_ = 0;
};

// ---------------------------------------------------------------------------
// Field rules, shared by encode (a violation is the caller's bug:
// kInvalidArgument) and decode (the peer's: kProtocolError).

// A switch without default: adding an Errc without listing it here fails
// the build (-Wswitch), so the wire check cannot go stale.
bool is_known_error_code(uint16_t raw) {
  switch (static_cast<Errc>(raw)) {
    case Errc::kOk:
      return false;  // an ErrorReply always reports a failure
    case Errc::kInvalidArgument:
    case Errc::kNotFound:
    case Errc::kPermissionDenied:
    case Errc::kAlreadyExists:
    case Errc::kIoError:
    case Errc::kProtocolError:
    case Errc::kConnectionError:
    case Errc::kTimeout:
    case Errc::kUnsupported:
    case Errc::kBusy:
    case Errc::kConfigError:
    case Errc::kInternal:
    case Errc::kClosed:
    case Errc::kResourceExhausted:
    case Errc::kSplitBrain:
    case Errc::kFailedPrecondition:
    case Errc::kFenced:
      return true;
    case Errc::kLeaseLost:  // the primary's own verdict on its lease: never a target's
      return false;
  }
  return false;
}

Status check_identity(std::string_view id) {
  if (id.empty()) return Status(Errc::kInvalidArgument, "identity is empty");
  if (id.size() > kMaxNameLength) {
    return Status(Errc::kInvalidArgument, "identity is " + std::to_string(id.size()) +
                                              " bytes, the limit is " +
                                              std::to_string(kMaxNameLength));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    auto c = static_cast<unsigned char>(id[i]);
    // Identities end up in logs; control characters (NUL, newline) could
    // forge or truncate log lines.
    if (c < 0x20 || c == 0x7f) {
      return Status(Errc::kInvalidArgument, "identity contains control character " + hex(c) +
                                                " at byte " + std::to_string(i));
    }
  }
  return Status::Ok();
}

Status check_error_text(std::string_view text) {
  if (text.size() > kMaxErrorText) {
    return Status(Errc::kInvalidArgument, "error text is " + std::to_string(text.size()) +
                                              " bytes, the limit is " +
                                              std::to_string(kMaxErrorText));
  }
  if (text.find('\0') != std::string_view::npos) {
    return Status(Errc::kInvalidArgument, "error text contains a NUL byte");
  }
  return Status::Ok();
}

Status check_range_list(const std::vector<Range>& ranges) {
  if (ranges.empty() || ranges.size() > kMaxRangesPerMessage) {
    return Status(Errc::kInvalidArgument, "range count is " + std::to_string(ranges.size()) +
                                              ", must be 1.." +
                                              std::to_string(kMaxRangesPerMessage));
  }
  // A Commit holds up to kMaxRangesPerMessage ranges: the text of a
  // failure is made only when one fails.
  auto where = [](size_t i) { return "ranges[" + std::to_string(i) + "]"; };
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    if (r.length == 0) return Status(Errc::kInvalidArgument, where(i) + ": length is 0");
    if (r.offset > std::numeric_limits<uint64_t>::max() - r.length) {
      return Status(Errc::kInvalidArgument, where(i) + ": offset " + hex(r.offset) +
                                                " + length " + hex(r.length) +
                                                " overflows 64 bits");
    }
  }
  return Status::Ok();
}

// Re-labels a rule violation with the message/field it is about and the
// error class of whoever is to blame.
Status blame(const Status& s, Errc code, std::string_view where) {
  if (s.ok()) return s;
  return Status(code, std::string(where) + ": " + s.message());
}

Status validate(const Hello& m, Errc code) {
  PMIRROR_RETURN_IF_ERROR(blame(check_name(m.volume), code, "Hello.volume"));
  PMIRROR_RETURN_IF_ERROR(blame(check_identity(m.identity), code, "Hello.identity"));
  if ((m.flags & ~kHelloFlagsKnown) != 0) {
    return Status(
        code, "Hello.flags has undefined bits " + hex(m.flags & ~kHelloFlagsKnown) +
                  " (defined: cumulative acks 0x1, fence 0x2, lineage 0x4, placement order 0x8, "
                  "native flush 0x10, one-sided commit 0x20, promoted 0x40)");
  }
  if ((m.flags & kHelloLineage) == 0 && m.lineage != Lineage{}) {
    return Status(code, "Hello.lineage is set without the lineage flag");
  }
  if ((m.flags & kHelloFence) != 0 && ((m.flags & kHelloLineage) == 0 || m.lineage.current == 0)) {
    return Status(code, "Hello: a fence must carry the promoted generation (lineage.current)");
  }
  if ((m.flags & kHelloPromoted) != 0 &&
      ((m.flags & kHelloLineage) == 0 || (m.flags & kHelloFence) != 0)) {
    return Status(code, "Hello: the promoted flag (0x40) needs the lineage flag and no fence flag");
  }
  if ((m.flags & kHelloLineage) != 0) {
    for (size_t i = 1; i < m.lineage.history.size(); ++i) {
      if (m.lineage.history[i - 1] == 0 && m.lineage.history[i] != 0) {
        return Status(code, "Hello.lineage.history has a generation after an unused entry");
      }
    }
  }
  return Status::Ok();
}

Status validate(const VolumeDescriptor& m, Errc code) {
  if ((m.methods & ~kMethodsKnown) != 0) {
    return Status(code, "VolumeDescriptor.methods has undefined bits " +
                            hex(m.methods & ~kMethodsKnown) +
                            " (defined: APM 0x1, GPSPM 0x2, placement order 0x4, native flush "
                            "0x8, one-sided commit 0x10)");
  }
  if ((m.methods & kMethodPlacementOrder) != 0 && (m.methods & kMethodApm) == 0) {
    return Status(code, "VolumeDescriptor.methods has placement order (0x4) without APM (0x1)");
  }
  if ((m.methods & kMethodNativeFlush) != 0 && (m.methods & kMethodApm) == 0) {
    return Status(code, "VolumeDescriptor.methods has native flush (0x8) without APM (0x1)");
  }
  if ((m.methods & kMethodOneSidedCommit) != 0 && (m.methods & kMethodNativeFlush) == 0) {
    return Status(
        code, "VolumeDescriptor.methods has one-sided commit (0x10) without native flush (0x8)");
  }
  if ((m.methods & kMethodOneSidedCommit) == 0 && (m.commit_address != 0 || m.commit_rkey != 0)) {
    return Status(code, "VolumeDescriptor has a commit word without one-sided commit (0x10)");
  }
  if ((m.methods & kMethodOneSidedCommit) != 0 && m.commit_address % 8 != 0) {
    return Status(code, "VolumeDescriptor.commit_address " + hex(m.commit_address) +
                            " is not 8-byte aligned (ATOMIC WRITE needs it)");
  }
  for (size_t i = 1; i < m.generation_history.size(); ++i) {
    if (m.generation_history[i] != 0 && m.generation_history[i - 1] == 0) {
      return Status(code, "VolumeDescriptor.generation_history[" + std::to_string(i) +
                              "] is set after an unused (0) entry; used entries come first");
    }
  }
  if ((m.copy_flags & ~kCopyFlagsKnown) != 0) {
    return Status(code, "VolumeDescriptor.copy_flags has undefined bits " +
                            hex(m.copy_flags & ~kCopyFlagsKnown) +
                            " (defined: consistent 0x1, promoted 0x2, unclean 0x4)");
  }
  if (m.activity_extents.size() > kMaxActivityExtents) {
    return Status(code, "VolumeDescriptor.activity_extents: count is " +
                            std::to_string(m.activity_extents.size()) + ", must be 0.." +
                            std::to_string(kMaxActivityExtents));
  }
  if (!m.activity_extents.empty() && m.activity_extent_size == 0) {
    return Status(code, "VolumeDescriptor.activity_extent_size is 0 but " +
                            std::to_string(m.activity_extents.size()) + " extents are listed");
  }
  for (size_t i = 1; i < m.activity_extents.size(); ++i) {
    if (m.activity_extents[i] <= m.activity_extents[i - 1]) {
      return Status(code, "VolumeDescriptor.activity_extents[" + std::to_string(i) + "] (" +
                              std::to_string(m.activity_extents[i]) +
                              ") is not above the one before it; extents are strictly ascending");
    }
  }
  return Status::Ok();
}
Status validate(const SetGeneration& m, Errc code) {
  if ((m.flags & ~kGenerationFlagsKnown) != 0) {
    return Status(code, "SetGeneration.flags has undefined bits " +
                            hex(m.flags & ~kGenerationFlagsKnown) + " (defined: consistent 0x1)");
  }
  return Status::Ok();
}
// chunk_size a power of two in range, offset a multiple of it.
Status check_chunking(uint64_t offset, uint64_t chunk_size, Errc code, std::string_view where) {
  if (chunk_size < kMinVerifyChunkSize || chunk_size > kMaxVerifyChunkSize ||
      (chunk_size & (chunk_size - 1)) != 0) {
    return Status(code, std::string(where) + ".chunk_size is " + std::to_string(chunk_size) +
                            ", must be a power of two from " + std::to_string(kMinVerifyChunkSize) +
                            " to " + std::to_string(kMaxVerifyChunkSize));
  }
  if (offset % chunk_size != 0) {
    return Status(code, std::string(where) + ".offset " + std::to_string(offset) +
                            " is not a multiple of the chunk size " + std::to_string(chunk_size));
  }
  return Status::Ok();
}
Status validate(const VerifyRequest& m, Errc code) {
  PMIRROR_RETURN_IF_ERROR(check_chunking(m.offset, m.chunk_size, code, "VerifyRequest"));
  if (m.length == 0) return Status(code, "VerifyRequest.length is 0");
  if (m.offset > std::numeric_limits<uint64_t>::max() - m.length) {
    return Status(code, "VerifyRequest: offset " + hex(m.offset) + " + length " + hex(m.length) +
                            " overflows 64 bits");
  }
  if (chunk_count(m.length, m.chunk_size) > kMaxVerifyChunks) {
    return Status(code,
                  "VerifyRequest covers " + std::to_string(chunk_count(m.length, m.chunk_size)) +
                      " chunks, the limit is " + std::to_string(kMaxVerifyChunks) + " per request");
  }
  return Status::Ok();
}
Status validate(const VerifyReply& m, Errc code) {
  PMIRROR_RETURN_IF_ERROR(check_chunking(m.offset, m.chunk_size, code, "VerifyReply"));
  if (m.hashes.empty() || m.hashes.size() > kMaxVerifyChunks) {
    return Status(code, "VerifyReply.hashes: count is " + std::to_string(m.hashes.size()) +
                            ", must be 1.." + std::to_string(kMaxVerifyChunks));
  }
  return Status::Ok();
}
Status validate(const Commit& m, Errc code) {
  return blame(check_range_list(m.ranges), code, "Commit");
}
Status validate(const PersistRequest& m, Errc code) {
  return blame(check_range_list(m.ranges), code, "PersistRequest");
}
Status validate(const ErrorReply& m, Errc code) {
  if (!is_known_error_code(static_cast<uint16_t>(m.code))) {
    return Status(code, "ErrorReply.code " + std::to_string(static_cast<uint16_t>(m.code)) +
                            " is not a known error code");
  }
  return blame(check_error_text(m.text), code, "ErrorReply.text");
}
template <typename T>
Status validate(const T&, Errc) {
  return Status::Ok();  // fixed-width fields only: any value is valid
}

// ---------------------------------------------------------------------------
// Payloads, in the order docs/protocol.md lists the fields.

void put(Writer& w, const Hello& m) {
  w.str(m.volume);
  w.str(m.identity);
  w.bytes(m.client_nonce);
  w.u32(m.flags);
  if ((m.flags & kHelloLineage) == 0) return;
  w.u64(m.lineage.current);
  for (uint64_t g : m.lineage.history) w.u64(g);
  w.u64(m.lineage.left_behind_at);
}
void put(Writer& w, const Challenge& m) { w.bytes(m.server_nonce); }
void put(Writer& w, const AuthResponse& m) { w.bytes(m.mac); }
void put(Writer& w, const VolumeDescriptor& m) {
  w.u64(m.region_size);
  w.u64(m.remote_address);
  w.u32(m.rkey);
  w.u32(m.methods);
  w.u64(m.generation);
  w.u64(m.last_sequence);
  w.u32(m.recv_slots);
  w.bytes(m.copy_uuid);
  w.u64(m.data_generation);
  for (uint64_t g : m.generation_history) w.u64(g);
  w.u32(m.copy_flags);
  w.u64(m.activity_extent_size);
  w.u64_list(m.activity_extents);
  w.bytes(m.mac);
  if ((m.methods & kMethodOneSidedCommit) != 0) {
    w.u64(m.commit_address);
    w.u32(m.commit_rkey);
  }
}
void put(Writer& w, const Commit& m) {
  w.u64(m.sequence);
  w.u64(m.generation);
  w.ranges(m.ranges);
}
void put(Writer& w, const CommitAck& m) { w.u64(m.sequence); }
void put(Writer& w, const PersistRequest& m) {
  w.u64(m.sequence);
  w.u64(m.generation);
  w.ranges(m.ranges);
}
void put(Writer& w, const PersistAck& m) { w.u64(m.sequence); }
void put(Writer& w, const ErrorReply& m) {
  w.u16(static_cast<uint16_t>(m.code));
  w.str(m.text);
}
void put(Writer&, const Goodbye&) {}
void put(Writer& w, const Ping& m) { w.u64(m.token); }
void put(Writer& w, const Pong& m) { w.u64(m.token); }
void put(Writer& w, const SetGeneration& m) {
  w.u64(m.generation);
  w.u32(m.flags);
}
void put(Writer& w, const GenerationAck& m) { w.u64(m.generation); }
void put(Writer& w, const FenceAck& m) {
  w.u64(m.generation);
  w.u32(m.sessions_ended);
  w.bytes(m.mac);
}
void put(Writer& w, const VerifyRequest& m) {
  w.u64(m.offset);
  w.u64(m.length);
  w.u64(m.chunk_size);
}
void put(Writer& w, const VerifyReply& m) {
  w.u64(m.offset);
  w.u64(m.chunk_size);
  w.u64_list(m.hashes);
}

Status get(Reader& r, Hello& m) {
  PMIRROR_RETURN_IF_ERROR(r.str(m.volume, "Hello.volume"));
  PMIRROR_RETURN_IF_ERROR(r.str(m.identity, "Hello.identity"));
  PMIRROR_RETURN_IF_ERROR(r.bytes(m.client_nonce, "Hello.client_nonce"));
  PMIRROR_RETURN_IF_ERROR(r.u32(m.flags, "Hello.flags"));
  if ((m.flags & kHelloLineage) == 0) return Status::Ok();
  PMIRROR_RETURN_IF_ERROR(r.u64(m.lineage.current, "Hello.lineage.current"));
  for (uint64_t& g : m.lineage.history) {
    PMIRROR_RETURN_IF_ERROR(r.u64(g, "Hello.lineage.history"));
  }
  return r.u64(m.lineage.left_behind_at, "Hello.lineage.left_behind_at");
}
Status get(Reader& r, FenceAck& m) {
  PMIRROR_RETURN_IF_ERROR(r.u64(m.generation, "FenceAck.generation"));
  PMIRROR_RETURN_IF_ERROR(r.u32(m.sessions_ended, "FenceAck.sessions_ended"));
  return r.bytes(m.mac, "FenceAck.mac");
}
Status get(Reader& r, Challenge& m) { return r.bytes(m.server_nonce, "Challenge.server_nonce"); }
Status get(Reader& r, AuthResponse& m) { return r.bytes(m.mac, "AuthResponse.mac"); }
Status get(Reader& r, VolumeDescriptor& m) {
  PMIRROR_RETURN_IF_ERROR(r.u64(m.region_size, "VolumeDescriptor.region_size"));
  PMIRROR_RETURN_IF_ERROR(r.u64(m.remote_address, "VolumeDescriptor.remote_address"));
  PMIRROR_RETURN_IF_ERROR(r.u32(m.rkey, "VolumeDescriptor.rkey"));
  PMIRROR_RETURN_IF_ERROR(r.u32(m.methods, "VolumeDescriptor.methods"));
  PMIRROR_RETURN_IF_ERROR(r.u64(m.generation, "VolumeDescriptor.generation"));
  PMIRROR_RETURN_IF_ERROR(r.u64(m.last_sequence, "VolumeDescriptor.last_sequence"));
  PMIRROR_RETURN_IF_ERROR(r.u32(m.recv_slots, "VolumeDescriptor.recv_slots"));
  PMIRROR_RETURN_IF_ERROR(r.bytes(m.copy_uuid, "VolumeDescriptor.copy_uuid"));
  PMIRROR_RETURN_IF_ERROR(r.u64(m.data_generation, "VolumeDescriptor.data_generation"));
  for (uint64_t& g : m.generation_history) {
    PMIRROR_RETURN_IF_ERROR(r.u64(g, "VolumeDescriptor.generation_history"));
  }
  PMIRROR_RETURN_IF_ERROR(r.u32(m.copy_flags, "VolumeDescriptor.copy_flags"));
  PMIRROR_RETURN_IF_ERROR(r.u64(m.activity_extent_size, "VolumeDescriptor.activity_extent_size"));
  PMIRROR_RETURN_IF_ERROR(
      r.u64_list(m.activity_extents, 0, kMaxActivityExtents, "VolumeDescriptor.activity_extents"));
  PMIRROR_RETURN_IF_ERROR(r.bytes(m.mac, "VolumeDescriptor.mac"));
  if ((m.methods & kMethodOneSidedCommit) == 0) return Status::Ok();
  PMIRROR_RETURN_IF_ERROR(r.u64(m.commit_address, "VolumeDescriptor.commit_address"));
  return r.u32(m.commit_rkey, "VolumeDescriptor.commit_rkey");
}
Status get(Reader& r, Commit& m) {
  PMIRROR_RETURN_IF_ERROR(r.u64(m.sequence, "Commit.sequence"));
  PMIRROR_RETURN_IF_ERROR(r.u64(m.generation, "Commit.generation"));
  return r.ranges(m.ranges, "Commit.ranges");
}
Status get(Reader& r, CommitAck& m) { return r.u64(m.sequence, "CommitAck.sequence"); }
Status get(Reader& r, PersistRequest& m) {
  PMIRROR_RETURN_IF_ERROR(r.u64(m.sequence, "PersistRequest.sequence"));
  PMIRROR_RETURN_IF_ERROR(r.u64(m.generation, "PersistRequest.generation"));
  return r.ranges(m.ranges, "PersistRequest.ranges");
}
Status get(Reader& r, PersistAck& m) { return r.u64(m.sequence, "PersistAck.sequence"); }
Status get(Reader& r, ErrorReply& m) {
  uint16_t code = 0;
  PMIRROR_RETURN_IF_ERROR(r.u16(code, "ErrorReply.code"));
  m.code = static_cast<Errc>(code);  // checked by validate()
  return r.str(m.text, "ErrorReply.text");
}
Status get(Reader&, Goodbye&) { return Status::Ok(); }
Status get(Reader& r, Ping& m) { return r.u64(m.token, "Ping.token"); }
Status get(Reader& r, Pong& m) { return r.u64(m.token, "Pong.token"); }
Status get(Reader& r, SetGeneration& m) {
  PMIRROR_RETURN_IF_ERROR(r.u64(m.generation, "SetGeneration.generation"));
  return r.u32(m.flags, "SetGeneration.flags");
}
Status get(Reader& r, GenerationAck& m) { return r.u64(m.generation, "GenerationAck.generation"); }
Status get(Reader& r, VerifyRequest& m) {
  PMIRROR_RETURN_IF_ERROR(r.u64(m.offset, "VerifyRequest.offset"));
  PMIRROR_RETURN_IF_ERROR(r.u64(m.length, "VerifyRequest.length"));
  return r.u64(m.chunk_size, "VerifyRequest.chunk_size");
}
Status get(Reader& r, VerifyReply& m) {
  PMIRROR_RETURN_IF_ERROR(r.u64(m.offset, "VerifyReply.offset"));
  PMIRROR_RETURN_IF_ERROR(r.u64(m.chunk_size, "VerifyReply.chunk_size"));
  return r.u64_list(m.hashes, 1, kMaxVerifyChunks, "VerifyReply.hashes");
}

// Message alternative whose index is `type - 1` (the enum values are 1..16
// in variant order; the static_asserts keep the two in step).
template <size_t I = 0>
Result<Message> decode_payload(MessageType type, Reader& r) {
  if constexpr (I < std::variant_size_v<Message>) {
    if (static_cast<size_t>(type) == I + 1) {
      std::variant_alternative_t<I, Message> m;
      PMIRROR_RETURN_IF_ERROR(get(r, m));
      if (r.remaining() != 0) {
        return protocol_error(std::to_string(r.remaining()) + " trailing bytes after the " +
                              std::string(type_name(type)) + " fields");
      }
      PMIRROR_RETURN_IF_ERROR(validate(m, Errc::kProtocolError));
      return Message(std::move(m));
    }
    return decode_payload<I + 1>(type, r);
  } else {
    return protocol_error("unknown message type " + std::to_string(static_cast<uint16_t>(type)));
  }
}

static_assert(std::variant_size_v<Message> == 17);
static_assert(std::is_same_v<std::variant_alternative_t<0, Message>, Hello> &&
              static_cast<int>(MessageType::kHello) == 1);
static_assert(std::is_same_v<std::variant_alternative_t<8, Message>, ErrorReply> &&
              static_cast<int>(MessageType::kError) == 9);
static_assert(std::is_same_v<std::variant_alternative_t<11, Message>, Pong> &&
              static_cast<int>(MessageType::kPong) == 12);
static_assert(std::is_same_v<std::variant_alternative_t<12, Message>, SetGeneration> &&
              static_cast<int>(MessageType::kSetGeneration) == 13);
static_assert(std::is_same_v<std::variant_alternative_t<13, Message>, GenerationAck> &&
              static_cast<int>(MessageType::kGenerationAck) == 14);
static_assert(std::is_same_v<std::variant_alternative_t<14, Message>, VerifyRequest> &&
              static_cast<int>(MessageType::kVerifyRequest) == 15);
static_assert(std::is_same_v<std::variant_alternative_t<15, Message>, VerifyReply> &&
              static_cast<int>(MessageType::kVerifyReply) == 16);
static_assert(std::is_same_v<std::variant_alternative_t<16, Message>, FenceAck> &&
              static_cast<int>(MessageType::kFenceAck) == 17);

bool is_known_type(uint16_t raw) { return raw >= 1 && raw <= std::variant_size_v<Message>; }

// The peer's own explanation in an ErrorReply of another version, if the
// bytes happen to carry one. The header and the ErrorReply payload are
// frozen across versions for exactly this purpose; trailing fields a later
// version might append are ignored.
std::string foreign_error_text(uint16_t type, std::span<const std::byte> payload) {
  if (type != static_cast<uint16_t>(MessageType::kError)) return {};
  Reader r(payload);
  ErrorReply reply;
  if (!get(r, reply).ok() || !validate(reply, Errc::kProtocolError).ok()) return {};
  return "; the peer says: " + std::string(errc_name(reply.code)) + ": " + reply.text;
}

}  // namespace

bool Lineage::knows(uint64_t g) const {
  if (g == 0) return false;
  if (g == current || g == left_behind_at) return true;
  return std::find(history.begin(), history.end(), g) != history.end();
}

MessageType type_of(const Message& message) {
  return static_cast<MessageType>(message.index() + 1);
}

std::string_view type_name(MessageType type) {
  switch (type) {
    case MessageType::kHello:
      return "Hello";
    case MessageType::kChallenge:
      return "Challenge";
    case MessageType::kAuthResponse:
      return "AuthResponse";
    case MessageType::kVolumeDescriptor:
      return "VolumeDescriptor";
    case MessageType::kCommit:
      return "Commit";
    case MessageType::kCommitAck:
      return "CommitAck";
    case MessageType::kPersistRequest:
      return "PersistRequest";
    case MessageType::kPersistAck:
      return "PersistAck";
    case MessageType::kError:
      return "Error";
    case MessageType::kGoodbye:
      return "Goodbye";
    case MessageType::kPing:
      return "Ping";
    case MessageType::kPong:
      return "Pong";
    case MessageType::kSetGeneration:
      return "SetGeneration";
    case MessageType::kGenerationAck:
      return "GenerationAck";
    case MessageType::kVerifyRequest:
      return "VerifyRequest";
    case MessageType::kVerifyReply:
      return "VerifyReply";
    case MessageType::kFenceAck:
      return "FenceAck";
  }
  return "unknown";
}

Status encode(const Message& message, std::vector<std::byte>& out) {
  out.clear();
  // The context is built only for an error: encoding is on the persist path.
  if (Status valid =
          std::visit([](const auto& m) { return validate(m, Errc::kInvalidArgument); }, message);
      !valid.ok()) {
    return valid.with_context("cannot encode " + std::string(type_name(type_of(message))));
  }
  Writer w(out);
  w.u32(kMagic);
  w.u16(kVersion);
  w.u16(static_cast<uint16_t>(type_of(message)));
  w.u32(0);  // payload_length, patched below
  w.u32(0);  // reserved
  std::visit([&w](const auto& m) { put(w, m); }, message);
  if (out.size() > kMaxMessageSize) {
    // Unreachable with the limits above (the largest message is a Commit of
    // kMaxRangesPerMessage ranges); kept so a change of limits cannot
    // produce messages the peer's receive slot cannot hold.
    size_t size = out.size();
    out.clear();
    return Status(Errc::kInternal, "encoded message is " + std::to_string(size) +
                                       " bytes, over the " + std::to_string(kMaxMessageSize) +
                                       "-byte limit");
  }
  auto payload = static_cast<uint32_t>(out.size() - kHeaderSize);
  for (int i = 0; i < 4; ++i) out[8 + i] = static_cast<std::byte>((payload >> (8 * i)) & 0xff);
  return Status::Ok();
}

Result<Message> decode(std::span<const std::byte> bytes) {
  if (bytes.size() < kHeaderSize) {
    return protocol_error("message too short: " + std::to_string(bytes.size()) +
                          " bytes, the header alone is " + std::to_string(kHeaderSize));
  }
  Reader header(bytes.first(kHeaderSize));
  uint32_t magic = 0, payload_length = 0, reserved = 0;
  uint16_t version = 0, type = 0;
  // Cannot fail: the header span holds exactly these 16 bytes.
  PMIRROR_RETURN_IF_ERROR(header.u32(magic, "header.magic"));
  PMIRROR_RETURN_IF_ERROR(header.u16(version, "header.version"));
  PMIRROR_RETURN_IF_ERROR(header.u16(type, "header.type"));
  PMIRROR_RETURN_IF_ERROR(header.u32(payload_length, "header.payload_length"));
  PMIRROR_RETURN_IF_ERROR(header.u32(reserved, "header.reserved"));
  auto payload = bytes.subspan(kHeaderSize);

  if (magic != kMagic) {
    return protocol_error("bad magic " + hex(magic) + ": not a pmirror message (expected " +
                          hex(kMagic) + ", \"PMIR\")");
  }
  // Before any other check: a peer of another version may lay out the rest
  // differently, and the useful answer is which versions disagree.
  if (version != kVersion) {
    return Status(Errc::kUnsupported, "peer speaks pmirror protocol version " +
                                          std::to_string(version) + ", this side speaks version " +
                                          std::to_string(kVersion) +
                                          foreign_error_text(type, payload));
  }
  if (bytes.size() > kMaxMessageSize) {
    return protocol_error("message is " + std::to_string(bytes.size()) + " bytes, over the " +
                          std::to_string(kMaxMessageSize) + "-byte limit");
  }
  if (!is_known_type(type)) return protocol_error("unknown message type " + std::to_string(type));
  if (payload_length != payload.size()) {
    return protocol_error("header.payload_length is " + std::to_string(payload_length) + " but " +
                          std::to_string(payload.size()) + " bytes follow the header");
  }
  if (reserved != 0) {
    return protocol_error("header.reserved is " + hex(reserved) + ", must be 0");
  }
  Reader r(payload);
  return decode_payload(static_cast<MessageType>(type), r);
}

Status check_ranges(std::span<const Range> ranges, uint64_t region_size) {
  if (ranges.empty()) return Status(Errc::kInvalidArgument, "no ranges given");
  // On every Commit's ranges: the text only for the one that fails.
  auto where = [&](size_t i) {
    return "range " + std::to_string(i) + " (offset " + std::to_string(ranges[i].offset) +
           ", length " + std::to_string(ranges[i].length) + ")";
  };
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    if (r.length == 0) return Status(Errc::kInvalidArgument, where(i) + ": length is 0");
    if (r.offset > std::numeric_limits<uint64_t>::max() - r.length) {
      return Status(Errc::kInvalidArgument, where(i) + ": offset + length overflows 64 bits");
    }
    if (r.offset + r.length > region_size) {
      return Status(Errc::kInvalidArgument, where(i) + ": ends beyond the volume's " +
                                                std::to_string(region_size) + " bytes");
    }
  }
  return Status::Ok();
}

uint64_t chunk_count(uint64_t length, uint64_t chunk_size) {
  return length / chunk_size + (length % chunk_size != 0 ? 1 : 0);
}

Status check_verify_request(const VerifyRequest& request, uint64_t region_size) {
  if (request.offset > region_size || request.length > region_size - request.offset) {
    return Status(Errc::kInvalidArgument, "verify range (offset " + std::to_string(request.offset) +
                                              ", length " + std::to_string(request.length) +
                                              ") ends beyond the volume's " +
                                              std::to_string(region_size) + " bytes");
  }
  return Status::Ok();
}

std::vector<VerifyRequest> split_verify(uint64_t offset, uint64_t length, uint64_t chunk_size) {
  std::vector<VerifyRequest> out;
  const uint64_t step = chunk_size * kMaxVerifyChunks;
  while (length > 0) {
    uint64_t n = std::min(length, step);
    out.push_back(VerifyRequest{offset, n, chunk_size});
    offset += n;
    length -= n;
  }
  return out;
}

Status check_name(std::string_view name) {
  if (name.empty()) return Status(Errc::kInvalidArgument, "volume name is empty");
  if (name.size() > kMaxNameLength) {
    return Status(Errc::kInvalidArgument, "volume name is " + std::to_string(name.size()) +
                                              " bytes, the limit is " +
                                              std::to_string(kMaxNameLength));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) {
      auto u = static_cast<unsigned char>(c);
      std::string shown = (u > 0x20 && u < 0x7f) ? "'" + std::string(1, c) + "'" : hex(u);
      // The name itself is not echoed: it may hold control characters.
      return Status(Errc::kInvalidArgument, "volume name has " + shown + " at byte " +
                                                std::to_string(i) +
                                                "; allowed are letters, digits, '.', '_' and '-'");
    }
  }
  return Status::Ok();
}

ErrorReply make_error_reply(const Status& status) {
  ErrorReply reply;
  bool known = is_known_error_code(static_cast<uint16_t>(status.code()));
  reply.code = known ? status.code() : Errc::kInternal;
  reply.text = status.ok() ? "make_error_reply called with an ok status" : status.message();
  if (reply.text.size() > kMaxErrorText) {
    size_t cut = kMaxErrorText;
    // Back off over UTF-8 continuation bytes (10xxxxxx) so no character is split.
    while (cut > 0 && (static_cast<unsigned char>(reply.text[cut]) & 0xc0) == 0x80) --cut;
    reply.text.resize(cut);
  }
  for (char& c : reply.text) {
    if (c == '\0') c = '?';
  }
  return reply;
}

Status to_status(const ErrorReply& reply) {
  if (reply.code == Errc::kOk) {
    return Status(Errc::kProtocolError, "peer sent an ErrorReply with code ok: " + reply.text);
  }
  return Status(reply.code, reply.text);
}

std::string printable(std::string_view text, size_t max_bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 8);
  for (size_t i = 0; i < text.size(); ++i) {
    if (out.size() >= max_bytes) {
      out += "...";
      break;
    }
    auto c = static_cast<unsigned char>(text[i]);
    if (c == '\\') {
      out += "\\\\";
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kDigits[c >> 4];
      out += kDigits[c & 0xf];
    }
  }
  return out;
}

}  // namespace pmirror::protocol

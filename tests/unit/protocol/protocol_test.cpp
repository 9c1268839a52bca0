#include "protocol/protocol.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace pmirror::protocol {
namespace {

using ::testing::HasSubstr;
using Bytes = std::vector<std::byte>;

constexpr uint64_t kMax64 = std::numeric_limits<uint64_t>::max();

Bytes encoded(const Message& m) {
  Bytes out;
  Status s = encode(m, out);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return out;
}

Bytes from_hex(std::string_view hex) {
  Bytes out;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    return c - 'a' + 10;
  };
  std::string digits;
  for (char c : hex) {
    if (c != ' ' && c != '\n') digits.push_back(c);
  }
  for (size_t i = 0; i + 1 < digits.size(); i += 2) {
    out.push_back(static_cast<std::byte>(nibble(digits[i]) * 16 + nibble(digits[i + 1])));
  }
  return out;
}

void put_le(Bytes& b, size_t at, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b[at + i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

// Makes the header's payload_length agree with the buffer again, so a test
// reaches the payload check it is aimed at.
void fix_length(Bytes& b) { put_le(b, 8, b.size() - kHeaderSize, 4); }

// Decodes, expecting failure with `code` and `fragment` in the message.
void expect_rejected(const Bytes& b, std::string_view fragment, Errc code = Errc::kProtocolError) {
  Result<Message> r = decode(b);
  ASSERT_FALSE(r.ok()) << "decoded a message that should be rejected";
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_THAT(r.status().message(), HasSubstr(std::string(fragment)));
}

Commit sample_commit() {
  Commit c;
  c.sequence = 7;
  c.generation = 3;
  c.ranges = {{0, 4096}, {8192, 64}};
  return c;
}

Hello sample_hello() {
  Hello h;
  h.volume = "db0";
  h.identity = "app1";
  for (size_t i = 0; i < kNonceSize; ++i) h.client_nonce[i] = static_cast<uint8_t>(i);
  return h;
}

// ---------------------------------------------------------------------------
// Random messages.

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}

  uint64_t u64() { return rng_(); }
  uint64_t below(uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_); }
  template <size_t N>
  std::array<uint8_t, N> bytes() {
    std::array<uint8_t, N> a{};
    for (auto& b : a) b = static_cast<uint8_t>(below(256));
    return a;
  }
  std::string name() {
    static constexpr std::string_view kChars =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-";
    std::string s(1 + below(kMaxNameLength), ' ');
    for (char& c : s) c = kChars[below(kChars.size())];
    return s;
  }
  std::string identity() {
    std::string s(1 + below(kMaxNameLength), ' ');
    for (char& c : s) {
      // Printable ASCII or any byte >= 0x80 (UTF-8 is allowed).
      uint64_t v = below(2) ? 0x20 + below(0x5f) : 0x80 + below(0x80);
      c = static_cast<char>(v);
    }
    return s;
  }
  std::string text() {
    std::string s(below(kMaxErrorText + 1), ' ');
    for (char& c : s) c = static_cast<char>(1 + below(255));
    return s;
  }
  std::vector<Range> ranges() {
    std::vector<Range> rs(1 + below(kMaxRangesPerMessage));
    for (Range& r : rs) {
      // Mix small and extreme values, never overflowing.
      r.length = below(4) == 0 ? kMax64 - below(16) : 1 + below(1u << 20);
      r.offset = below(kMax64 - r.length + 1);
    }
    return rs;
  }

  Message message(size_t type_index) {
    switch (type_index) {
      case 0: {
        Hello m;
        m.volume = name();
        m.identity = identity();
        m.client_nonce = bytes<kNonceSize>();
        m.flags = static_cast<uint32_t>(below(16));
        if ((m.flags & kHelloFence) != 0) m.flags |= kHelloLineage;
        if ((m.flags & kHelloLineage) != 0) {
          m.lineage.current = 1 + below(kMax64);
          size_t used = below(kGenerationHistory + 1);
          for (size_t i = 0; i < used; ++i) m.lineage.history[i] = 1 + below(kMax64);
          m.lineage.left_behind_at = below(2) ? 0 : u64();
        }
        return m;
      }
      case 1:
        return Challenge{bytes<kNonceSize>()};
      case 2:
        return AuthResponse{bytes<kMacSize>()};
      case 3: {
        VolumeDescriptor m;
        m.region_size = u64();
        m.remote_address = u64();
        m.rkey = static_cast<uint32_t>(u64());
        m.methods = static_cast<uint32_t>(below(4));
        if ((m.methods & kMethodApm) != 0 && below(2) == 1) m.methods |= kMethodPlacementOrder;
        if ((m.methods & kMethodApm) != 0 && below(2) == 1) m.methods |= kMethodNativeFlush;
        if ((m.methods & kMethodNativeFlush) != 0 && below(2) == 1) {
          m.methods |= kMethodOneSidedCommit;
          m.commit_address = u64() & ~uint64_t{7};
          m.commit_rkey = static_cast<uint32_t>(u64());
        }
        m.generation = u64();
        m.last_sequence = u64();
        m.recv_slots = static_cast<uint32_t>(u64());
        m.copy_uuid = bytes<16>();
        m.data_generation = u64();
        size_t used = below(kGenerationHistory + 1);  // used entries first, then zeros
        for (size_t i = 0; i < used; ++i) m.generation_history[i] = 1 + below(kMax64);
        m.copy_flags = static_cast<uint32_t>(below(8));
        m.activity_extent_size = below(4) == 0 ? 0 : 1 + below(kMax64);
        if (m.activity_extent_size != 0) {
          size_t n = below(kMaxActivityExtents + 1);
          uint64_t next = below(1000);
          for (size_t i = 0; i < n; ++i) {
            m.activity_extents.push_back(next);
            next += 1 + below(below(2) ? 4 : 1u << 30);
          }
        }
        m.mac = bytes<kMacSize>();
        return m;
      }
      case 4:
        return Commit{u64(), u64(), ranges()};
      case 5:
        return CommitAck{u64()};
      case 6:
        return PersistRequest{u64(), u64(), ranges()};
      case 7:
        return PersistAck{u64()};
      case 8:
        return ErrorReply{static_cast<Errc>(1 + below(17)), text()};
      case 9:
        return Goodbye{};
      case 10:
        return Ping{u64()};
      case 11:
        return Pong{u64()};
      case 12:
        return SetGeneration{u64(), static_cast<uint32_t>(below(2))};
      case 13:
        return GenerationAck{u64()};
      case 14: {
        VerifyRequest m;
        m.chunk_size = chunk_size();
        m.length = 1 + below(m.chunk_size * kMaxVerifyChunks);
        m.offset = m.chunk_size * below((kMax64 - m.length) / m.chunk_size + 1);
        return m;
      }
      case 16:
        return FenceAck{u64(), static_cast<uint32_t>(u64()), bytes<kMacSize>()};
      default: {
        VerifyReply m;
        m.chunk_size = chunk_size();
        m.offset = m.chunk_size * below(kMax64 / m.chunk_size + 1);
        m.hashes.resize(1 + below(kMaxVerifyChunks));
        for (uint64_t& h : m.hashes) h = u64();
        return m;
      }
    }
  }
  uint64_t chunk_size() { return kMinVerifyChunkSize << below(12); }  // 512 B .. 1 MiB
  Message message() { return message(below(std::variant_size_v<Message>)); }

 private:
  std::mt19937_64 rng_;
};

// ---------------------------------------------------------------------------

TEST(ProtocolTest, RoundTripsEveryMessageTypeWithRandomFields) {
  Gen gen(12345);
  for (size_t type = 0; type < std::variant_size_v<Message>; ++type) {
    for (int i = 0; i < 300; ++i) {
      Message m = gen.message(type);
      Bytes b = encoded(m);
      ASSERT_GE(b.size(), kHeaderSize);
      ASSERT_LE(b.size(), kMaxMessageSize);
      Result<Message> back = decode(b);
      ASSERT_TRUE(back.ok()) << type_name(type_of(m)) << ": " << back.status().to_string();
      EXPECT_EQ(type_of(*back), type_of(m));
      EXPECT_TRUE(*back == m) << type_name(type_of(m));
    }
  }
}

TEST(ProtocolTest, LargestMessagesFitTheLimit) {
  VolumeDescriptor d;
  d.activity_extent_size = 4 << 20;
  for (uint64_t i = 0; i < kMaxActivityExtents; ++i) d.activity_extents.push_back(kMax64 - 64 + i);
  d.generation_history = {1, 2, 3, 4};
  EXPECT_TRUE(decode(encoded(d)).ok());
  VerifyReply v{0, 4096, std::vector<uint64_t>(kMaxVerifyChunks, kMax64)};
  EXPECT_TRUE(decode(encoded(v)).ok());
  Commit c;
  c.ranges.assign(kMaxRangesPerMessage, Range{kMax64 - 1, 1});
  EXPECT_LE(encoded(c).size(), kMaxMessageSize);
  ErrorReply e{Errc::kInternal, std::string(kMaxErrorText, 'x')};
  EXPECT_TRUE(decode(encoded(e)).ok());
  Hello h = sample_hello();
  h.volume = std::string(kMaxNameLength, 'v');
  h.identity = std::string(kMaxNameLength, 'i');
  EXPECT_TRUE(decode(encoded(h)).ok());
}

TEST(ProtocolTest, TypeOfAndTypeNameAgree) {
  EXPECT_EQ(type_of(Hello{}), MessageType::kHello);
  EXPECT_EQ(type_of(Pong{}), MessageType::kPong);
  EXPECT_EQ(type_of(ErrorReply{}), MessageType::kError);
  EXPECT_EQ(type_name(MessageType::kPersistRequest), "PersistRequest");
  EXPECT_EQ(type_of(SetGeneration{}), MessageType::kSetGeneration);
  EXPECT_EQ(type_of(GenerationAck{}), MessageType::kGenerationAck);
  EXPECT_EQ(type_of(VerifyRequest{}), MessageType::kVerifyRequest);
  EXPECT_EQ(type_of(VerifyReply{}), MessageType::kVerifyReply);
  EXPECT_EQ(type_name(MessageType::kSetGeneration), "SetGeneration");
  EXPECT_EQ(type_name(MessageType::kGenerationAck), "GenerationAck");
  EXPECT_EQ(type_name(MessageType::kVerifyRequest), "VerifyRequest");
  EXPECT_EQ(type_name(MessageType::kVerifyReply), "VerifyReply");
  EXPECT_EQ(type_of(FenceAck{}), MessageType::kFenceAck);
  EXPECT_EQ(type_name(MessageType::kFenceAck), "FenceAck");
  EXPECT_EQ(type_name(static_cast<MessageType>(99)), "unknown");
}

// Pins the wire format: a change here breaks every deployed peer.
TEST(ProtocolTest, GoldenCommitBytes) {
  Commit c;
  c.sequence = 0x0102030405060708;
  c.generation = 2;
  c.ranges = {{0x1000, 0x200}};
  Bytes expected = from_hex(
      "504d4952 0200 0500 24000000 00000000"  // header: magic, v2, type 5, 36 bytes
      "0807060504030201"                      // sequence
      "0200000000000000"                      // generation
      "01000000"                              // range count
      "0010000000000000 0002000000000000");   // offset, length
  EXPECT_EQ(encoded(c), expected);
  Result<Message> back = decode(expected);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_TRUE(*back == Message(c));
}

TEST(ProtocolTest, GoldenHelloBytes) {
  Bytes expected = from_hex(
      "504d4952 0200 0100 2f000000 00000000"  // header: type 1, 47 bytes
      "0300 646230"                           // "db0"
      "0400 61707031"                         // "app1"
      "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
      "00000000");  // flags
  EXPECT_EQ(encoded(sample_hello()), expected);
}

TEST(ProtocolTest, GoldenErrorBytes) {
  Bytes expected = from_hex("504d4952 0200 0900 08000000 00000000  0a00 0400 62757379");
  EXPECT_EQ(encoded(ErrorReply{Errc::kBusy, "busy"}), expected);
}

TEST(ProtocolTest, GoldenSetGenerationBytes) {
  Bytes expected = from_hex(
      "504d4952 0200 0d00 0c000000 00000000"  // header: type 13, 12 bytes
      "0807060504030201"                      // generation
      "01000000");                            // flags: consistent
  EXPECT_EQ(encoded(SetGeneration{0x0102030405060708, kGenerationConsistent}), expected);
  EXPECT_EQ(encoded(GenerationAck{0x0102030405060708}),
            from_hex("504d4952 0200 0e00 08000000 00000000 0807060504030201"));
}

TEST(ProtocolTest, GoldenVerifyBytes) {
  EXPECT_EQ(encoded(VerifyRequest{0x10000, 0x20000, 0x10000}),
            from_hex("504d4952 0200 0f00 18000000 00000000"  // type 15, 24 bytes
                     "0000010000000000 0000020000000000 0000010000000000"));
  EXPECT_EQ(encoded(VerifyReply{0x10000, 0x10000, {1, 0xffffffffffffffff}}),
            from_hex("504d4952 0200 1000 24000000 00000000"  // type 16, 36 bytes
                     "0000010000000000 0000010000000000"     // offset, chunk_size
                     "02000000"                              // 2 hashes
                     "0100000000000000 ffffffffffffffff"));
}

TEST(ProtocolTest, GoldenVolumeDescriptorBytes) {
  VolumeDescriptor d;
  d.region_size = 0x100000;
  d.remote_address = 0x7f0000000000;
  d.rkey = 0x11223344;
  d.methods = kMethodApm | kMethodGpspm;
  d.generation = 1;
  d.last_sequence = 9;
  d.recv_slots = 64;
  for (size_t i = 0; i < 16; ++i) d.copy_uuid[i] = static_cast<uint8_t>(0xa0 + i);
  d.data_generation = 0x1111111111111111;
  d.generation_history = {0x2222222222222222, 0, 0, 0};
  d.copy_flags = kCopyConsistent | kCopyUnclean;
  d.activity_extent_size = 4 << 20;
  d.activity_extents = {3};
  for (size_t i = 0; i < kMacSize; ++i) d.mac[i] = static_cast<uint8_t>(i);
  Bytes expected = from_hex(
      "504d4952 0200 0400 9c000000 00000000"  // header: type 4, 156 bytes
      "0000100000000000"                      // region_size
      "00000000007f0000"                      // remote_address
      "44332211"                              // rkey
      "03000000"                              // methods
      "0100000000000000"                      // generation
      "0900000000000000"                      // last_sequence
      "40000000"                              // recv_slots
      "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf"      // copy_uuid
      "1111111111111111"                      // data_generation
      "2222222222222222 0000000000000000 0000000000000000 0000000000000000"
      "05000000"                   // copy_flags
      "0000400000000000"           // activity_extent_size
      "01000000 0300000000000000"  // 1 extent: 3
      "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f");
  EXPECT_EQ(encoded(d), expected);
  Result<Message> back = decode(expected);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_TRUE(*back == Message(d));
}

// --- header rejections -----------------------------------------------------

TEST(ProtocolDecodeTest, RejectsShortBuffer) {
  Bytes b = encoded(Ping{1});
  expect_rejected(Bytes(b.begin(), b.begin() + 15), "too short: 15 bytes");
  expect_rejected(Bytes{}, "too short: 0 bytes");
}

TEST(ProtocolDecodeTest, RejectsWrongMagic) {
  Bytes b = encoded(Ping{1});
  b[0] = std::byte{'X'};
  expect_rejected(b, "bad magic");
}

TEST(ProtocolDecodeTest, RejectsOtherVersionNamingBoth) {
  Bytes b = encoded(Hello(sample_hello()));
  put_le(b, 4, 1, 2);
  expect_rejected(b, "peer speaks pmirror protocol version 1, this side speaks version 2",
                  Errc::kUnsupported);
  put_le(b, 4, 3, 2);
  expect_rejected(b, "version 3", Errc::kUnsupported);
  put_le(b, 4, 0, 2);
  expect_rejected(b, "version 0", Errc::kUnsupported);
}

TEST(ProtocolDecodeTest, OtherVersionErrorReplyCarriesThePeersReason) {
  Bytes b = encoded(ErrorReply{Errc::kUnsupported, "this target speaks only version 1"});
  put_le(b, 4, 1, 2);
  expect_rejected(b, "the peer says: unsupported: this target speaks only version 1",
                  Errc::kUnsupported);
  // Fields a later version appends to ErrorReply do not hide the reason.
  b.push_back(std::byte{0x55});
  fix_length(b);
  expect_rejected(b, "the peer says: unsupported", Errc::kUnsupported);
}

TEST(ProtocolDecodeTest, RejectsUnknownType) {
  Bytes b = encoded(Ping{1});
  put_le(b, 6, 0, 2);
  expect_rejected(b, "unknown message type 0");
  put_le(b, 6, 18, 2);
  expect_rejected(b, "unknown message type 18");
  put_le(b, 6, 0xffff, 2);
  expect_rejected(b, "unknown message type 65535");
}

TEST(ProtocolDecodeTest, RejectsPayloadLengthMismatch) {
  Bytes b = encoded(Ping{1});
  put_le(b, 8, 9, 4);
  expect_rejected(b, "header.payload_length is 9 but 8 bytes follow the header");
  put_le(b, 8, 7, 4);
  expect_rejected(b, "header.payload_length is 7 but 8");
  put_le(b, 8, 0xffffffff, 4);
  expect_rejected(b, "header.payload_length is 4294967295");
}

TEST(ProtocolDecodeTest, RejectsOversizedMessage) {
  Bytes b = encoded(Ping{1});
  b.resize(kMaxMessageSize + 1);
  fix_length(b);
  expect_rejected(b, "message is 4097 bytes, over the 4096-byte limit");
}

TEST(ProtocolDecodeTest, RejectsNonzeroReserved) {
  Bytes b = encoded(Ping{1});
  b[15] = std::byte{1};
  expect_rejected(b, "header.reserved is 0x1000000, must be 0");
}

// --- payload rejections ----------------------------------------------------

TEST(ProtocolDecodeTest, RejectsTrailingBytes) {
  Bytes b = encoded(Ping{1});
  b.push_back(std::byte{0});
  fix_length(b);
  expect_rejected(b, "1 trailing bytes after the Ping fields");
  b = encoded(Goodbye{});
  b.resize(b.size() + 3);
  fix_length(b);
  expect_rejected(b, "3 trailing bytes after the Goodbye fields");
  b = encoded(sample_commit());
  b.resize(b.size() + 16);  // a whole extra range the count does not cover
  fix_length(b);
  expect_rejected(b, "16 trailing bytes after the Commit fields");
}

TEST(ProtocolDecodeTest, RejectsTruncatedFields) {
  Bytes b = encoded(Ping{1});
  b.resize(b.size() - 1);
  fix_length(b);
  expect_rejected(b, "truncated message: Ping.token needs 8 bytes, 7 left");

  b = encoded(sample_commit());
  b.resize(b.size() - 8);  // second range's length missing
  fix_length(b);
  expect_rejected(b, "truncated message: Commit.ranges needs 32 bytes, 24 left");

  b = encoded(Hello(sample_hello()));
  b.resize(kHeaderSize + 1);  // half of the volume length
  fix_length(b);
  expect_rejected(b, "truncated message: Hello.volume length needs 2 bytes");

  b = encoded(Hello(sample_hello()));
  b.resize(kHeaderSize + 2 + 2);  // "db0" cut after two bytes
  fix_length(b);
  expect_rejected(b, "truncated message: Hello.volume needs 3 bytes, 2 left");

  b = encoded(VolumeDescriptor{});
  b.resize(b.size() - 1);
  fix_length(b);
  expect_rejected(b, "VolumeDescriptor.mac needs 32 bytes, 31 left");
}

TEST(ProtocolDecodeTest, RejectsBadRangeCounts) {
  const size_t count_at = kHeaderSize + 16;  // after sequence, generation
  Bytes b = encoded(sample_commit());
  put_le(b, count_at, 0, 4);
  expect_rejected(b, "Commit.ranges: count is 0, must be 1..200");
  put_le(b, count_at, 201, 4);
  expect_rejected(b, "count is 201");
  put_le(b, count_at, 0xffffffff, 4);  // must not allocate 4G ranges
  expect_rejected(b, "count is 4294967295");
  put_le(b, count_at, 3, 4);  // more than the two that follow
  expect_rejected(b, "truncated message: Commit.ranges needs 48 bytes, 32 left");

  b = encoded(PersistRequest{1, 1, {{0, 1}}});
  put_le(b, count_at, 0, 4);
  expect_rejected(b, "PersistRequest.ranges: count is 0");
}

TEST(ProtocolDecodeTest, RejectsBadRanges) {
  const size_t first = kHeaderSize + 20;
  Bytes b = encoded(sample_commit());
  put_le(b, first + 16 + 8, 0, 8);  // ranges[1].length = 0
  expect_rejected(b, "Commit: ranges[1]: length is 0");

  b = encoded(PersistRequest{1, 1, {{0, 1}}});
  put_le(b, first, kMax64, 8);  // offset UINT64_MAX + length 1
  expect_rejected(b,
                  "PersistRequest: ranges[0]: offset 0xffffffffffffffff + length 0x1 "
                  "overflows 64 bits");
}

TEST(ProtocolDecodeTest, RejectsBadVolumeNames) {
  auto with_volume = [](std::string v) {
    Hello h = sample_hello();
    h.volume = "x";
    Bytes b = encoded(h);
    // Splice the raw name in, bypassing encode()'s checks.
    Bytes out(b.begin(), b.begin() + kHeaderSize);
    out.push_back(static_cast<std::byte>(v.size() & 0xff));
    out.push_back(static_cast<std::byte>(v.size() >> 8));
    for (char c : v) out.push_back(static_cast<std::byte>(c));
    out.insert(out.end(), b.begin() + kHeaderSize + 3, b.end());
    fix_length(out);
    return out;
  };
  ASSERT_TRUE(decode(with_volume("ok.name_-9")).ok());
  expect_rejected(with_volume(""), "Hello.volume: volume name is empty");
  expect_rejected(with_volume(std::string(65, 'a')),
                  "Hello.volume: volume name is 65 bytes, the limit is 64");
  expect_rejected(with_volume("a/b"), "volume name has '/' at byte 1");
  expect_rejected(with_volume(std::string("a\0b", 3)), "volume name has 0x0 at byte 1");
  expect_rejected(with_volume("db 0"), "volume name has 0x20 at byte 2");
}

TEST(ProtocolDecodeTest, RejectsBadIdentities) {
  auto with_identity = [](std::string id) {
    Hello h = sample_hello();
    h.identity = "x";
    Bytes b = encoded(h);
    const size_t at = kHeaderSize + 2 + h.volume.size();
    Bytes out(b.begin(), b.begin() + at);
    out.push_back(static_cast<std::byte>(id.size() & 0xff));
    out.push_back(static_cast<std::byte>(id.size() >> 8));
    for (char c : id) out.push_back(static_cast<std::byte>(c));
    out.insert(out.end(), b.begin() + at + 3, b.end());
    fix_length(out);
    return out;
  };
  ASSERT_TRUE(decode(with_identity("app 1 \xc3\xa9")).ok());  // spaces and UTF-8 are fine
  expect_rejected(with_identity(""), "Hello.identity: identity is empty");
  expect_rejected(with_identity(std::string(65, 'a')), "identity is 65 bytes, the limit is 64");
  expect_rejected(with_identity(std::string("a\0", 2)), "control character 0x0 at byte 1");
  expect_rejected(with_identity("a\nb"), "control character 0xa at byte 1");
}

TEST(ProtocolDecodeTest, RejectsUndefinedHelloFlags) {
  Bytes b = encoded(Hello(sample_hello()));
  put_le(b, b.size() - 4, 0x88, 4);
  expect_rejected(b,
                  "Hello.flags has undefined bits 0x80 (defined: cumulative acks 0x1, fence 0x2, "
                  "lineage 0x4, placement order 0x8, native flush 0x10, one-sided commit 0x20, "
                  "promoted 0x40)");
  const uint32_t known =
      kHelloPlacementOrder | kHelloCumulativeAcks | kHelloNativeFlush | kHelloOneSidedCommit;
  put_le(b, b.size() - 4, known, 4);
  auto decoded = decode(b);
  ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
  EXPECT_EQ(std::get<Hello>(*decoded).flags, known);
}

TEST(ProtocolTest, GoldenHelloWithLineageBytes) {
  Hello h = sample_hello();
  h.flags = kHelloLineage;
  h.lineage.current = 0x1122334455667788;
  h.lineage.history = {7, 6, 0, 0};
  h.lineage.left_behind_at = 5;
  Bytes expected = from_hex(
      "504d4952 0200 0100 5f000000 00000000"  // header: type 1, 95 bytes
      "0300 646230"                           // "db0"
      "0400 61707031"                         // "app1"
      "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
      "04000000"                                      // flags: lineage
      "8877665544332211"                              // current
      "0700000000000000 0600000000000000"             // history
      "0000000000000000 0000000000000000"             //
      "0500000000000000");                            // left_behind_at
  EXPECT_EQ(encoded(h), expected);
  EXPECT_TRUE(h.lineage.knows(6));
  EXPECT_TRUE(h.lineage.knows(5));
  EXPECT_TRUE(h.lineage.knows(0x1122334455667788));
  EXPECT_FALSE(h.lineage.knows(8));
  EXPECT_FALSE(h.lineage.knows(0));  // an unused entry is not a generation
}

TEST(ProtocolTest, GoldenFenceAckBytes) {
  FenceAck ack{0x0102030405060708, 2, {}};
  ack.mac[0] = 0xaa;
  EXPECT_EQ(encoded(ack), from_hex("504d4952 0200 1100 2c000000 00000000  0807060504030201"
                                   "02000000 aa" +
                                   std::string(62, '0')));
}

TEST(ProtocolDecodeTest, RejectsBadFencesAndLineages) {
  // A Hello whose flags do not announce the lineage carries none: the
  // bytes after the flags are trailing garbage.
  Hello h = sample_hello();
  h.flags = kHelloLineage;
  h.lineage.current = 9;
  Bytes b = encoded(h);
  put_le(b, kHeaderSize + 5 + 6 + kNonceSize, 0, 4);
  expect_rejected(b, "trailing");
  b = encoded(h);
  put_le(b, kHeaderSize + 5 + 6 + kNonceSize + 4 + 8 + 8, 3, 8);  // history {0, 3, 0, 0}
  expect_rejected(b, "Hello.lineage.history has a generation after an unused entry");
  // A fence names the promoted generation in lineage.current.
  h = sample_hello();
  h.flags = kHelloFence | kHelloLineage;
  h.lineage.current = 9;
  b = encoded(h);
  put_le(b, kHeaderSize + 5 + 6 + kNonceSize + 4, 0, 8);
  expect_rejected(b, "Hello: a fence must carry the promoted generation (lineage.current)");
  h.flags = kHelloFence;
  h.lineage = {};
  Bytes out;
  EXPECT_THAT(encode(h, out).message(), HasSubstr("a fence must carry the promoted generation"));
  // A promoted primary says so with its lineage, and is not a fence.
  h = sample_hello();
  h.flags = kHelloLineage | kHelloPromoted;
  h.lineage.current = 9;
  ASSERT_TRUE(decode(encoded(h)).ok());
  h.flags = kHelloLineage | kHelloPromoted | kHelloFence;
  EXPECT_THAT(encode(h, out).message(), HasSubstr("the promoted flag (0x40) needs the lineage"));
  h.flags = kHelloPromoted;
  h.lineage = {};
  EXPECT_THAT(encode(h, out).message(), HasSubstr("the promoted flag (0x40) needs the lineage"));
}

TEST(ProtocolDecodeTest, RejectsUndefinedMethodBits) {
  VolumeDescriptor d;
  d.methods = kMethodApm | kMethodGpspm;
  Bytes b = encoded(d);
  put_le(b, kHeaderSize + 20, 0x2f, 4);
  expect_rejected(b, "VolumeDescriptor.methods has undefined bits 0x20");
  put_le(b, kHeaderSize + 20, kMethodPlacementOrder | kMethodGpspm, 4);
  expect_rejected(b, "placement order (0x4) without APM (0x1)");
  put_le(b, kHeaderSize + 20, kMethodNativeFlush | kMethodGpspm, 4);
  expect_rejected(b, "native flush (0x8) without APM (0x1)");
  put_le(b, kHeaderSize + 20, kMethodNativeFlush | kMethodApm, 4);
  ASSERT_TRUE(decode(b).ok());
  put_le(b, kHeaderSize + 20, kMethodPlacementOrder | kMethodApm, 4);
  auto decoded = decode(b);
  ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
  EXPECT_EQ(std::get<VolumeDescriptor>(*decoded).methods, kMethodPlacementOrder | kMethodApm);
}

// One-sided commit: the commit word's address and key follow the mac, only
// with methods bit 4, which needs native flush; the word is 8-byte aligned.
TEST(ProtocolDecodeTest, OneSidedCommitCarriesTheCommitWord) {
  VolumeDescriptor d;
  d.methods = kMethodApm | kMethodGpspm | kMethodNativeFlush | kMethodOneSidedCommit;
  d.commit_address = 0x7f0012345678;
  d.commit_rkey = 0xabcd;
  Bytes b = encoded(d);
  auto decoded = decode(b);
  ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
  EXPECT_EQ(std::get<VolumeDescriptor>(*decoded), d);
  Bytes without_word = encoded(VolumeDescriptor{});
  EXPECT_EQ(b.size(), without_word.size() + 12) << "8 bytes of address, 4 of key";

  // The bit without the fields: truncated.
  Bytes truncated(b.begin(), b.end() - 12);
  put_le(truncated, 8, static_cast<uint64_t>(truncated.size() - kHeaderSize), 4);
  EXPECT_FALSE(decode(truncated).ok());

  Bytes bad = b;
  put_le(bad, kHeaderSize + 20, kMethodApm | kMethodOneSidedCommit, 4);
  expect_rejected(bad, "one-sided commit (0x10) without native flush (0x8)");
  bad = b;
  put_le(bad, bad.size() - 12, 0x7f0012345679, 8);
  expect_rejected(bad, "is not 8-byte aligned");

  VolumeDescriptor stray;
  stray.methods = kMethodApm;
  stray.commit_rkey = 1;
  Bytes out;
  EXPECT_THAT(encode(stray, out).message(), HasSubstr("a commit word without one-sided commit"));
}

TEST(ProtocolDecodeTest, RejectsBadErrorReplies) {
  Bytes b = encoded(ErrorReply{Errc::kBusy, "volume db0 has a writer"});
  put_le(b, kHeaderSize, 0, 2);
  expect_rejected(b, "ErrorReply.code 0 is not a known error code");
  put_le(b, kHeaderSize, 18, 2);
  expect_rejected(b, "ErrorReply.code 18 is not a known error code");
  put_le(b, kHeaderSize, 15, 2);  // split brain, new in version 2
  EXPECT_TRUE(decode(b).ok());

  b = encoded(ErrorReply{Errc::kBusy, "a"});
  b.back() = std::byte{0};
  expect_rejected(b, "ErrorReply.text: error text contains a NUL byte");

  b = encoded(ErrorReply{Errc::kBusy, ""});
  put_le(b, kHeaderSize + 2, kMaxErrorText + 1, 2);
  b.resize(b.size() + kMaxErrorText + 1, std::byte{'x'});
  fix_length(b);
  expect_rejected(b, "error text is 513 bytes, the limit is 512");

  b = encoded(ErrorReply{Errc::kBusy, "abc"});
  put_le(b, kHeaderSize + 2, 4, 2);  // claims one byte more than there is
  expect_rejected(b, "truncated message: ErrorReply.text needs 4 bytes, 3 left");
}

// VolumeDescriptor in version 2: fixed part up to recv_slots (44 bytes), then
// these payload offsets.
constexpr size_t kHistoryAt = kHeaderSize + 44 + 16 + 8;
constexpr size_t kCopyFlagsAt = kHistoryAt + 32;
constexpr size_t kExtentSizeAt = kCopyFlagsAt + 4;
constexpr size_t kExtentCountAt = kExtentSizeAt + 8;

VolumeDescriptor sample_descriptor() {
  VolumeDescriptor d;
  d.methods = kMethodGpspm;
  d.data_generation = 5;
  d.generation_history = {4, 3, 0, 0};
  d.copy_flags = kCopyConsistent | kCopyUnclean;
  d.activity_extent_size = 4 << 20;
  d.activity_extents = {1, 7};
  return d;
}

TEST(ProtocolDecodeTest, RejectsBadDescriptorCopyFields) {
  Bytes good = encoded(sample_descriptor());
  ASSERT_TRUE(decode(good).ok());

  Bytes b = good;
  put_le(b, kHistoryAt + 8, 0, 8);  // history {4, 0, 0, 0} is fine
  ASSERT_TRUE(decode(b).ok());
  put_le(b, kHistoryAt + 16, 9, 8);  // {4, 0, 9, 0}: a used entry after an unused one
  expect_rejected(b, "VolumeDescriptor.generation_history[2] is set after an unused (0) entry");

  b = good;
  put_le(b, kCopyFlagsAt, 0x9, 4);
  expect_rejected(b, "VolumeDescriptor.copy_flags has undefined bits 0x8");

  b = good;
  put_le(b, kExtentSizeAt, 0, 8);
  expect_rejected(b, "VolumeDescriptor.activity_extent_size is 0 but 2 extents are listed");

  b = good;
  put_le(b, kExtentCountAt + 4 + 8, 1, 8);  // {1, 1}
  expect_rejected(b, "VolumeDescriptor.activity_extents[1] (1) is not above the one before it");

  b = good;
  put_le(b, kExtentCountAt, 65, 4);
  expect_rejected(b, "VolumeDescriptor.activity_extents: count is 65, must be 0..64");
  put_le(b, kExtentCountAt, 0xffffffff, 4);  // must not allocate for it
  expect_rejected(b, "count is 4294967295");
  put_le(b, kExtentCountAt, 3, 4);  // one more than follows (the mac is taken as extents)
  b.resize(kExtentCountAt + 4 + 16);
  fix_length(b);
  expect_rejected(b,
                  "truncated message: VolumeDescriptor.activity_extents needs 24 bytes, 16 left");

  // No extents with size 0 is fine (a clean copy).
  VolumeDescriptor clean = sample_descriptor();
  clean.activity_extent_size = 0;
  clean.activity_extents.clear();
  EXPECT_TRUE(decode(encoded(clean)).ok());
}

TEST(ProtocolDecodeTest, RejectsBadSetGeneration) {
  Bytes b = encoded(SetGeneration{7, kGenerationConsistent});
  put_le(b, kHeaderSize + 8, 0x3, 4);
  expect_rejected(b, "SetGeneration.flags has undefined bits 0x2");
  b = encoded(SetGeneration{7, 0});
  put_le(b, kHeaderSize, 0, 8);  // generation 0: a primary that never started one
  EXPECT_TRUE(decode(b).ok());
  b = encoded(SetGeneration{7, 0});
  b.pop_back();
  fix_length(b);
  expect_rejected(b, "truncated message: SetGeneration.flags needs 4 bytes, 3 left");
}

TEST(ProtocolDecodeTest, RejectsBadVerifyRequests) {
  auto request = [](uint64_t offset, uint64_t length, uint64_t chunk) {
    Bytes b = encoded(VerifyRequest{0, 4096, 4096});
    put_le(b, kHeaderSize, offset, 8);
    put_le(b, kHeaderSize + 8, length, 8);
    put_le(b, kHeaderSize + 16, chunk, 8);
    return b;
  };
  ASSERT_TRUE(decode(request(8192, 4096 * 256, 4096)).ok());
  ASSERT_TRUE(decode(request(512, 1, 512)).ok());
  expect_rejected(request(0, 4096, 0), "VerifyRequest.chunk_size is 0, must be a power of two");
  expect_rejected(request(0, 4096, 256), "chunk_size is 256");
  expect_rejected(request(0, 4096, 3000), "chunk_size is 3000");
  expect_rejected(request(0, 4096, 2u << 20), "chunk_size is 2097152");
  expect_rejected(request(100, 4096, 4096), "VerifyRequest.offset 100 is not a multiple of");
  expect_rejected(request(0, 0, 4096), "VerifyRequest.length is 0");
  expect_rejected(request(kMax64 - 4095, 4097, 4096), "overflows 64 bits");
  expect_rejected(request(0, 4096 * 256 + 1, 4096),
                  "VerifyRequest covers 257 chunks, the limit is 256 per request");
}

TEST(ProtocolDecodeTest, RejectsBadVerifyReplies) {
  Bytes b = encoded(VerifyReply{4096, 4096, {1, 2, 3}});
  put_le(b, kHeaderSize + 8, 4097, 8);
  expect_rejected(b, "VerifyReply.chunk_size is 4097");
  b = encoded(VerifyReply{4096, 4096, {1, 2, 3}});
  put_le(b, kHeaderSize, 2048, 8);
  expect_rejected(b, "VerifyReply.offset 2048 is not a multiple of the chunk size 4096");
  b = encoded(VerifyReply{4096, 4096, {1}});
  put_le(b, kHeaderSize + 16, 0, 4);
  b.resize(b.size() - 8);
  fix_length(b);
  expect_rejected(b, "VerifyReply.hashes: count is 0, must be 1..256");
  put_le(b, kHeaderSize + 16, 257, 4);
  expect_rejected(b, "count is 257");
}

// --- verify helpers ----------------------------------------------------------

TEST(VerifyHelpersTest, ChunkCountAndSplit) {
  EXPECT_EQ(chunk_count(1, 4096), 1u);
  EXPECT_EQ(chunk_count(4096, 4096), 1u);
  EXPECT_EQ(chunk_count(4097, 4096), 2u);
  EXPECT_EQ(chunk_count(kMax64, 1u << 20), (kMax64 >> 20) + 1);

  auto parts = split_verify(4096, 4096 * 600 + 10, 4096);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0], (VerifyRequest{4096, 4096 * 256, 4096}));
  EXPECT_EQ(parts[1], (VerifyRequest{4096 + 4096 * 256, 4096 * 256, 4096}));
  EXPECT_EQ(parts[2], (VerifyRequest{4096 + 4096 * 512, 4096 * 88 + 10, 4096}));
  for (const auto& part : parts) EXPECT_TRUE(decode(encoded(part)).ok());
  EXPECT_TRUE(split_verify(0, 0, 4096).empty());
}

TEST(VerifyHelpersTest, CheckVerifyRequestAgainstRegion) {
  EXPECT_TRUE(check_verify_request({0, 8192, 4096}, 8192).ok());
  EXPECT_TRUE(check_verify_request({4096, 100, 4096}, 8192).ok());
  Status s = check_verify_request({4096, 8192, 4096}, 8192);
  EXPECT_EQ(s.code(), Errc::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("ends beyond the volume's 8192 bytes"));
  EXPECT_FALSE(check_verify_request({16384, 1, 4096}, 8192).ok());
}

TEST(VerifyHelpersTest, HashChunksIsXxh3OfEachChunk) {
  Bytes data(10000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 7 + i / 4096);
  auto hashes = hash_chunks(data, 4096);
  ASSERT_EQ(hashes.size(), 3u);
  EXPECT_EQ(hashes[0], XXH3_64bits(data.data(), 4096));
  EXPECT_EQ(hashes[1], XXH3_64bits(data.data() + 4096, 4096));
  EXPECT_EQ(hashes[2], XXH3_64bits(data.data() + 8192, 10000 - 8192));  // the short tail
  EXPECT_NE(hashes[0], hashes[1]);
  EXPECT_TRUE(hash_chunks({}, 4096).empty());
}

// --- encode refuses what decode would refuse -------------------------------

TEST(ProtocolEncodeTest, RefusesMessagesOutsideTheLimits) {
  Bytes out{std::byte{1}};
  Commit c;
  Status s = encode(c, out);
  EXPECT_EQ(s.code(), Errc::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("cannot encode Commit: Commit: range count is 0"));
  EXPECT_TRUE(out.empty());

  c.ranges.assign(kMaxRangesPerMessage + 1, Range{0, 1});
  EXPECT_THAT(encode(c, out).message(), HasSubstr("range count is 201"));

  Hello h = sample_hello();
  h.volume = std::string(kMaxNameLength + 1, 'a');
  EXPECT_THAT(encode(h, out).message(), HasSubstr("volume name is 65 bytes"));
  h = sample_hello();
  h.flags = 0xb8;
  EXPECT_THAT(encode(h, out).message(), HasSubstr("Hello.flags has undefined bits 0x80"));

  ErrorReply e{Errc::kOk, "fine"};
  EXPECT_THAT(encode(e, out).message(), HasSubstr("ErrorReply.code 0 is not a known"));
  e = ErrorReply{Errc::kInternal, std::string(kMaxErrorText + 1, 'x')};
  EXPECT_THAT(encode(e, out).message(), HasSubstr("error text is 513 bytes"));

  PersistRequest p{1, 1, {{kMax64, 1}}};
  EXPECT_THAT(encode(p, out).message(), HasSubstr("overflows 64 bits"));

  VolumeDescriptor d;
  d.activity_extent_size = 1;
  d.activity_extents.resize(kMaxActivityExtents + 1);
  for (size_t i = 0; i < d.activity_extents.size(); ++i) d.activity_extents[i] = i;
  EXPECT_THAT(encode(d, out).message(), HasSubstr("activity_extents: count is 65"));
  EXPECT_THAT(encode(SetGeneration{1, 2}, out).message(), HasSubstr("undefined bits 0x2"));
  EXPECT_THAT(encode(VerifyRequest{0, 1, 1000}, out).message(), HasSubstr("chunk_size is 1000"));
  EXPECT_THAT(encode(VerifyReply{0, 4096, {}}, out).message(), HasSubstr("count is 0"));
  EXPECT_THAT(
      encode(VerifyReply{0, 4096, std::vector<uint64_t>(kMaxVerifyChunks + 1)}, out).message(),
      HasSubstr("count is 257"));
}

// --- mutation fuzzing ------------------------------------------------------

// Whatever arrives, decode() must not crash or read out of bounds (run
// under -DPMIRROR_SANITIZE=ON to check the latter), and whatever it accepts
// must be the canonical encoding of what it returned: there is exactly one
// byte string per message, so no two peers can disagree about a message.
TEST(ProtocolTest, PrintableEscapesWhatAPeerChose) {
  EXPECT_EQ(printable("app1"), "app1");
  EXPECT_EQ(printable("\xff\xfe\xfd"), "\\xff\\xfe\\xfd");
  EXPECT_EQ(printable("a\\b"), "a\\\\b");  // a backslash cannot pose as an escape
  EXPECT_EQ(printable(std::string("x\0y\n\x1b", 5)), "x\\x00y\\x0a\\x1b");
  EXPECT_EQ(printable("caf\xc3\xa9"), "caf\\xc3\\xa9");  // ASCII out, always
  EXPECT_EQ(printable(std::string(300, 'a'), 8), "aaaaaaaa...");
}

TEST(ProtocolFuzzTest, MutatedBuffersFailOrReencodeIdentically) {
  Gen gen(777);
  size_t accepted = 0;
  for (int i = 0; i < 100000; ++i) {
    Bytes b;
    uint64_t shape = gen.below(10);
    if (shape == 0) {
      // Pure noise, sometimes behind a valid magic and version.
      b.resize(gen.below(kMaxMessageSize + 64));
      for (auto& x : b) x = static_cast<std::byte>(gen.below(256));
      if (b.size() >= 8 && gen.below(2)) {
        put_le(b, 0, kMagic, 4);
        put_le(b, 4, kVersion, 2);
        put_le(b, 6, 1 + gen.below(std::variant_size_v<Message>), 2);
      }
    } else {
      b = encoded(gen.message());
      int mutations = 1 + static_cast<int>(gen.below(4));
      for (int k = 0; k < mutations; ++k) {
        switch (gen.below(5)) {
          case 0:
          case 1:
            if (!b.empty()) b[gen.below(b.size())] ^= static_cast<std::byte>(1 + gen.below(255));
            break;
          case 2:
            b.resize(gen.below(b.size() + 1));
            break;
          case 3:
            for (uint64_t n = 1 + gen.below(32); n > 0; --n) {
              b.push_back(static_cast<std::byte>(gen.below(256)));
            }
            break;
          case 4:
            // Keep the header consistent so the payload parsers get exercised.
            if (b.size() >= kHeaderSize) fix_length(b);
            break;
        }
      }
      if (gen.below(2) && b.size() >= kHeaderSize) fix_length(b);
    }
    Result<Message> r = decode(b);
    if (!r.ok()) {
      ASSERT_FALSE(r.status().message().empty());
      ASSERT_TRUE(r.status().code() == Errc::kProtocolError ||
                  r.status().code() == Errc::kUnsupported)
          << r.status().to_string();
      continue;
    }
    ++accepted;
    Bytes again;
    Status s = encode(*r, again);
    ASSERT_TRUE(s.ok()) << "decode accepted what encode refuses: " << s.to_string();
    ASSERT_EQ(again, b) << "iteration " << i << ": accepted bytes are not canonical";
  }
  // Sanity: the mutations are not so destructive that nothing parses.
  EXPECT_GT(accepted, 1000u);
}

// --- check_ranges ----------------------------------------------------------

TEST(CheckRangesTest, AcceptsRangesInside) {
  std::vector<Range> rs = {{0, 1}, {4095, 1}, {0, 4096}};
  EXPECT_TRUE(check_ranges(rs, 4096).ok());
  std::vector<Range> top = {{kMax64 - 1, 1}};
  EXPECT_TRUE(check_ranges(top, kMax64).ok());
}

TEST(CheckRangesTest, RejectsEmptyList) {
  Status s = check_ranges({}, 4096);
  EXPECT_EQ(s.code(), Errc::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("no ranges"));
}

TEST(CheckRangesTest, RejectsZeroLength) {
  std::vector<Range> rs = {{0, 8}, {16, 0}};
  Status s = check_ranges(rs, 4096);
  EXPECT_EQ(s.code(), Errc::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("range 1 (offset 16, length 0): length is 0"));
}

TEST(CheckRangesTest, RejectsBeyondEnd) {
  std::vector<Range> rs = {{4000, 97}};
  EXPECT_THAT(check_ranges(rs, 4096).message(), HasSubstr("ends beyond the volume's 4096 bytes"));
  rs = {{4096, 1}};
  EXPECT_FALSE(check_ranges(rs, 4096).ok());
  rs = {{0, 1}};
  EXPECT_FALSE(check_ranges(rs, 0).ok());
}

TEST(CheckRangesTest, RejectsOverflowNearUint64Max) {
  std::vector<Range> rs = {{kMax64, 1}};
  EXPECT_THAT(check_ranges(rs, kMax64).message(), HasSubstr("overflows 64 bits"));
  rs = {{kMax64 - 1, 2}};
  EXPECT_THAT(check_ranges(rs, kMax64).message(), HasSubstr("overflows"));
  rs = {{2, kMax64 - 1}};
  EXPECT_THAT(check_ranges(rs, kMax64).message(), HasSubstr("overflows"));
  // A wrapped sum (offset + length == 8 mod 2^64) must not pass as "inside".
  rs = {{kMax64 - 7, 16}};
  EXPECT_THAT(check_ranges(rs, 4096).message(), HasSubstr("overflows"));
}

// --- names and error replies -----------------------------------------------

TEST(CheckNameTest, Rules) {
  EXPECT_TRUE(check_name("db0").ok());
  EXPECT_TRUE(check_name("A.b_c-9").ok());
  EXPECT_TRUE(check_name(std::string(kMaxNameLength, 'n')).ok());
  EXPECT_EQ(check_name("").code(), Errc::kInvalidArgument);
  EXPECT_THAT(check_name(std::string(kMaxNameLength + 1, 'n')).message(),
              HasSubstr("65 bytes, the limit is 64"));
  EXPECT_THAT(check_name("db:0").message(), HasSubstr("':' at byte 2"));
  EXPECT_THAT(check_name("d\xc3\xa9").message(), HasSubstr("0xc3 at byte 1"));
}

TEST(ErrorReplyTest, MakeErrorReplyAlwaysEncodes) {
  ErrorReply r = make_error_reply(Status(Errc::kNotFound, "no volume \"x\""));
  EXPECT_EQ(r.code, Errc::kNotFound);
  EXPECT_EQ(r.text, "no volume \"x\"");

  // 511 ASCII bytes then a two-byte character straddling the limit.
  std::string long_text = std::string(kMaxErrorText - 1, 'a') + "\xc3\xa9" + "tail";
  long_text[3] = '\0';
  r = make_error_reply(Status(Errc::kIoError, long_text));
  EXPECT_EQ(r.text.size(), kMaxErrorText - 1);  // the split character is dropped whole
  EXPECT_EQ(r.text[3], '?');
  Bytes b;
  ASSERT_TRUE(encode(r, b).ok());

  r = make_error_reply(Status::Ok());
  EXPECT_EQ(r.code, Errc::kInternal);
  EXPECT_TRUE(encode(r, b).ok());
}

TEST(ErrorReplyTest, ToStatus) {
  Status s = to_status(ErrorReply{Errc::kPermissionDenied, "authentication failed"});
  EXPECT_EQ(s.code(), Errc::kPermissionDenied);
  EXPECT_EQ(s.message(), "authentication failed");
  EXPECT_EQ(to_status(ErrorReply{Errc::kOk, "?"}).code(), Errc::kProtocolError);
}

}  // namespace
}  // namespace pmirror::protocol

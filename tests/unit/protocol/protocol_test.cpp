#include "protocol/protocol.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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
        m.generation = u64();
        m.last_sequence = u64();
        m.recv_slots = static_cast<uint32_t>(u64());
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
        return ErrorReply{static_cast<Errc>(1 + below(14)), text()};
      case 9:
        return Goodbye{};
      case 10:
        return Ping{u64()};
      default:
        return Pong{u64()};
    }
  }
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
  EXPECT_EQ(type_name(static_cast<MessageType>(99)), "unknown");
}

// Pins the wire format: a change here breaks every deployed peer.
TEST(ProtocolTest, GoldenCommitBytes) {
  Commit c;
  c.sequence = 0x0102030405060708;
  c.generation = 2;
  c.ranges = {{0x1000, 0x200}};
  Bytes expected = from_hex(
      "504d4952 0100 0500 24000000 00000000"  // header: magic, v1, type 5, 36 bytes
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
      "504d4952 0100 0100 2f000000 00000000"  // header: type 1, 47 bytes
      "0300 646230"                           // "db0"
      "0400 61707031"                         // "app1"
      "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
      "00000000");  // flags
  EXPECT_EQ(encoded(sample_hello()), expected);
}

TEST(ProtocolTest, GoldenErrorBytes) {
  Bytes expected = from_hex("504d4952 0100 0900 08000000 00000000  0a00 0400 62757379");
  EXPECT_EQ(encoded(ErrorReply{Errc::kBusy, "busy"}), expected);
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
  put_le(b, 4, 2, 2);
  expect_rejected(b, "peer speaks pmirror protocol version 2, this side speaks version 1",
                  Errc::kUnsupported);
  put_le(b, 4, 0, 2);
  expect_rejected(b, "version 0", Errc::kUnsupported);
}

TEST(ProtocolDecodeTest, OtherVersionErrorReplyCarriesThePeersReason) {
  Bytes b = encoded(ErrorReply{Errc::kUnsupported, "this target speaks only version 2"});
  put_le(b, 4, 2, 2);
  expect_rejected(b, "the peer says: unsupported: this target speaks only version 2",
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
  put_le(b, 6, 13, 2);
  expect_rejected(b, "unknown message type 13");
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

TEST(ProtocolDecodeTest, RejectsNonzeroHelloFlags) {
  Bytes b = encoded(Hello(sample_hello()));
  put_le(b, b.size() - 4, 0x10, 4);
  expect_rejected(b, "Hello.flags is 0x10, must be 0");
}

TEST(ProtocolDecodeTest, RejectsUndefinedMethodBits) {
  VolumeDescriptor d;
  d.methods = kMethodApm | kMethodGpspm;
  Bytes b = encoded(d);
  put_le(b, kHeaderSize + 20, 0x7, 4);
  expect_rejected(b, "VolumeDescriptor.methods has undefined bits 0x4");
}

TEST(ProtocolDecodeTest, RejectsBadErrorReplies) {
  Bytes b = encoded(ErrorReply{Errc::kBusy, "volume db0 has a writer"});
  put_le(b, kHeaderSize, 0, 2);
  expect_rejected(b, "ErrorReply.code 0 is not a known error code");
  put_le(b, kHeaderSize, 15, 2);
  expect_rejected(b, "ErrorReply.code 15 is not a known error code");

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
  h.flags = 1;
  EXPECT_THAT(encode(h, out).message(), HasSubstr("Hello.flags is 0x1"));

  ErrorReply e{Errc::kOk, "fine"};
  EXPECT_THAT(encode(e, out).message(), HasSubstr("ErrorReply.code 0 is not a known"));
  e = ErrorReply{Errc::kInternal, std::string(kMaxErrorText + 1, 'x')};
  EXPECT_THAT(encode(e, out).message(), HasSubstr("error text is 513 bytes"));

  PersistRequest p{1, 1, {{kMax64, 1}}};
  EXPECT_THAT(encode(p, out).message(), HasSubstr("overflows 64 bits"));
}

// --- mutation fuzzing ------------------------------------------------------

// Whatever arrives, decode() must not crash or read out of bounds (run
// under -DPMIRROR_SANITIZE=ON to check the latter), and whatever it accepts
// must be the canonical encoding of what it returned: there is exactly one
// byte string per message, so no two peers can disagree about a message.
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
        put_le(b, 6, 1 + gen.below(12), 2);
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

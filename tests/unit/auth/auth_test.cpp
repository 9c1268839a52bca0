#include "auth/auth.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

namespace pmirror::auth {
namespace {

using ::testing::HasSubstr;

std::string to_hex(const Mac& mac) {
  std::string out;
  char buf[3];
  for (uint8_t b : mac) {
    std::snprintf(buf, sizeof buf, "%02x", b);
    out += buf;
  }
  return out;
}

Nonce counting_nonce(uint8_t first) {
  Nonce n{};
  for (size_t i = 0; i < n.size(); ++i) n[i] = static_cast<uint8_t>(first + i);
  return n;
}

// --- the HMAC primitive ----------------------------------------------------

// RFC 4231, test cases 1, 2 and 6 (HMAC-SHA-256).
TEST(HmacTest, Rfc4231Vectors) {
  EXPECT_EQ(to_hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(to_hex(hmac_sha256(std::string(131, '\xaa'),
                               "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(HmacTest, EmptyKeyAndDataDoNotCrash) {
  // Known value: HMAC-SHA256("", "").
  EXPECT_EQ(to_hex(hmac_sha256("", "")),
            "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
}

// --- proofs ----------------------------------------------------------------

struct Fixture {
  Nonce client = counting_nonce(0x00);
  Nonce server = counting_nonce(0x20);
  SessionContext context() const { return {"db0", "app1", client, server}; }
};

// Known answers computed outside pmirror (Python hmac over the documented
// input), so they pin the MAC input format of docs/protocol.md.
TEST(ProofTest, KnownAnswers) {
  Fixture f;
  EXPECT_EQ(to_hex(initiator_proof("s3cret", f.context())),
            "c92e34e85ac42af39939e450fcfba46005e0df6ca82e73b0abfe775b2c14f21c");
  EXPECT_EQ(to_hex(target_proof("s3cret", f.context())),
            "93eceaf3e3bb456ba4c31d49a0cc5fb6d7734083c608bb0f8fe1539a08435dcc");
}

// The same input built by hand and MAC'd by OpenSSL directly.
TEST(ProofTest, MatchesIndependentHmacOverDocumentedInput) {
  Fixture f;
  auto field = [](std::string& out, std::string_view v) {
    uint32_t n = static_cast<uint32_t>(v.size());
    out.push_back(static_cast<char>(n & 0xff));
    out.push_back(static_cast<char>((n >> 8) & 0xff));
    out.push_back(static_cast<char>((n >> 16) & 0xff));
    out.push_back(static_cast<char>(n >> 24));
    out.append(v);
  };
  std::string input;
  field(input, "pmirror-v1 initiator");
  field(input, "db0");
  field(input, "app1");
  field(input, std::string_view(reinterpret_cast<const char*>(f.client.data()), 32));
  field(input, std::string_view(reinterpret_cast<const char*>(f.server.data()), 32));
  EXPECT_EQ(proof_input(kInitiatorLabel, f.context()), input);

  Mac expected{};
  unsigned int len = 0;
  ASSERT_NE(HMAC(EVP_sha256(), "key", 3, reinterpret_cast<const unsigned char*>(input.data()),
                 input.size(), expected.data(), &len),
            nullptr);
  EXPECT_EQ(initiator_proof("key", f.context()), expected);
}

TEST(ProofTest, ProofsDifferInEveryInput) {
  Fixture f;
  const Mac base = initiator_proof("secret", f.context());
  std::set<std::string> seen = {to_hex(base)};
  auto distinct = [&seen](const Mac& m) { return seen.insert(to_hex(m)).second; };

  // Direction: the initiator's proof cannot be replayed as the target's.
  EXPECT_TRUE(distinct(target_proof("secret", f.context())));
  // Secret.
  EXPECT_TRUE(distinct(initiator_proof("secreT", f.context())));
  // Volume and identity.
  EXPECT_TRUE(distinct(initiator_proof("secret", {"db1", "app1", f.client, f.server})));
  EXPECT_TRUE(distinct(initiator_proof("secret", {"db0", "app2", f.client, f.server})));
  // Each nonce, including swapping them.
  Nonce other = f.client;
  other[31] ^= 1;
  EXPECT_TRUE(distinct(initiator_proof("secret", {"db0", "app1", other, f.server})));
  EXPECT_TRUE(distinct(initiator_proof("secret", {"db0", "app1", f.client, other})));
  EXPECT_TRUE(distinct(initiator_proof("secret", {"db0", "app1", f.server, f.client})));
  // Field boundaries: "ab"+"c" vs "a"+"bc" must not collide.
  EXPECT_TRUE(distinct(initiator_proof("secret", {"ab", "c", f.client, f.server})));
  EXPECT_TRUE(distinct(initiator_proof("secret", {"a", "bc", f.client, f.server})));

  // And it is deterministic.
  EXPECT_EQ(initiator_proof("secret", f.context()), base);
}

TEST(ProofTest, MacsEqual) {
  Fixture f;
  Mac a = initiator_proof("secret", f.context());
  Mac b = a;
  EXPECT_TRUE(macs_equal(a, b));
  b[31] ^= 0x80;
  EXPECT_FALSE(macs_equal(a, b));
  b = a;
  b[0] ^= 1;
  EXPECT_FALSE(macs_equal(a, b));
}

TEST(NonceTest, RandomNoncesDiffer) {
  Result<Nonce> a = random_nonce();
  Result<Nonce> b = random_nonce();
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_NE(*a, *b);
  EXPECT_NE(*a, Nonce{});
}

// --- secret files ----------------------------------------------------------

class SecretFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "pmirror_auth_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& content, mode_t mode = 0600) {
    std::string path = dir_ + "/" + name;
    {
      std::ofstream out(path, std::ios::binary);
      out << content;
    }
    EXPECT_EQ(::chmod(path.c_str(), mode), 0);
    return path;
  }

  std::string dir_;
};

TEST_F(SecretFileTest, ReadsAndStripsOneNewline) {
  Result<std::string> s = read_secret_file(write("a", "hunter2\n"));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(*s, "hunter2");

  s = read_secret_file(write("b", "hunter2"));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, "hunter2");

  s = read_secret_file(write("c", "two\n\n"));  // only one newline is stripped
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, "two\n");

  s = read_secret_file(write("d", " spaced \n", 0400));  // read-only is fine
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, " spaced ");
}

TEST_F(SecretFileTest, StripsCrlf) {
  Result<std::string> s = read_secret_file(write("crlf", "hunter2\r\n"));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(*s, "hunter2");
  s = read_secret_file(write("cr", "hunter2\r"));  // a lone CR is content
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, "hunter2\r");
}

TEST_F(SecretFileTest, RejectsGroupOrOtherAccess) {
  for (mode_t mode : {0644, 0640, 0604, 0610, 0601, 0660}) {
    std::string path = write("open", "hunter2\n", mode);
    Result<std::string> s = read_secret_file(path);
    ASSERT_FALSE(s.ok()) << "mode " << std::oct << mode;
    EXPECT_EQ(s.status().code(), Errc::kPermissionDenied);
    EXPECT_THAT(s.status().message(), HasSubstr("chmod 600 " + path));
  }
  EXPECT_THAT(read_secret_file(write("m", "x", 0644)).status().message(),
              HasSubstr("has mode 0644"));
}

TEST_F(SecretFileTest, RejectsEmpty) {
  for (std::string content : {"", "\n", "\r\n"}) {
    Result<std::string> s = read_secret_file(write("empty", content));
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), Errc::kInvalidArgument);
    EXPECT_THAT(s.status().message(), HasSubstr("is empty"));
  }
}

TEST_F(SecretFileTest, RejectsMissing) {
  Result<std::string> s = read_secret_file(dir_ + "/nope");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Errc::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr(dir_ + "/nope"));
  EXPECT_THAT(s.status().message(), HasSubstr("No such file"));
}

TEST_F(SecretFileTest, RejectsDirectoryAndFifo) {
  ASSERT_EQ(::chmod(dir_.c_str(), 0700), 0);
  Result<std::string> s = read_secret_file(dir_);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("not a regular file (it is a directory)"));

  // A FIFO must be refused, not block the caller waiting for a writer.
  std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  s = read_secret_file(fifo);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("not a regular file"));
}

TEST_F(SecretFileTest, SizeCap) {
  Result<std::string> s = read_secret_file(write("max", std::string(kMaxSecretFileSize, 'k')));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->size(), kMaxSecretFileSize);

  s = read_secret_file(write("big", std::string(kMaxSecretFileSize + 1, 'k')));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Errc::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("4097 bytes; a secret is at most 4096"));
}

TEST_F(SecretFileTest, FollowsSymlinkAndChecksTheTarget) {
  std::string target = write("real", "hunter2\n");
  std::string link = dir_ + "/link";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  Result<std::string> s = read_secret_file(link);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(*s, "hunter2");
  ASSERT_EQ(::chmod(target.c_str(), 0644), 0);
  EXPECT_FALSE(read_secret_file(link).ok());
}

TEST_F(SecretFileTest, RejectsFileOwnedBySomeoneElse) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown a file to another user";
  std::string path = write("foreign", "hunter2\n");
  ASSERT_EQ(::chown(path.c_str(), 12345, 12345), 0);
  Result<std::string> s = read_secret_file(path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Errc::kPermissionDenied);
  EXPECT_THAT(s.status().message(), HasSubstr("owned by uid 12345"));
}

}  // namespace
}  // namespace pmirror::auth

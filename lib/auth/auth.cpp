#include "auth/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "common/unique_fd.h"

namespace pmirror::auth {

namespace {

std::string openssl_error() {
  unsigned long err = ERR_get_error();
  if (err == 0) return "no OpenSSL error recorded";
  char buf[256];
  ERR_error_string_n(err, buf, sizeof buf);
  ERR_clear_error();
  return buf;
}

void append_field(std::string& out, std::string_view field) {
  auto n = static_cast<uint32_t>(field.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.append(field);
}

std::string_view as_chars(const Nonce& nonce) {
  return {reinterpret_cast<const char*>(nonce.data()), nonce.size()};
}

}  // namespace

Result<Nonce> random_nonce() {
  Nonce nonce{};
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    // A predictable nonce would allow replaying a recorded session.
    return Status(Errc::kInternal,
                  "cannot generate a random nonce (OpenSSL RAND_bytes): " + openssl_error());
  }
  return nonce;
}

Mac hmac_sha256(std::string_view key, std::string_view data) {
  Mac mac{};
  unsigned int len = 0;
  // OpenSSL wants a non-null key pointer even for an empty key.
  static const unsigned char kEmpty = 0;
  const void* key_ptr = key.empty() ? &kEmpty : static_cast<const void*>(key.data());
  const auto* data_ptr =
      data.empty() ? &kEmpty : reinterpret_cast<const unsigned char*>(data.data());
  if (HMAC(EVP_sha256(), key_ptr, static_cast<int>(key.size()), data_ptr, data.size(), mac.data(),
           &len) == nullptr ||
      len != mac.size()) {
    // Returning any value here would either let everyone in or silently
    // refuse everyone; neither is an error a caller could handle.
    std::fprintf(stderr, "pmirror: fatal: HMAC-SHA256 failed in OpenSSL: %s\n",
                 openssl_error().c_str());
    std::abort();
  }
  return mac;
}

std::string proof_input(std::string_view label, const SessionContext& context) {
  std::string input;
  input.reserve(5 * 4 + label.size() + context.volume.size() + context.identity.size() +
                2 * protocol::kNonceSize);
  append_field(input, label);
  append_field(input, context.volume);
  append_field(input, context.identity);
  append_field(input, as_chars(context.client_nonce));
  append_field(input, as_chars(context.server_nonce));
  return input;
}

Mac initiator_proof(std::string_view secret, const SessionContext& context) {
  return hmac_sha256(secret, proof_input(kInitiatorLabel, context));
}

Mac target_proof(std::string_view secret, const SessionContext& context) {
  return hmac_sha256(secret, proof_input(kTargetLabel, context));
}

bool macs_equal(const Mac& a, const Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Result<std::string> read_secret_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO placed at the path must not hang the daemon;
  // it is rejected below as not a regular file.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (fd.get() < 0) {
    int err = errno;
    Errc code = err == ENOENT                     ? Errc::kNotFound
                : (err == EACCES || err == EPERM) ? Errc::kPermissionDenied
                                                  : Errc::kIoError;
    return errno_status(code, "cannot open secret file " + path, err);
  }
  // fstat on the open descriptor: the checks apply to the file we read, not
  // to whatever the path points at a moment later.
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return errno_status(Errc::kIoError, "cannot stat secret file " + path, errno);
  }
  if (!S_ISREG(st.st_mode)) {
    return Status(Errc::kInvalidArgument, "secret file " + path + " is not a regular file" +
                                              (S_ISDIR(st.st_mode) ? " (it is a directory)" : ""));
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Status(Errc::kPermissionDenied, "secret file " + path + " has mode " + mode +
                                               ", which lets group or others access it; run "
                                               "`chmod 600 " +
                                               path + "`");
  }
  uid_t euid = ::geteuid();
  if (st.st_uid != euid && st.st_uid != 0) {
    // Someone else's file, even if private, could be replaced by its owner.
    return Status(Errc::kPermissionDenied,
                  "secret file " + path + " is owned by uid " + std::to_string(st.st_uid) +
                      "; it must belong to the user running pmirror (uid " + std::to_string(euid) +
                      ") or root; run `chown " + std::to_string(euid) + " " + path + "`");
  }
  if (st.st_size > static_cast<off_t>(kMaxSecretFileSize)) {
    return Status(Errc::kInvalidArgument, "secret file " + path + " is " +
                                              std::to_string(st.st_size) +
                                              " bytes; a secret is at most " +
                                              std::to_string(kMaxSecretFileSize) + " bytes");
  }

  // Read one byte past the cap, so a file that grew after fstat is caught.
  std::string secret(kMaxSecretFileSize + 1, '\0');
  size_t got = 0;
  while (got < secret.size()) {
    ssize_t n = ::read(fd.get(), secret.data() + got, secret.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(Errc::kIoError, "cannot read secret file " + path, errno);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > kMaxSecretFileSize) {
    return Status(Errc::kInvalidArgument, "secret file " + path + " is larger than " +
                                              std::to_string(kMaxSecretFileSize) + " bytes");
  }
  secret.resize(got);
  // Editors add a final newline; the secret is what is on the line.
  if (secret.ends_with("\r\n")) {
    secret.resize(secret.size() - 2);
  } else if (secret.ends_with('\n')) {
    secret.resize(secret.size() - 1);
  }
  if (secret.empty()) {
    return Status(Errc::kInvalidArgument,
                  "secret file " + path + " is empty; put the volume's shared secret in it");
  }
  return secret;
}

}  // namespace pmirror::auth

// Challenge-response authentication of a session with a volume's shared
// secret (HMAC-SHA256, OpenSSL). The secret never travels; each side proves
// it knows it by a MAC over both nonces, the volume and the identity, with a
// different label per direction so one proof cannot be replayed as the other.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "protocol/protocol.h"

namespace pmirror::auth {

using Nonce = std::array<uint8_t, protocol::kNonceSize>;
using Mac = std::array<uint8_t, protocol::kMacSize>;

// Cryptographically random nonce (RAND_bytes).
Result<Nonce> random_nonce();

struct SessionContext {
  std::string_view volume;
  std::string_view identity;
  const Nonce& client_nonce;
  const Nonce& server_nonce;
};

// HMAC-SHA256(secret, "pmirror-v1 initiator" | volume | identity | nonces)
Mac initiator_proof(std::string_view secret, const SessionContext& context);
// HMAC-SHA256(secret, "pmirror-v1 target" | ...)
Mac target_proof(std::string_view secret, const SessionContext& context);

// The MAC input of both proofs: each field as u32 little-endian length +
// bytes, in this order: label, volume, identity, client nonce, server
// nonce. Length prefixes make the encoding injective, so no two different
// contexts (say volume "ab"+identity "c" vs "a"+"bc") share an input.
// docs/protocol.md documents it byte for byte.
std::string proof_input(std::string_view label, const SessionContext& context);
inline constexpr std::string_view kInitiatorLabel = "pmirror-v1 initiator";
inline constexpr std::string_view kTargetLabel = "pmirror-v1 target";

// HMAC-SHA256(key, data). The primitive under both proofs, exposed so it can
// be checked against published test vectors (RFC 4231). Aborts if OpenSSL
// cannot compute it at all: nothing can be authenticated then.
Mac hmac_sha256(std::string_view key, std::string_view data);

// Constant-time comparison (CRYPTO_memcmp).
bool macs_equal(const Mac& a, const Mac& b);

// Reads a secret file: must be a regular file not readable or writable by
// group/others (like ssh keys), owned by the effective user or root, at
// most kMaxSecretFileSize bytes; one trailing "\n" or "\r\n" stripped;
// empty is an error.
inline constexpr size_t kMaxSecretFileSize = 4096;
Result<std::string> read_secret_file(const std::string& path);

}  // namespace pmirror::auth

// Fuzz harness: the session handshake, from both ends, on bytes a stranger
// could send before it is authenticated (docs/testing.md).
//
// Input layout (tests/fuzz/make_seeds.cpp writes valid ones):
//   56 bytes  the tcp transport's HELLO frame: 40-byte FrameHeader + 16-byte
//             Hello (lib/transport/tcp/wire.h)
//   then up to four protocol messages, each a u16 little-endian length and
//   that many bytes, in handshake order:
//     1. Hello             (initiator -> target)   } the target's side
//     2. AuthResponse      (initiator -> target)   }
//     3. Challenge         (target -> initiator)   } the initiator's side
//     4. VolumeDescriptor  (target -> initiator)   }
// A part cut short stands for a peer that hung up there.
//
// It drives the pure steps the target and the initiator apply to each
// message (decode, the name and identity checks, the HMAC proofs with a
// fixed secret and nonces, the refusal texts built from peer strings, the
// initiator's sync decision from the descriptor's copy fields) and checks:
// memory safety, no undefined behaviour, and
//  - the tcp header and hello decode and re-encode to the same bytes;
//  - a session is accepted only for the configured volume and identity with
//    the right MAC, and every refusal text, which quotes peer-supplied
//    strings, still makes an ErrorReply that encodes;
//  - a VolumeDescriptor is accepted only with the target's proof, its
//    activity extents are strictly ascending, and the sync decision is
//    consistent with the generations it was made from.
// The handshake's socket and timing logic (lib/transport/tcp,
// lib/target) is not here: it is not a pure function.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "auth/auth.h"
#include "fuzz/handshake_fixture.h"
#include "initiator/sync_decision.h"
#include "metadata/metadata.h"
#include "protocol/protocol.h"
#include "transport/tcp/wire.h"

namespace {

using namespace pmirror;
namespace tcp = pmirror::transport::tcp;

using fuzz::kClientNonce;
using fuzz::kIdentity;
using fuzz::kSecret;
using fuzz::kServerNonce;
using fuzz::kVolume;
constexpr size_t kTcpHelloFrame = tcp::kHeaderSize + tcp::kHelloPayloadSize;

void require(bool condition) {
  if (!condition) std::abort();
}

using Part = std::optional<std::span<const std::byte>>;

// The four length-prefixed messages; a missing one is nullopt.
std::array<Part, 4> split_parts(std::span<const std::byte> rest) {
  std::array<Part, 4> parts;
  for (Part& part : parts) {
    if (rest.size() < 2) break;
    size_t length = std::to_integer<size_t>(rest[0]) | (std::to_integer<size_t>(rest[1]) << 8);
    rest = rest.subspan(2);
    if (rest.size() < length) break;
    part = rest.first(length);
    rest = rest.subspan(length);
  }
  return parts;
}

// A refusal the target sends quotes what the peer sent; it must always
// make an ErrorReply that encodes (session::refuse sends exactly that).
void refuse(Errc code, const std::string& text) {
  protocol::ErrorReply reply = protocol::make_error_reply(Status(code, text));
  std::vector<std::byte> bytes;
  require(protocol::encode(reply, bytes).ok());
}

void tcp_hello(std::span<const std::byte> frame) {
  const auto* p = reinterpret_cast<const uint8_t*>(frame.data());
  tcp::FrameHeader header = tcp::decode(p);
  tcp::HeaderBytes again{};
  tcp::encode(header, again.data());
  require(std::equal(again.begin(), again.end(), p));
  tcp::Hello hello = tcp::decode_hello(p + tcp::kHeaderSize);
  std::array<uint8_t, tcp::kHelloPayloadSize> hello_again{};
  tcp::encode(hello, hello_again.data());
  require(std::equal(hello_again.begin(), hello_again.end(), p + tcp::kHeaderSize));
}

// The target: Hello, then AuthResponse.
void target_side(const Part& first, const Part& second) {
  if (!first) return;
  auto message = protocol::decode(*first);
  if (!message.ok()) return refuse(message.status().code(), message.status().message());
  const auto* hello = std::get_if<protocol::Hello>(&*message);
  if (hello == nullptr) return refuse(Errc::kProtocolError, "expected Hello first");
  require(protocol::check_name(hello->volume).ok());
  if (hello->volume != kVolume) {
    return refuse(Errc::kNotFound, "no volume '" + hello->volume + "' on this target");
  }
  if (!second) return;
  auto answer = protocol::decode(*second);
  if (!answer.ok()) return refuse(answer.status().code(), answer.status().message());
  const auto* response = std::get_if<protocol::AuthResponse>(&*answer);
  if (response == nullptr) return refuse(Errc::kProtocolError, "expected AuthResponse");
  auth::SessionContext context{kVolume, hello->identity, hello->client_nonce, kServerNonce};
  bool known = hello->identity == kIdentity;
  bool proven = auth::macs_equal(response->mac, auth::initiator_proof(kSecret, context));
  if (!known || !proven) {
    return refuse(Errc::kPermissionDenied, "authentication failed for '" + hello->identity +
                                               "' on volume '" + std::string(kVolume) + "'");
  }
  // Accepted: only the one identity that holds the secret gets here.
  require(hello->identity == kIdentity && hello->volume == kVolume);
  protocol::VolumeDescriptor descriptor;
  descriptor.mac = auth::target_proof(kSecret, context);
  std::vector<std::byte> bytes;
  require(protocol::encode(descriptor, bytes).ok());
}

void check_decision(const metadata::Generations& ours, const metadata::PeerInfo& peer,
                    const initiator::RemoteCopy& remote, bool overwrite) {
  initiator::SyncDecision decision = initiator::decide_sync(ours, peer, remote, overwrite);
  require(!decision.reason.empty());
  require(!initiator::sync_action_name(decision.action).empty());
  const uint64_t theirs = remote.generations.current;
  if (theirs == 0) require(decision.action == initiator::SyncAction::kFullSync);
  if (decision.action == initiator::SyncAction::kInSync) {
    require(theirs == ours.current && peer.dirty_chunks == 0 && !peer.full_sync);
  }
  if (overwrite) require(decision.action != initiator::SyncAction::kSplitBrain);
}

// The initiator: its own Hello is fixed; Challenge, then VolumeDescriptor.
void initiator_side(const Part& third, const Part& fourth) {
  if (!third) return;
  auto reply = protocol::decode(*third);
  if (!reply.ok()) return;
  const auto* challenge = std::get_if<protocol::Challenge>(&*reply);
  if (challenge == nullptr) {
    require(!protocol::type_name(protocol::type_of(*reply)).empty());
    return;
  }
  auth::SessionContext context{kVolume, kIdentity, kClientNonce, challenge->server_nonce};
  std::vector<std::byte> bytes;
  require(protocol::encode(protocol::AuthResponse{auth::initiator_proof(kSecret, context)}, bytes)
              .ok());

  if (!fourth) return;
  auto accepted = protocol::decode(*fourth);
  if (!accepted.ok()) return;
  const auto* descriptor = std::get_if<protocol::VolumeDescriptor>(&*accepted);
  if (descriptor == nullptr) return;
  if (!auth::macs_equal(descriptor->mac, auth::target_proof(kSecret, context))) return;
  require(std::adjacent_find(
              descriptor->activity_extents.begin(), descriptor->activity_extents.end(),
              [](uint64_t a, uint64_t b) { return a >= b; }) == descriptor->activity_extents.end());
  require(descriptor->activity_extents.size() <= protocol::kMaxActivityExtents);

  // The copy as lib/initiator/replica.cpp reads it from the descriptor.
  initiator::RemoteCopy remote;
  remote.uuid = descriptor->copy_uuid;
  remote.generations.current = descriptor->data_generation;
  std::copy(descriptor->generation_history.begin(), descriptor->generation_history.end(),
            remote.generations.history.begin());
  remote.consistent = (descriptor->copy_flags & protocol::kCopyConsistent) != 0;
  remote.promoted = (descriptor->copy_flags & protocol::kCopyPromoted) != 0;

  // Our copy and what we recorded about this replica: a few fixed cases
  // built around the generations the descriptor names, so that every
  // branch of the decision is reachable.
  metadata::Generations ours;
  ours.current = descriptor->generation_history[0] != 0 ? descriptor->generation_history[0]
                                                        : descriptor->data_generation + 1;
  ours.history[0] = descriptor->data_generation;
  metadata::PeerInfo never_seen;
  metadata::PeerInfo left_behind;
  left_behind.name = "node2";
  left_behind.peer_uuid = descriptor->copy_uuid;
  left_behind.bitmap_generation = descriptor->data_generation;
  left_behind.dirty_chunks = descriptor->last_sequence;
  metadata::PeerInfo replaced = left_behind;
  replaced.peer_uuid[0] ^= 1;
  replaced.full_sync = true;
  for (const metadata::PeerInfo& peer : {never_seen, left_behind, replaced}) {
    for (bool overwrite : {false, true}) {
      check_decision(ours, peer, remote, overwrite);
      check_decision(remote.generations, peer, remote, overwrite);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> input(reinterpret_cast<const std::byte*>(data), size);
  if (input.size() < kTcpHelloFrame) return 0;
  tcp_hello(input.first(kTcpHelloFrame));
  std::array<Part, 4> parts = split_parts(input.subspan(kTcpHelloFrame));
  target_side(parts[0], parts[1]);
  initiator_side(parts[2], parts[3]);
  return 0;
}

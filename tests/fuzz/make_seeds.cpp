// Writes the fuzz harnesses' seed inputs into DIR/<harness>/seed-*: real
// messages made by the encoder (protocol, handshake) and real requests and
// replies of the control socket (docs/control.md). The config seeds are
// the project's own cluster files, copied (docs/testing.md).
//
//   make_seeds tests/fuzz/corpus
//
// Run it after a wire format change and commit what changed; it never
// touches the regression inputs (crash-*, regress-*) next to the seeds.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <variant>
#include <vector>

#include "auth/auth.h"
#include "fuzz/handshake_fixture.h"
#include "protocol/protocol.h"
#include "transport/tcp/wire.h"

namespace {

using namespace pmirror;
using namespace pmirror::protocol;
namespace fs = std::filesystem;
namespace tcp = pmirror::transport::tcp;
using Bytes = std::vector<std::byte>;

bool failed = false;

void write(const fs::path& dir, const std::string& name, const Bytes& bytes) {
  fs::create_directories(dir);
  std::ofstream out(dir / ("seed-" + name), std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
    failed = true;
  }
}

void write(const fs::path& dir, const std::string& name, const std::string& text) {
  Bytes bytes(text.size());
  for (size_t i = 0; i < text.size(); ++i) bytes[i] = static_cast<std::byte>(text[i]);
  write(dir, name, bytes);
}

Bytes encoded(const Message& message) {
  Bytes out;
  Status status = encode(message, out);
  if (!status.ok()) {
    std::fprintf(stderr, "encode: %s\n", status.to_string().c_str());
    failed = true;
  }
  return out;
}

std::string snake(std::string_view name) {
  std::string out;
  for (char c : name) {
    if (c >= 'A' && c <= 'Z') {
      if (!out.empty()) out += '_';
      out += static_cast<char>(c - 'A' + 'a');
    } else {
      out += c;
    }
  }
  return out;
}

VolumeDescriptor descriptor(const auth::Mac& mac) {
  VolumeDescriptor d;
  d.region_size = 64ull << 20;
  d.remote_address = 0x7f0000000000;
  d.rkey = 0x1234;
  d.methods = kMethodApm | kMethodGpspm;
  d.generation = 3;
  d.last_sequence = 1000;
  d.recv_slots = 64;
  for (size_t i = 0; i < d.copy_uuid.size(); ++i) d.copy_uuid[i] = static_cast<uint8_t>(0xa0 + i);
  d.data_generation = 0x9f3a2b1c4d5e6f70;
  d.generation_history = {0x12ab34cd56ef7890, 0x0badc0ffee000001, 0, 0};
  d.copy_flags = kCopyConsistent | kCopyUnclean;
  d.activity_extent_size = 1 << 20;
  d.activity_extents = {0, 3, 17};
  d.mac = mac;
  return d;
}

std::vector<Message> sample_messages() {
  Hello hello;
  hello.volume = "db0";
  hello.identity = "app1";
  for (size_t i = 0; i < kNonceSize; ++i) hello.client_nonce[i] = static_cast<uint8_t>(i);
  auth::Mac mac{};
  for (size_t i = 0; i < mac.size(); ++i) mac[i] = static_cast<uint8_t>(0xff - i);
  return {hello,
          Challenge{fuzz::kServerNonce},
          AuthResponse{mac},
          descriptor(mac),
          Commit{7, 3, {{0, 4096}, {8192, 64}}},
          CommitAck{7},
          PersistRequest{8, 3, {{4096, 4096}}},
          PersistAck{8},
          ErrorReply{Errc::kPermissionDenied, "authentication failed for 'app1' on volume 'db0'"},
          Goodbye{},
          Ping{42},
          Pong{42},
          SetGeneration{0x9f3a2b1c4d5e6f70, kGenerationConsistent},
          GenerationAck{0x9f3a2b1c4d5e6f70},
          VerifyRequest{0, 1 << 20, 65536},
          VerifyReply{0, 65536, {0x0123456789abcdef, 0xfedcba9876543210}}};
}

void protocol_seeds(const fs::path& dir) {
  for (const Message& message : sample_messages()) {
    write(dir, snake(type_name(type_of(message))), encoded(message));
  }
}

Bytes tcp_hello_frame(uint32_t message_size) {
  Bytes out(tcp::kHeaderSize + tcp::kHelloPayloadSize);
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  tcp::FrameHeader header;
  header.type = tcp::FrameType::kHello;
  header.length = tcp::kHelloPayloadSize;
  tcp::encode(header, p);
  tcp::encode(tcp::Hello{tcp::kProtocolVersion, message_size, 64, 256}, p + tcp::kHeaderSize);
  return out;
}

void append_part(Bytes& out, const Bytes& part) {
  out.push_back(static_cast<std::byte>(part.size() & 0xff));
  out.push_back(static_cast<std::byte>(part.size() >> 8));
  out.insert(out.end(), part.begin(), part.end());
}

// The handshake as the harness expects it (handshake_fuzz.cpp): both
// sides' MACs valid, so the seeds reach the steps after authentication.
void handshake_seeds(const fs::path& dir) {
  Hello hello;
  hello.volume = std::string(fuzz::kVolume);
  hello.identity = std::string(fuzz::kIdentity);
  hello.client_nonce = fuzz::kClientNonce;
  auth::SessionContext target_context{fuzz::kVolume, fuzz::kIdentity, hello.client_nonce,
                                      fuzz::kServerNonce};
  AuthResponse response{auth::initiator_proof(fuzz::kSecret, target_context)};
  auth::SessionContext initiator_context{fuzz::kVolume, fuzz::kIdentity, fuzz::kClientNonce,
                                         fuzz::kServerNonce};
  VolumeDescriptor accepted = descriptor(auth::target_proof(fuzz::kSecret, initiator_context));

  auto session = [&](const Hello& h, const AuthResponse& r, const VolumeDescriptor& d) {
    Bytes out = tcp_hello_frame(4096);
    append_part(out, encoded(h));
    append_part(out, encoded(r));
    append_part(out, encoded(Challenge{fuzz::kServerNonce}));
    append_part(out, encoded(d));
    return out;
  };
  write(dir, "accepted", session(hello, response, accepted));

  VolumeDescriptor fresh = accepted;  // a copy that never received data
  fresh.data_generation = 0;
  fresh.generation_history = {};
  fresh.copy_flags = kCopyConsistent;
  fresh.activity_extent_size = 0;
  fresh.activity_extents.clear();
  write(dir, "accepted-fresh-copy", session(hello, response, fresh));

  Hello stranger = hello;
  stranger.identity = "\xff\xfe\xfd";  // issue 9: bytes that are not UTF-8
  write(dir, "unknown-identity", session(stranger, response, accepted));
  Hello other_volume = hello;
  other_volume.volume = "db1";
  write(dir, "unknown-volume", session(other_volume, response, accepted));
  AuthResponse wrong = response;
  wrong.mac[0] ^= 1;
  write(dir, "wrong-mac", session(hello, wrong, accepted));
  Bytes refused = tcp_hello_frame(4096);
  append_part(refused, encoded(hello));
  append_part(refused, encoded(response));
  append_part(refused, encoded(ErrorReply{Errc::kBusy, "volume 'db0' already has a writer"}));
  write(dir, "refused", refused);
  write(dir, "tcp-hello-only", tcp_hello_frame(1 << 16));
}

void control_seeds(const fs::path& dir) {
  // Requests, as docs/control.md shows them.
  write(dir, "status", R"({"command":"status"})");
  write(dir, "status-volume", R"({"command":"status","volume":"nope"})");
  write(dir, "resync", R"({"command":"resync","volume":"db0","peer":"node3","full":false})");
  write(dir, "verify", R"({"command":"verify","volume":"db0","peer":"node3","mark_dirty":false})");
  write(dir, "promote", R"({"command":"promote","volume":"db1","force":false})");
  write(dir, "demote", R"({"command":"demote","volume":"db1"})");
  write(dir, "events", R"({"command":"events"})");
  write(dir, "not-json", "status please\r");
  write(dir, "no-command", R"({"volume":"db0"})");
  // Replies and events pmirrorctl reads.
  // The status object of docs/control.md, with the optional parts.
  write(dir, "reply-status",
        R"({"schema_version":1,"process":{"kind":"initiator","pid":1234,"node":"node1",)"
        R"("identity":"app1","started_at":"2026-11-29T16:00:00Z","version":"0.1.0"},)"
        R"("volumes":[{"name":"db0","role":"primary","size":1073741824,"path":"/dev/dax0.0",)"
        R"("backing":"devdax","generation":"9f3a2b1c4d5e6f70","chunk_size":65536,)"
        R"("metadata":"/var/lib/pmirror/db0.pmirror","promoted":false,"in_sync":1,)"
        R"("ack_required":1,"copy":{"uuid":"a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf",)"
        R"("generation":"9f3a2b1c4d5e6f70","history":["12ab34cd56ef7890"],"consistent":true,)"
        R"("promoted":false,"clean":false},"last_sequence":123456,"methods":["apm","gpspm"],)"
        R"("peers":[{"name":"node2","address":"10.0.0.2:7450","transport":"rdma",)"
        R"("state":"syncing","since":"2026-11-29T16:01:02Z","reason":"handshake complete",)"
        R"("method":"apm","acknowledged_sequence":123450,"lag":6,"persists":123450,)"
        R"("bytes":987654321,"errors":0,"latency_us":{"p50":55.1,"p99":130.2,"p999":900.0,)"
        R"("count":123450,"sum":6800000.5},"resync":{"done_bytes":1048576,"left_bytes":3145728,)"
        R"("total_bytes":4194304,"rate_bytes_per_s":104857600,"eta_seconds":1,"full":false},)"
        R"("dirty_bytes":65536,"dirty_chunks":1,"generation":"12ab34cd56ef7890",)"
        R"("behind_since_generation":"12ab34cd56ef7890"}]},{"name":"db1","role":"replica",)"
        R"("size":4096,"path":"/srv/db1","backing":"plain file","generation":3,)"
        R"("last_sequence":7,"methods":["gpspm"],"peers":[]}]})");
  write(
      dir, "reply-event",
      R"({"time":"2026-11-29T16:01:02.5Z","process":"pmirrord","node":"node2","volume":"db0",)"
      R"("peer":"node1","from":"connected","to":"disconnected","reason":"nothing heard for 5000 ms"})");
  write(dir, "reply-dropped", R"({"dropped":12})");
  write(dir, "reply-verify",
        R"({"volume":"db0","chunk_size":65536,"peers":[{"name":"node3","chunks_compared":16384,)"
        R"("bytes_compared":1073741824,"mismatches":[{"offset":0,"length":65536}],)"
        R"("mismatch_count":1,"marked_dirty":0},{"name":"node4","error":{"code":"timeout",)"
        R"("message":"no answer"}}]})");
  write(dir, "reply-resync",
        R"({"volume":"db0","peer":"node3","started":true,"dirty_bytes":3355443,"dirty_chunks":52,)"
        R"("full":false})");
  write(dir, "reply-promote",
        R"({"volume":"db1","node":"node2","generation":"9f3a2b1c4d5e6f70","previous":)"
        R"("12ab34cd56ef7890","promoted":true,"forced":false,"already_promoted":false})");
  write(dir, "reply-error",
        R"({"ok":false,"error":{"code":"not found","message":"no volume 'nope'"}})");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  fs::path root = argv[1];
  protocol_seeds(root / "protocol");
  handshake_seeds(root / "handshake");
  control_seeds(root / "control");
  return failed ? 1 : 0;
}

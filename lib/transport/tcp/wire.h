// Frame encoding of the tcp transport (see the format in tcp_transport.h).
#pragma once

#include <array>
#include <cstdint>
#include <cstring>

namespace pmirror::transport::tcp {

enum class FrameType : uint8_t {
  kHello = 1,
  kWrite = 2,
  kReadReq = 3,
  kReadResp = 4,
  kSend = 5,
  kError = 6,
};

inline constexpr uint32_t kFrameMagic = 0x46544d50;  // "PMTF" little-endian
inline constexpr size_t kHeaderSize = 40;
inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr uint32_t kHelloPayloadSize = 16;
inline constexpr uint32_t kMaxErrorText = 1024;
// Largest single Write/Read, as ibv max_msg_sz on common HCAs (2 GiB).
inline constexpr uint64_t kMaxTransfer = uint64_t{1} << 31;

struct FrameHeader {
  FrameType type{};
  uint8_t opcode = 0;  // Opcode of the refused request (ERROR)
  uint16_t errc = 0;   // Errc (ERROR)
  uint32_t rkey = 0;
  uint64_t seq = 0;    // sender's sequence number of the request
  uint64_t wr_id = 0;  // the initiator's wr_id (echoed in ERROR, for reporting)
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t magic = kFrameMagic;
};

using HeaderBytes = std::array<uint8_t, kHeaderSize>;

namespace detail {
template <typename T>
inline void put(uint8_t* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
template <typename T>
inline T get(const uint8_t* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(p[i]) << (8 * i));
  return v;
}
}  // namespace detail

inline void encode(const FrameHeader& h, uint8_t* p) {
  p[0] = static_cast<uint8_t>(h.type);
  p[1] = h.opcode;
  detail::put<uint16_t>(p + 2, h.errc);
  detail::put<uint32_t>(p + 4, h.rkey);
  detail::put<uint64_t>(p + 8, h.seq);
  detail::put<uint64_t>(p + 16, h.wr_id);
  detail::put<uint64_t>(p + 24, h.addr);
  detail::put<uint32_t>(p + 32, h.length);
  detail::put<uint32_t>(p + 36, h.magic);
}

inline FrameHeader decode(const uint8_t* p) {
  FrameHeader h;
  h.type = static_cast<FrameType>(p[0]);
  h.opcode = p[1];
  h.errc = detail::get<uint16_t>(p + 2);
  h.rkey = detail::get<uint32_t>(p + 4);
  h.seq = detail::get<uint64_t>(p + 8);
  h.wr_id = detail::get<uint64_t>(p + 16);
  h.addr = detail::get<uint64_t>(p + 24);
  h.length = detail::get<uint32_t>(p + 32);
  h.magic = detail::get<uint32_t>(p + 36);
  return h;
}

struct Hello {
  uint32_t version = kProtocolVersion;
  uint32_t message_size = 0;
  uint32_t recv_slots = 0;
  uint32_t max_outstanding = 0;
};

inline void encode(const Hello& h, uint8_t* p) {
  detail::put<uint32_t>(p, h.version);
  detail::put<uint32_t>(p + 4, h.message_size);
  detail::put<uint32_t>(p + 8, h.recv_slots);
  detail::put<uint32_t>(p + 12, h.max_outstanding);
}

inline Hello decode_hello(const uint8_t* p) {
  Hello h;
  h.version = detail::get<uint32_t>(p);
  h.message_size = detail::get<uint32_t>(p + 4);
  h.recv_slots = detail::get<uint32_t>(p + 8);
  h.max_outstanding = detail::get<uint32_t>(p + 12);
  return h;
}

}  // namespace pmirror::transport::tcp

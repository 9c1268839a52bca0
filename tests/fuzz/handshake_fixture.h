// What the handshake harness's target serves and its initiator is, shared
// with make_seeds.cpp so that the seeds carry valid MACs and reach past
// authentication.
#pragma once

#include <string_view>

#include "auth/auth.h"

namespace pmirror::fuzz {

inline constexpr std::string_view kVolume = "db0";
inline constexpr std::string_view kIdentity = "node1";
inline constexpr std::string_view kSecret = "fuzzing-secret-0123456789abcdef";
inline constexpr auth::Nonce kServerNonce = {0x53, 0x53, 0x53, 0x53, 1,  2,  3,  4,  5,  6,  7,
                                             8,    9,    10,   11,   12, 13, 14, 15, 16, 17, 18,
                                             19,   20,   21,   22,   23, 24, 25, 26, 27, 28};
inline constexpr auth::Nonce kClientNonce = {0x43, 0x43, 0x43, 0x43, 1,  2,  3,  4,  5,  6,  7,
                                             8,    9,    10,   11,   12, 13, 14, 15, 16, 17, 18,
                                             19,   20,   21,   22,   23, 24, 25, 26, 27, 28};

}  // namespace pmirror::fuzz

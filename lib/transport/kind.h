// The transports pmirror knows: their kinds and names, which ones this build
// has, and the one parser of a transport name. Only the standard library and
// <pmirror/status.hpp>, so that lib/config parses `transport:` without
// linking the transport library (or rdma-core).
//
// This file is also where the build's transports are registered
// (register_built_transports, at the end): adding a transport is a row in
// kKinds and a line there, plus its folder in lib/transport/CMakeLists.txt
// (docs/architecture.md, "Adding a transport").
#pragma once

#include <array>
#include <cstdint>
#include <pmirror/status.hpp>
#include <string>
#include <string_view>

// Set to 0 or 1 by the build for every target that can see this header
// (CMake target pmirror_transport_kind, from the PMIRROR_RDMA option).
#ifndef PMIRROR_TRANSPORT_RDMA
#error "transport/kind.h needs PMIRROR_TRANSPORT_RDMA: link the target pmirror_transport_kind"
#endif

namespace pmirror::transport {

enum class Kind : uint8_t { kTcp, kRdma, kFake };

// How a poll() with a timeout waits for completions.
//   kEvent     sleep on the completion channel (rdma) or condition (tcp) at
//              once: no CPU while waiting, a wake-up's latency per wait.
//   kAdaptive  spin on the completion queue first, for about twice as long
//              as recent waits took (at most 1 ms; waits longer than that
//              spin 10 us), then sleep: latency of busy polling while
//              completions come quickly, little CPU when they do not.
//   kBusy      spin until the timeout: the lowest latency, one core per
//              waiting thread.
enum class PollMode : uint8_t { kEvent, kAdaptive, kBusy };
// (Here rather than in transport.h: a configuration names it.)

constexpr std::string_view poll_mode_name(PollMode mode) {
  switch (mode) {
    case PollMode::kEvent:
      return "event";
    case PollMode::kAdaptive:
      return "adaptive";
    case PollMode::kBusy:
      return "busy";
  }
  return "unknown";
}

// "event" | "adaptive" | "busy"; kInvalidArgument otherwise.
inline Result<PollMode> parse_poll_mode(std::string_view name) {
  for (PollMode mode : {PollMode::kEvent, PollMode::kAdaptive, PollMode::kBusy}) {
    if (name == poll_mode_name(mode)) return mode;
  }
  return Status(Errc::kInvalidArgument,
                "poll mode '" + std::string(name) + "' is not one of busy, adaptive, event");
}

struct KindInfo {
  Kind kind;
  std::string_view name;  // as cluster files, ReplicaSpec::transport and logs write it
  // A configuration (cluster file, C API, command line) may name it. The
  // fake fabric may not: tests register it while they install one.
  bool configurable;
  bool built;                     // compiled into this build
  std::string_view build_option;  // the CMake option that leaves it out
  // Who registers it when not the process at start (register_built_transports).
  std::string_view registered_by;
};

inline constexpr std::array<KindInfo, 3> kKinds{{
    {Kind::kTcp, "tcp", true, true, "", ""},
    {Kind::kRdma, "rdma", true, PMIRROR_TRANSPORT_RDMA != 0, "PMIRROR_RDMA", ""},
    {Kind::kFake, "fake", false, true, "",
     "a test, while it installs a FakeFabric (transport::fake::install_fabric or ScopedFabric)"},
}};

constexpr const KindInfo& kind_info(Kind kind) {
  for (const KindInfo& info : kKinds) {
    if (info.kind == kind) return info;
  }
  return kKinds[0];  // unreachable: every enumerator has a row
}

constexpr std::string_view kind_name(Kind kind) { return kind_info(kind).name; }

// "tcp, rdma": the names a configuration may use, for messages.
inline std::string configurable_kind_names() {
  std::string names;
  for (const KindInfo& info : kKinds) {
    if (!info.configurable) continue;
    if (!names.empty()) names += ", ";
    names += info.name;
  }
  return names;
}

// Why `info`'s transport cannot be used in this build (empty when it can).
inline std::string not_built_reason(const KindInfo& info) {
  if (info.built) return {};
  return "this build of pmirror has no " + std::string(info.name) + " transport (built with " +
         std::string(info.build_option) + "=OFF)";
}

// The kind a configuration names: "tcp" or "rdma". kInvalidArgument for
// any other name ("fake" included); kUnsupported for a kind this build left
// out (rdma with PMIRROR_RDMA=OFF).
inline Result<Kind> parse_kind(std::string_view text) {
  for (const KindInfo& info : kKinds) {
    if (!info.configurable || info.name != text) continue;
    if (!info.built) return Status(Errc::kUnsupported, not_built_reason(info));
    return info.kind;
  }
  return Status(Errc::kInvalidArgument,
                "'" + std::string(text) + "' is not one of " + configurable_kind_names());
}

// ---- registration of the transports built in --------------------------
// Each implementation adds its Provider (registry.h) to the registry in its
// register function; registry.cpp calls this once, when the process first
// uses a transport. No static initialisers: a static library keeps them.
class Registry;
void register_tcp(Registry& registry);  // tcp/tcp_transport.cpp
#if PMIRROR_TRANSPORT_RDMA
void register_rdma(Registry& registry);  // rdma/rdma_transport.cpp
#endif

inline void register_built_transports(Registry& registry) {
  register_tcp(registry);
#if PMIRROR_TRANSPORT_RDMA
  register_rdma(registry);
#endif
}

}  // namespace pmirror::transport

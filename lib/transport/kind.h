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

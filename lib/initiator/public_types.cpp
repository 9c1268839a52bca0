// The free functions of the public C++ API (include/pmirror/pmirror.hpp)
// that belong to no object.
#include <pmirror/pmirror.hpp>

namespace pmirror {

std::string_view replica_state_name(ReplicaState state) {
  switch (state) {
    case ReplicaState::kConnected:
      return "connected";
    case ReplicaState::kFailed:
      return "failed";
    case ReplicaState::kClosed:
      return "closed";
  }
  return "unknown";
}

}  // namespace pmirror

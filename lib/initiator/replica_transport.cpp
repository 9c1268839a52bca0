#include "initiator/initiator.h"

namespace pmirror::initiator {

// The registry decides: "tcp"/"rdma" as a configuration names them, "fake"
// only while a test has registered it (transport::kind_for_name).
Result<transport::Kind> replica_transport(std::string_view name) {
  return transport::kind_for_name(name);
}

transport::PollMode transport_poll_mode(PollMode mode) {
  switch (mode) {
    case PollMode::kEvent:
      return transport::PollMode::kEvent;
    case PollMode::kBusy:
      return transport::PollMode::kBusy;
    case PollMode::kAdaptive:
      break;
  }
  return transport::PollMode::kAdaptive;
}

}  // namespace pmirror::initiator

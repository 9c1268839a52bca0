// libpmirror's C++ API as the library's own code and the in-tree tests name
// it. The API itself is public: include/pmirror/pmirror.hpp (namespace
// pmirror); applications include that, never this.
#pragma once

#include <memory>
#include <pmirror/pmirror.hpp>
#include <string>
#include <string_view>

#include "common/status.h"
#include "transport/transport.h"

namespace pmirror::initiator {

using ::pmirror::MethodPreference;
using ::pmirror::PollMode;
using ::pmirror::replica_state_name;
using ::pmirror::ReplicaSpec;
using ::pmirror::ReplicaState;
using ::pmirror::ReplicaStatus;
using ::pmirror::VerifyPeerResult;
using ::pmirror::Volume;
using ::pmirror::VolumeOptions;

// The transport a ReplicaSpec names: "tcp" or "rdma". "fake" (the
// in-process fake fabric of the tests) resolves only while a test has
// installed a FakeFabric in this process (transport/fake/fake_transport.h),
// which nothing in the public API can do; so through libpmirror's API a
// replica reaches tcp or rdma only. kInvalidArgument otherwise.
Result<transport::Kind> replica_transport(std::string_view name);
// The seam's poll mode for the public one.
transport::PollMode transport_poll_mode(PollMode mode);

// What opening a volume takes beyond the public VolumeOptions: the cluster
// file's plan fills it (Volume::open_from_config); in-tree tests set it by
// hand. Volume::open(options) is open_volume_with(options, {}).
struct OpenContext {
  // Non-empty: the volume needs this node's pmirror-promoter to hold its
  // lease (InitiatorPlan::lease_file, docs/failover.md section 2). Opening
  // fails with kLeaseLost without the file or once its deadline passed,
  // and so does every persist once the deadline passed.
  std::string lease_file;
  std::string node;  // this node's name: the lease file's must match (empty: any)
};
Result<std::unique_ptr<Volume>> open_volume_with(const VolumeOptions& options,
                                                 const OpenContext& context);

}  // namespace pmirror::initiator

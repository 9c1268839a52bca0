// Automatic failover with etcd (docs/failover.md, section 2): the promoter
// that pmirror-promoter runs on every node that may be primary.
//
// pmirror does not elect: etcd decides, through one key per volume
// (<prefix>/<cluster>/volumes/<volume>/leader) created only if absent and
// attached to the promoter's lease (one lease per node). The node whose
// promoter holds the key is the volume's primary: it renews the lease every
// `renew`, publishes the lease's deadline to libpmirror through the lease
// file (lease_file.h: persists fail after it) and keeps the application
// running through the volume's hook. The other nodes' promoters poll the
// key; when it is gone (the lease expired or was handed over), a node whose
// copy is consistent and not behind any copy it can see takes the key,
// promotes its copy through pmirrord (which fences the others), publishes
// its deadline and starts the hook.
//
//   auto promoter = Promoter::create({.cluster = cluster, .node = "b"});
//   promoter.value()->run(stop_token);   // until stop: then hands over
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stop_token>
#include <string>

#include "common/status.h"
#include "config/config.h"

namespace pmirror::failover {

struct PromoterOptions {
  config::ClusterConfig cluster;  // failover.engine must be etcd
  std::string node;               // this node
  // pmirrord's control socket on this node; empty: the node's
  // daemon.control_socket. The application's (libpmirror's) control
  // sockets are looked for where libpmirror puts them
  // (control::runtime_dir(): $PMIRROR_RUNTIME_DIR, else /run/pmirror).
  std::string pmirrord_socket;
  // Called with every lease change (docs/control.md, events): {"time",
  // "process":"pmirror-promoter","node","volume","event","message"}, from
  // the promoter's thread. Empty: none.
  std::function<void(const nlohmann::json&)> on_event;
};

// The keys of one volume in etcd.
struct VolumeKeys {
  std::string leader;           // who holds the volume: {"node","generation","since_unix_ms"}
  std::string last_generation;  // the primary's last generation (no lease: outlives it)
  std::string copies;           // prefix of copies/<node>: each copy's generations
};
VolumeKeys volume_keys(const config::EtcdSettings& etcd, const std::string& cluster,
                       const std::string& volume);

class Promoter {
 public:
  static Result<std::unique_ptr<Promoter>> create(PromoterOptions options);
  ~Promoter();
  Promoter(const Promoter&) = delete;
  Promoter& operator=(const Promoter&) = delete;

  // Serves until `stop` is requested, then hands over: stops the hooks of
  // the volumes it holds, withdraws their lease files and revokes its
  // lease, so that another node takes over at once instead of after ttl.
  // Returns an error only if it could not start (etcd never reached is not
  // one: it keeps trying, and holds nothing meanwhile).
  Status run(std::stop_token stop);

  // For `pmirrorctl status`, pmirrord's metrics and the tests: {"node",
  // "lease":{"id","deadline_in_ms","error","renewals","renewal_failures"},
  // "volumes":[{"name","holder","held","since","refused":reason,"takeovers",
  // "losses","application":{"hook","pid","ended","last_end"}}]} (counters
  // since the promoter started; pid: a start_command's process group).
  nlohmann::json status() const;

 private:
  struct Impl;
  explicit Promoter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pmirror::failover

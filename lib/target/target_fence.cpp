// The promoted node's side of a fence (docs/failover.md, section 1): after
// `promote`, this node's pmirrord tells every other node of the volume that
// the copy promoted here is now the only primary, and collects their
// FenceAcks. Each fence is one short session: Hello (kHelloFence, the new
// generation in lineage.current), Challenge, AuthResponse, FenceAck.
#include <thread>

#include "auth/auth.h"
#include "common/log.h"
#include "session/session.h"
#include "target/target_internal.h"

namespace pmirror::target {

Result<uint32_t> send_fence(const config::NodeConfig& target, const std::string& volume,
                            const std::string& self, const std::string& secret, uint64_t generation,
                            std::chrono::milliseconds connect_timeout,
                            std::chrono::milliseconds timeout) {
  transport::ConnectionOptions options;
  options.connect_timeout = connect_timeout;
  options.poll_mode = transport::PollMode::kEvent;  // one short exchange: nothing to spin for
  PMIRROR_ASSIGN_OR_RETURN(
      auto connection, transport::connect(target.transport, target.address, target.port, options));
  session::Messenger messenger(*connection);
  auto close = [&](Status why) {
    connection->shutdown();
    return why;
  };
  auto nonce = auth::random_nonce();
  if (!nonce.ok()) return close(nonce.status());
  protocol::Hello hello;
  hello.volume = volume;
  hello.identity = self;
  hello.client_nonce = *nonce;
  hello.flags = protocol::kHelloFence | protocol::kHelloLineage;
  hello.lineage.current = generation;
  if (Status sent = messenger.send(hello); !sent.ok()) return close(sent);
  auto challenge = messenger.receive_as<protocol::Challenge>(timeout);
  if (!challenge.ok()) return close(challenge.status());
  const auth::SessionContext context{volume, self, hello.client_nonce, challenge->server_nonce};
  if (Status sent = messenger.send(protocol::AuthResponse{auth::initiator_proof(secret, context)});
      !sent.ok()) {
    return close(sent);
  }
  auto ack = messenger.receive_as<protocol::FenceAck>(timeout);
  if (!ack.ok()) return close(ack.status());
  if (!auth::macs_equal(ack->mac, auth::target_proof(secret, context))) {
    return close(
        Status(Errc::kPermissionDenied, "the target could not prove it knows the volume's secret"));
  }
  if (ack->generation != generation) {
    return close(Status(Errc::kProtocolError, "FenceAck for generation " + hex16(ack->generation) +
                                                  ", expected " + hex16(generation)));
  }
  connection->shutdown();
  return ack->sessions_ended;
}

std::vector<FenceOutcome> fence_peers(const config::ClusterConfig& cluster,
                                      const std::vector<std::string>& peers,
                                      const std::string& volume, const std::string& self,
                                      const std::string& secret, uint64_t generation,
                                      std::chrono::milliseconds connect_timeout,
                                      std::chrono::milliseconds timeout) {
  std::vector<FenceOutcome> outcomes;
  for (const std::string& peer : peers) {
    if (peer != self) outcomes.push_back(FenceOutcome{.node = peer});
  }
  // In parallel: an unreachable node costs its timeout once, not once per node.
  std::vector<std::thread> threads;
  for (FenceOutcome& outcome : outcomes) {
    threads.emplace_back([&, &outcome = outcome] {
      const std::string& peer = outcome.node;
      const config::NodeConfig* node = cluster.find_node(peer);
      Result<uint32_t> fenced =
          node == nullptr
              ? Result<uint32_t>(Status(Errc::kNotFound, "not a node of the cluster file"))
              : send_fence(*node, volume, self, secret, generation, connect_timeout, timeout);
      if (fenced.ok()) {
        outcome.fenced = true;
        outcome.sessions_ended = *fenced;
        log::warn("volume {}: fenced on node {} at generation {}{}", volume, peer,
                  hex16(generation), *fenced > 0 ? ": its primary's session was ended" : "");
      } else {
        outcome.error = fenced.status().to_string();
        log::error(
            "volume {}: NOT fenced on node {}: {}; until it is, that copy may still take "
            "the old primary's writes (run `pmirrorctl promote {}` again to retry)",
            volume, peer, outcome.error, volume);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return outcomes;
}

}  // namespace pmirror::target

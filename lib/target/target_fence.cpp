// The promoted node's side of a fence (docs/failover.md, section 1): after
// `promote`, this node's pmirrord tells every other node of the volume that
// the copy promoted here is now the only primary, and collects their
// FenceAcks. Each fence is one short session: Hello (kHelloFence, the new
// generation in lineage.current), Challenge, AuthResponse, FenceAck.
#include <algorithm>
#include <thread>

#include "auth/auth.h"
#include "common/log.h"
#include "session/session.h"
#include "target/target_internal.h"

namespace pmirror::target {

using namespace std::chrono_literals;

namespace {
// How long a fence that failed waits before its next attempt: doubling.
constexpr std::chrono::milliseconds kFirstRetry = 1s;
constexpr std::chrono::milliseconds kLastRetry = 10s;
}  // namespace

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

// One round's outcomes, shared by its attempts and the promote() that waits.
struct Fencer::Progress {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<FenceOutcome> outcomes;  // guarded by mutex
};

std::vector<FenceOutcome> Fencer::fence(const Round& round,
                                        std::optional<std::chrono::milliseconds> wait) {
  auto progress = std::make_shared<Progress>();
  for (const std::string& peer : round.peers) {
    if (peer != round.self)
      progress->outcomes.push_back(FenceOutcome{.node = peer, .pending = true});
  }
  uint64_t number = 0;
  {
    std::lock_guard lock(mutex_);
    number = ++rounds_;
    {
      std::lock_guard volume_lock(round.volume->mutex);
      round.volume->fence_round = number;
      round.volume->last_fences = progress->outcomes;
      round.volume->last_fences_at = std::chrono::system_clock::now();
    }
    std::erase_if(jobs_, [](Job& job) {
      if (!job.done->load()) return false;
      job.thread.join();
      return true;
    });
    for (size_t i = 0; i < progress->outcomes.size(); ++i) {
      auto done = std::make_shared<std::atomic<bool>>(false);
      try {
        jobs_.push_back(Job{std::thread([this, round, progress, i, done, number] {
                              attempt_until_landed(round, progress, i, number);
                              done->store(true);
                            }),
                            done});
      } catch (const std::system_error& e) {
        std::lock_guard progress_lock(progress->mutex);
        FenceOutcome& outcome = progress->outcomes[i];
        outcome.pending = false;
        outcome.error = std::string("cannot start a thread to fence it: ") + e.what() +
                        " (run `pmirrorctl promote` again)";
      }
    }
  }
  std::unique_lock lock(progress->mutex);
  auto answered = [&] {
    return std::all_of(progress->outcomes.begin(), progress->outcomes.end(),
                       [](const FenceOutcome& o) { return o.attempts > 0 || !o.pending; });
  };
  if (wait) {
    progress->changed.wait_for(lock, *wait, answered);
  } else {
    progress->changed.wait(lock, answered);
  }
  for (FenceOutcome& outcome : progress->outcomes) {
    if (outcome.pending && outcome.attempts == 0) {
      outcome.error =
          "no answer within " + std::to_string(wait.value_or(0ms).count()) + " ms; still trying";
    }
  }
  // Published with the round's lock held, as each attempt publishes: status
  // never shows an older state after a newer one.
  std::lock_guard volume_lock(round.volume->mutex);
  if (round.volume->fence_round == number) round.volume->last_fences = progress->outcomes;
  return progress->outcomes;
}

void Fencer::attempt_until_landed(const Round& round, const std::shared_ptr<Progress>& progress,
                                  size_t index, uint64_t number) {
  ServedVolume& volume = *round.volume;
  const std::string& name = volume.config.name;
  std::string peer;
  {
    std::lock_guard lock(progress->mutex);
    peer = progress->outcomes[index].node;
  }
  const config::NodeConfig* node = cluster_.find_node(peer);
  std::chrono::milliseconds pause = kFirstRetry;
  for (uint32_t attempt = 1;; ++attempt) {
    Result<uint32_t> fenced =
        node == nullptr
            ? Result<uint32_t>(Status(Errc::kNotFound, "not a node of the cluster file"))
            : send_fence(*node, name, round.self, round.secret, round.generation,
                         round.connect_timeout, round.timeout);
    // A node the cluster file does not name can never be reached: no retry.
    const bool retry = !fenced.ok() && node != nullptr;
    bool current = false;
    {
      std::lock_guard lock(progress->mutex);
      FenceOutcome& outcome = progress->outcomes[index];
      outcome.attempts = attempt;
      outcome.fenced = fenced.ok();
      outcome.pending = retry;
      outcome.sessions_ended = fenced.ok() ? *fenced : 0;
      outcome.error = fenced.ok() ? std::string() : fenced.status().to_string();
      // What status shows from now on, unless a newer promotion replaced it.
      std::lock_guard volume_lock(volume.mutex);
      current = volume.fence_round == number && !volume.removed.load();
      if (current) volume.last_fences = progress->outcomes;
    }
    progress->changed.notify_all();
    if (fenced.ok()) {
      log::warn("volume {}: fenced on node {} at generation {}{}{}", name, peer,
                hex16(round.generation), *fenced > 0 ? ": its primary's session was ended" : "",
                attempt > 1 ? " (attempt " + std::to_string(attempt) + ")" : "");
      return;
    }
    if (attempt == 1) {
      log::error(
          "volume {}: NOT fenced on node {}: {}; until it is, that copy may still take the old "
          "primary's writes (retried in the background until it lands; `pmirrorctl status {}` "
          "shows it pending)",
          name, peer, fenced.status().to_string(), name);
    } else {
      log::debug("volume {}: fence on node {}, attempt {}: {}", name, peer, attempt,
                 fenced.status().to_string());
    }
    if (!retry || !current || !sleep(pause)) return;
    pause = std::min(pause * 2, kLastRetry);
  }
}

void abandon_fences(ServedVolume& volume, const std::string& why) {
  std::lock_guard lock(volume.mutex);
  if (volume.fence_round == 0) return;
  volume.fence_round = 0;
  for (FenceOutcome& outcome : volume.last_fences) {
    if (!outcome.pending) continue;
    outcome.pending = false;
    outcome.error += "; no longer retried: " + why;
    log::warn("volume {}: the fence on node {} is no longer retried: {}", volume.config.name,
              outcome.node, why);
  }
}

bool Fencer::sleep(std::chrono::milliseconds pause) {
  std::unique_lock lock(mutex_);
  return !stopped_.wait_for(lock, pause, [&] { return stopping_; });
}

void Fencer::cancel() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stopped_.notify_all();
}

void Fencer::stop() {
  cancel();
  std::vector<Job> jobs;
  {
    std::lock_guard lock(mutex_);
    jobs.swap(jobs_);
  }
  for (Job& job : jobs) job.thread.join();
}

}  // namespace pmirror::target

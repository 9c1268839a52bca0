// Shared between target.cpp (the daemon's accept loop) and
// target_session.cpp (one initiator's session).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "auth/auth.h"
#include "common/log_limit.h"
#include "config/config.h"
#include "metadata/metadata.h"
#include "region/region.h"
#include "session/session.h"
#include "state/state.h"
#include "supervisor/supervisor.h"
#include "target/serve_lock.h"
#include "target/target.h"
#include "transport/transport.h"

namespace pmirror::target {

// One initiator's session as status shows it; kept a while after it ends so
// that an operator sees who was there and why they left.
struct SessionRecord {
  SessionRecord(const std::string& volume, const std::string& peer, supervisor::EventSink sink)
      : peer(peer), state(volume, peer, supervisor::PeerState::kHandshaking, std::move(sink)) {}
  std::string peer;  // identity@address
  supervisor::PeerStateMachine state;
  std::atomic<uint64_t> persists{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> acknowledged{0};
  std::string method;  // set once connected; guarded by the volume's mutex
};

struct ServedVolume {
  // This process serves the copy, and no other pmirrord (serve_lock.h).
  // First, so that it goes last: after the mapping and the metadata pool.
  std::unique_ptr<ServeLock> serve_lock;
  config::VolumeConfig config;
  std::unique_ptr<region::Region> region;
  uint32_t methods = 0;  // protocol::PersistMethod bits this target guarantees

  std::mutex mutex;
  std::string writer;  // identity@address of the session holding the volume; guarded by mutex
  // The writer's lineage from its Hello (zero: none sent); guarded by mutex.
  protocol::Lineage writer_lineage;
  // An operator command on the copy (promote, demote) is under way: no
  // session may claim the volume meanwhile. Names the command; guarded by mutex.
  std::string admin;
  // The fences of the last promotion on this node, and when; guarded by mutex.
  std::vector<FenceOutcome> last_fences;
  std::chrono::system_clock::time_point last_fences_at{};
  // The round of fences being tried (Fencer: each promotion here starts
  // one; older rounds stop); 0: none. Guarded by mutex.
  uint64_t fence_round = 0;
  // Set by `promote --force`: the writer's session ends at once, refused
  // with kClosed and evict_reason (guarded by mutex).
  std::atomic<bool> evict{false};
  // How its sessions' threads wait (config.poll, updated in place by a
  // reload; a session takes it when it starts serving).
  std::atomic<transport::PollMode> poll{transport::PollMode::kAdaptive};
  std::string evict_reason;
  Errc evict_code = Errc::kClosed;  // what the ended session is told: kClosed, or kFenced
  // The volume's other nodes (config.peers, updated in place by a reload
  // that changes nothing else); guarded by mutex.
  std::vector<std::string> peers;
  // Who may open the volume and the secret they prove, updated in place by
  // a reload (config.allowed_peers and config.secret are the values it was
  // opened with); guarded by mutex. access_version counts the reloads that
  // changed allowed_peers: a session then checks that its identity is
  // still allowed.
  std::vector<std::string> allowed_peers;
  std::string secret;
  std::atomic<uint64_t> access_version{0};
  // Whether `identity` may open the volume now; its secret in `secret`.
  bool allows(const std::string& identity, std::string* secret_out = nullptr);
  // Whether `identity` may fence the volume (a Hello with kHelloFence): it
  // must be one of the volume's other nodes, proving the volume's secret.
  bool allows_fencer(const std::string& identity, std::string* secret_out = nullptr);
  // The writer's session has ended and is writing its last checkpoint: a
  // new writer waits for it rather than being refused (an initiator that
  // closes and reopens at once must not see "busy").
  bool writer_leaving = false;  // guarded by mutex
  std::condition_variable writer_released;

  // The writer's progress, published by its session and written to the
  // state pool by the recorder (Checkpointer) -- a pmemobj transaction costs
  // milliseconds on a plain file, far too much for every persist.
  std::atomic<uint64_t> generation{0};
  std::atomic<uint64_t> applied_sequence{0};
  std::string writer_identity;     // guarded by mutex
  std::mutex record_mutex;         // one state-pool update of this volume at a time
  uint64_t recorded_sequence = 0;  // guarded by record_mutex

  // The copy's metadata (lib/metadata), open while a session serves the
  // volume and during promote/demote, closed otherwise so that libpmirror on
  // this node can open the copy as primary. metadata_mutex serialises every
  // open and close of the pool in this process (libpmemobj locks the file:
  // two opens at once would see each other as "busy").
  std::mutex metadata_mutex;
  std::shared_ptr<metadata::CopyMetadata> metadata;  // guarded by metadata_mutex
  // What status last read from the pool while nobody held it open, and
  // when (never: the epoch); guarded by metadata_mutex.
  CopyStatus copy_status;
  std::chrono::steady_clock::time_point copy_status_at{};

  // Set when a reload removed the volume: its session ends, and the region
  // is unmapped when the last session lets go of it.
  std::atomic<bool> removed{false};
  // `pmirrorctl down`: its session was ended and new ones are refused until
  // `pmirrorctl up` (runtime only: a reload keeps it, a restart forgets it).
  std::atomic<bool> down_by_operator{false};
  // The newest sessions first, at most kKeptSessions; guarded by mutex.
  static constexpr size_t kKeptSessions = 4;
  std::deque<std::shared_ptr<SessionRecord>> sessions;

  // The connections of the sessions serving the volume now (ServingSession),
  // guarded by mutex. An idle session sleeps up to a second between looks
  // (one-sided commit sends it nothing while persists run): whatever ends
  // or changes a session from outside -- an eviction or fence, a reload, a
  // stop -- sets its flag above and then wakes them, so that it acts at once.
  std::vector<transport::Connection*> serving;
  void wake_sessions_locked() {
    for (transport::Connection* connection : serving) connection->wake();
  }
  void wake_sessions() {
    std::lock_guard lock(mutex);
    wake_sessions_locked();
  }
};

// A session's connection in ServedVolume::serving while it serves.
class ServingSession {
 public:
  ServingSession(ServedVolume& volume, transport::Connection& connection)
      : volume_(volume), connection_(&connection) {
    std::lock_guard lock(volume_.mutex);
    volume_.serving.push_back(connection_);
  }
  ~ServingSession() {
    std::lock_guard lock(volume_.mutex);
    std::erase(volume_.serving, connection_);
  }
  ServingSession(const ServingSession&) = delete;
  ServingSession& operator=(const ServingSession&) = delete;

 private:
  ServedVolume& volume_;
  transport::Connection* connection_;
};

// Releases a volume's writer claim when the session ends, however it ends.
class WriterClaim {
 public:
  WriterClaim() = default;
  ~WriterClaim() { release(); }
  void release();
  // The session is over; only its last checkpoint is left to write.
  void leaving();
  WriterClaim(const WriterClaim&) = delete;
  WriterClaim& operator=(const WriterClaim&) = delete;

  // A session's claim. false: somebody else writes, or an operator command
  // runs; `holder` says who / what.
  bool try_claim(ServedVolume& volume, const std::string& who, std::string& holder);
  // An operator command's claim (promote, demote, a fence): waits for
  // another command under way to finish, excludes new sessions, then waits
  // for the current writer (if any) to let go; all within `wait`.
  // With `evict`, the writer's session is asked to end with `evict_reason`.
  // kBusy naming the writer when it is connected and !evict, or did not let
  // go in time; kBusy naming the other command when it outlasts `wait`. The ended
  // session is refused with `evict_code`; `evicted` (if given) says whether
  // there was one.
  Status claim_for_command(ServedVolume& volume, const std::string& command, bool evict,
                           const std::string& evict_reason, std::chrono::milliseconds wait,
                           Errc evict_code = Errc::kClosed, bool* evicted = nullptr);

 private:
  ServedVolume* volume_ = nullptr;
  bool command_ = false;
};

// Why a volume that `pmirrorctl down` stopped refuses a session.
std::string down_text(const std::string& volume, const std::string& node);

// Where a volume's copy metadata lives: its `metadata:` or the default beside it.
std::string copy_metadata_path(const config::VolumeConfig& volume);
// metadata::CopyMetadata::Options for a volume's copy.
metadata::CopyMetadata::Options metadata_options(const ServedVolume& volume, bool create);
// Opens the copy's metadata; kBusy comes back naming the node and the pool
// ("... is open as primary by a process on that node ..."), other errors
// with the volume as context. Call with volume.metadata_mutex held.
Result<std::unique_ptr<metadata::CopyMetadata>> open_copy_metadata(const ServedVolume& volume,
                                                                   const std::string& node,
                                                                   bool create = true);
// 16 lower-case hex digits: how generations are shown.
std::string hex16(uint64_t value);

// The fence (docs/failover.md): tells node `target` that `volume`, promoted
// on node `self` (this one), now takes writes only from a primary that
// descends from `generation`. Returns the writer sessions it ended there.
// `connect_timeout` to reach it, `timeout` for each answer once connected.
Result<uint32_t> send_fence(const config::NodeConfig& target, const std::string& volume,
                            const std::string& self, const std::string& secret, uint64_t generation,
                            std::chrono::milliseconds connect_timeout,
                            std::chrono::milliseconds timeout);

// Stops retrying the volume's fences (a demotion): those not landed are
// shown as given up, with `why`.
void abandon_fences(ServedVolume& volume, const std::string& why);

// The fences of this node's promotions: send_fence to every other node of
// the volume, all at once, each retried in the background (1 s, doubling
// to 10 s apart) until it lands, a newer promotion here supersedes it
// (ServedVolume::fence_generation), the volume goes, or the daemon stops.
// A takeover does not wait for the node it replaces (a frozen node answers
// nothing until heartbeat_timeout): promote() waits as long as its caller
// allows and reports the rest pending; each later outcome updates the
// volume's last_fences, which status and metrics show.
class Fencer {
 public:
  struct Round {
    std::shared_ptr<ServedVolume> volume;
    std::vector<std::string> peers;  // the volume's nodes; `self` is skipped
    std::string self;
    std::string secret;
    uint64_t generation = 0;
    std::chrono::milliseconds connect_timeout{0};
    std::chrono::milliseconds timeout{0};
  };
  explicit Fencer(const config::ClusterConfig& cluster) : cluster_(cluster) {}
  ~Fencer() { stop(); }
  Fencer(const Fencer&) = delete;
  Fencer& operator=(const Fencer&) = delete;

  // Starts the round (and makes it the volume's: older rounds stop at
  // their next attempt), then waits for every node's first answer, at most
  // `wait` (none: as long as the attempts take). Returns each node's
  // outcome as it stands then.
  std::vector<FenceOutcome> fence(const Round& round,
                                  std::optional<std::chrono::milliseconds> wait);
  // Ends every retry: cancel() at once, stop() also waits for the attempts
  // under way (a node that does not answer: up to connect_timeout + timeout).
  void cancel();
  void stop();

 private:
  struct Progress;
  void attempt_until_landed(const Round& round, const std::shared_ptr<Progress>& progress,
                            size_t index, uint64_t number);
  bool sleep(std::chrono::milliseconds pause);  // false: stopping

  const config::ClusterConfig& cluster_;
  std::mutex mutex_;
  std::condition_variable stopped_;
  bool stopping_ = false;  // guarded by mutex_
  uint64_t rounds_ = 0;    // guarded by mutex_: the last round's number
  struct Job {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Job> jobs_;  // guarded by mutex_; finished ones joined by the next fence()
};

// Writes a volume's published progress to the state pool if it moved.
Status checkpoint(state::StateStore& state, ServedVolume& volume);
// Whether the volume's published progress is ahead of what is recorded.
bool checkpoint_due(ServedVolume& volume);

// How the checkpointer sleeps: checkpoint_interval while progress keeps
// coming; once a round finds nothing to record, until a session rings
// (publishes progress) or a stop, at most kIdleCheckpointWait -- so that
// a daemon whose sessions are idle or one-sided does not tick ten times a
// second for nothing.
class CheckpointBell {
 public:
  static constexpr std::chrono::milliseconds kIdleCheckpointWait{1000};
  // A session, after publishing progress: one load while the checkpointer
  // is busy or ticking.
  void ring() {
    if (!asleep_.load()) return;
    ring_always();
  }
  // A stop: wakes the checkpointer however it sleeps.
  void ring_always() {
    {
      std::lock_guard lock(mutex_);
      rung_ = true;
    }
    wake_.notify_all();
  }
  // The checkpointer, between rounds. `idle`: its last round recorded
  // nothing; `due` (asked after ring() is armed, so that progress published
  // meanwhile is not slept through) says whether some volume moved since.
  template <typename Due>
  void wait(bool idle, std::chrono::milliseconds interval, Due due) {
    std::unique_lock lock(mutex_);
    if (!idle) {
      wake_.wait_for(lock, interval, [&] { return rung_; });
    } else {
      asleep_.store(true);
      if (!due()) wake_.wait_for(lock, kIdleCheckpointWait, [&] { return rung_; });
      asleep_.store(false);
    }
    rung_ = false;
  }

 private:
  std::atomic<bool> asleep_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool rung_ = false;  // guarded by mutex_
};

// What the target counts about peers before they authenticate (the
// transport's own counts come from Listener::admission()).
struct AdmissionStats {
  std::atomic<uint64_t> unauthenticated{0};  // handshakes under way now
  std::atomic<uint64_t> timed_out{0};        // no Hello / AuthResponse in time
  std::atomic<uint64_t> authentication_failures{0};
  std::atomic<uint64_t> refused{0};  // bad first message, unknown volume, out of threads
};

// Everything a session needs from the daemon.
struct SessionContext {
  const TargetOptions& options;
  const std::string node;  // this node's name, for messages
  state::StateStore& state;
  std::function<std::shared_ptr<ServedVolume>(const std::string& name)> find_volume;
  const std::atomic<bool>& stopping;
  AdmissionStats& admission;
  CheckpointBell& checkpoint_bell;
};

// An initiator that has proven the volume's secret: what its session
// starts from. Admission has activated its connection (transport.h).
struct AdmittedPeer {
  std::unique_ptr<transport::Connection> connection;
  std::unique_ptr<session::Messenger> messenger;  // on `connection`
  std::shared_ptr<ServedVolume> volume;
  std::shared_ptr<SessionRecord> record;  // already in volume->sessions
  protocol::Hello hello;                  // volume, identity, client nonce
  auth::Nonce server_nonce{};
  std::string who;  // identity@address, for logs and status
  // The volume's secret it proved, and the access_version it was checked
  // against (a reload may change allowed_peers while the session runs).
  std::string secret;
  uint64_t access_checked = 0;
};

// Serves one authenticated initiator (on its own thread) until it leaves,
// errs, or the daemon stops: claims the volume, registers it, answers with
// the VolumeDescriptor, then the session.
void serve_session(SessionContext& context, AdmittedPeer peer);

// The handshakes of initiators not yet authenticated, all on one thread
// (the one running Target::run) and without a thread each: accepts what
// the listener has, drives every connection's Hello -> Challenge ->
// AuthResponse without blocking (poll(2) on the connections' wait_fd()s),
// ends those past handshake_timeout, and hands each authenticated peer to
// start_session. Only then does a SessionRecord exist: nothing a stranger
// sends reaches status. See docs/architecture.md, "Admission".
class Admission {
 public:
  // Starts the peer's session thread (its connection already active). Not
  // ok (out of threads): the peer is left as it was, and refused.
  using StartSession = std::function<Status(AdmittedPeer& peer)>;

  Admission(SessionContext& context, transport::Listener& listener, StartSession start_session);
  ~Admission();
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // Waits up to `timeout` for work and does it. false once the listener was
  // shut down.
  bool step(std::chrono::milliseconds timeout);
  // Drops every handshake under way (the daemon stops).
  void close_all();
  // Handshakes under way now.
  size_t under_way() const { return handshakes_.size(); }

 private:
  struct Handshake;
  enum class Outcome { kContinue, kDone };
  Outcome advance(Handshake& handshake);
  Outcome on_hello(Handshake& handshake, const protocol::Hello& hello);
  Outcome on_auth(Handshake& handshake, const protocol::AuthResponse& response);
  Outcome refuse(Handshake& handshake, Errc code, const std::string& text);
  void log_summaries();

  SessionContext& context_;
  transport::Listener& listener_;
  StartSession start_session_;
  std::vector<std::unique_ptr<Handshake>> handshakes_;
  LogLimiter refused_log_;     // refusals: unknown volume, bad message, authentication
  LogLimiter no_session_log_;  // vanished, timed out, a failed transport hello
};

// Which persistency methods a volume may promise over a transport with
// these capabilities (docs/architecture.md, "Which method").
uint32_t offered_methods(const transport::Capabilities& transport,
                         const config::VolumeConfig& volume, const region::Region& region);

}  // namespace pmirror::target

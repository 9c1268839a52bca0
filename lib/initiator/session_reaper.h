// Ends the sessions that a volume dropped, on a thread of its own, away
// from the volume mutex.
//
// Tearing a connection down is a system call that may block: rdma_cm ends
// an id by talking to its peer's connection manager, a QP in error flushes
// what it still held, a socket lingers. In CI's lab run, 50 s passed
// between a replica's failure and the end of its drop, with the volume
// mutex held all along: every persist stalled, and the healthy replica,
// hearing no heartbeat, ended its session too. A session handed over here
// holds up only itself.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace pmirror::initiator {

class Replica;

class SessionReaper {
 public:
  SessionReaper();
  SessionReaper(const SessionReaper&) = delete;
  SessionReaper& operator=(const SessionReaper&) = delete;
  // Ends every session handed over, then stops its thread.
  ~SessionReaper();

  // Takes a session that nothing uses any more (closed or failed: no
  // ledger, peer or thread refers to it) and destroys it soon. Never waits
  // for the teardown; nullptr is ignored.
  void reap(std::unique_ptr<Replica> session);
  // Waits until every session handed over so far has ended.
  void drain();
  // Sessions handed over and not yet ended (for status and tests).
  size_t pending() const;

 private:
  void run();

  mutable std::mutex mutex_;
  std::condition_variable work_;                // a session to end, or stopping
  std::condition_variable idle_;                // a teardown finished
  std::deque<std::unique_ptr<Replica>> queue_;  // guarded by mutex_
  size_t ending_ = 0;                           // guarded by mutex_: being destroyed now
  bool stopping_ = false;                       // guarded by mutex_
  std::thread thread_;                          // started by the first reap()
};

}  // namespace pmirror::initiator

// The fake fabric: semantics in fake_fabric.h and docs/transport-fake.md.
//
// Everything lives in one Hub behind one mutex: the connection ends (send
// queue, completion queue, receive slots), the registrations (by rkey), the
// tracked media (durable image + pieces of Writes not durable yet) and the
// listeners. An operation executes atomically under the mutex, so "in
// posting order, one at a time" holds by construction.
#include "transport/fake/fake_fabric.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <utility>

namespace pmirror::transport::fake {

namespace {

std::string hex(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  do {
    s.insert(s.begin(), digits[v & 0xf]);
    v >>= 4;
  } while (v != 0);
  return "0x" + s;
}

// Counts, for the calling thread, the scopes of one kind it is inside.
class ScopeDepth {
 public:
  explicit ScopeDepth(int& depth) : depth_(depth) { ++depth_; }
  ~ScopeDepth() { --depth_; }
  ScopeDepth(const ScopeDepth&) = delete;
  ScopeDepth& operator=(const ScopeDepth&) = delete;

 private:
  int& depth_;
};

// > 0 while this thread runs a PersistFn the fabric called (with its lock
// held): mark_durable() from there must neither lock nor do anything.
thread_local int t_in_persist_fn = 0;
// > 0 while this thread is inside the fabric (in_fabric_code()).
thread_local int fabric_code_depth = 0;

}  // namespace

bool in_fabric_code() { return fabric_code_depth > 0; }

namespace detail {

// Bytes a Write placed into a medium that are not durable yet. A later Write
// or flush over the same bytes trims them out, so pieces never overlap.
struct Piece {
  uint64_t seq = 0;     // posting order (fabric-wide)
  uint64_t writer = 0;  // the end whose Write placed them
  uint32_t rkey = 0;    // through which registration
  uintptr_t addr = 0;
  std::vector<std::byte> data;
};

struct Medium {
  uintptr_t base = 0;
  size_t length = 0;
  std::string node;
  std::vector<std::byte> durable;
  std::vector<Piece> pieces;  // ascending seq
  int refs = 0;               // registrations with kRemoteWrite inside it
  bool pinned = false;        // track()
};

struct Reg {
  uint64_t end = 0;
  std::byte* base = nullptr;
  size_t length = 0;
  uint32_t access = 0;
  PersistFn persist;
};

struct Wr {
  uint64_t seq = 0;
  uint64_t wr_id = 0;
  Opcode opcode = Opcode::kSend;
  bool signaled = true;
  uint32_t local_rkey = 0;
  std::byte* local = nullptr;
  size_t length = 0;
  uint32_t rkey = 0;
  uint64_t addr = 0;
  std::vector<std::byte> message;
};

struct Cqe {
  Completion completion;
  bool counted = false;  // toward max_outstanding until polled
};

struct End {
  uint64_t id = 0;
  uint64_t peer = 0;
  std::string node;
  std::string peer_address;
  ConnectionOptions options;
  bool alive = true;  // the Connection object exists
  bool broken = false;
  bool woken = false;  // wake() since the last poll()
  Status reason;
  std::deque<Wr> sq;
  std::deque<Cqe> cq;
  uint64_t outstanding = 0;
  std::byte* slots = nullptr;  // owned by the Connection object
  std::deque<uint32_t> posted;
  std::vector<bool> slot_posted;
  std::optional<uint64_t> fail_skip;
  Status fail_reason;
};

class FakeConnection;

struct ListenerState {
  ConnectionOptions options;
  uint16_t port = 0;
  std::deque<std::unique_ptr<Connection>> backlog;
  bool shut = false;
};

enum class Exec { kDone, kBlocked, kNone };

struct CrashTrigger {
  uint64_t remaining = 0;
  std::string node;  // empty: everything
  CrashOptions options;
  std::string counted_node;  // empty: every node's operations count
};

struct Hub {
  explicit Hub(const FabricOptions& o) : options(o) {}

  mutable std::mutex mu;
  std::condition_variable cv;
  FabricOptions options;
  bool manual = false;
  uint64_t next_seq = 1;
  uint64_t next_end = 1;
  uint32_t rkey_counter = 1;
  uint16_t next_port = 1;
  std::map<uint64_t, End> ends;
  std::map<uint32_t, Reg> regs;
  std::map<uintptr_t, Medium> media;
  std::map<std::string, ListenerState> listeners;
  std::optional<CrashTrigger> trigger;
  uint64_t crashes = 0;
  std::map<std::string, std::shared_future<void>> teardown_stalls;  // by peer node

  // What the Connection object of end `id` waits for when destroyed.
  std::shared_future<void> teardown_stall(uint64_t id) const {
    auto end = ends.find(id);
    if (end == ends.end()) return {};
    auto peer = ends.find(end->second.peer);
    if (peer == ends.end()) return {};
    auto stall = teardown_stalls.find(peer->second.node);
    return stall == teardown_stalls.end() ? std::shared_future<void>{} : stall->second;
  }
  uint64_t executed_total = 0;
  std::map<std::string, uint64_t> executed_by_node;

  // ---- media

  Medium* medium_containing(uintptr_t a, size_t len) {
    auto it = media.upper_bound(a);
    if (it == media.begin()) return nullptr;
    --it;
    Medium& m = it->second;
    if (a >= m.base && a - m.base <= m.length && len <= m.length - (a - m.base)) return &m;
    return nullptr;
  }

  // Finds or creates the medium covering [addr, addr+len), merging media it
  // overlaps. New bytes' durable image is their current content.
  Medium& attach_medium(const std::string& node, std::byte* addr, size_t len) {
    auto a = reinterpret_cast<uintptr_t>(addr);
    uintptr_t b = a + len;
    if (Medium* m = medium_containing(a, len)) return *m;
    std::vector<uintptr_t> overlapping;
    auto it = media.upper_bound(a);
    if (it != media.begin()) --it;
    for (; it != media.end() && it->first < b; ++it)
      if (it->first + it->second.length > a) overlapping.push_back(it->first);
    uintptr_t lo = a, hi = b;
    for (uintptr_t base : overlapping) {
      lo = std::min(lo, base);
      hi = std::max(hi, base + media[base].length);
    }
    Medium merged;
    merged.base = lo;
    merged.length = hi - lo;
    merged.node = node;
    merged.durable.resize(merged.length);
    // The new bytes (inside [a, b)); old media's images overwrite below.
    std::memcpy(merged.durable.data() + (a - lo), addr, len);
    for (uintptr_t base : overlapping) {
      Medium& old = media[base];
      std::memcpy(merged.durable.data() + (old.base - lo), old.durable.data(), old.length);
      for (Piece& p : old.pieces) merged.pieces.push_back(std::move(p));
      merged.refs += old.refs;
      merged.pinned = merged.pinned || old.pinned;
      merged.node = old.node;
      media.erase(base);
    }
    std::sort(merged.pieces.begin(), merged.pieces.end(),
              [](const Piece& x, const Piece& y) { return x.seq < y.seq; });
    auto [pos, inserted] = media.emplace(lo, std::move(merged));
    (void)inserted;
    return pos->second;
  }

  void release_medium(Medium& m) {
    if (m.refs == 0 && !m.pinned) media.erase(m.base);
  }

  static void trim(Medium& m, uintptr_t a, uintptr_t b) {
    std::vector<Piece> out;
    out.reserve(m.pieces.size());
    for (Piece& p : m.pieces) {
      uintptr_t pa = p.addr, pb = p.addr + p.data.size();
      if (pb <= a || pa >= b) {
        out.push_back(std::move(p));
        continue;
      }
      if (pa < a)
        out.push_back(Piece{p.seq, p.writer, p.rkey, pa,
                            std::vector<std::byte>(p.data.begin(), p.data.begin() + (a - pa))});
      if (pb > b)
        out.push_back(Piece{p.seq, p.writer, p.rkey, b,
                            std::vector<std::byte>(p.data.begin() + (b - pa), p.data.end())});
    }
    m.pieces = std::move(out);
  }

  // The addresses [a, b) of m become durable with their current content.
  static void flush(Medium& m, uintptr_t a, uintptr_t b) {
    a = std::max(a, m.base);
    b = std::min(b, m.base + m.length);
    if (a >= b) return;
    std::memcpy(m.durable.data() + (a - m.base), reinterpret_cast<const void*>(a), b - a);
    trim(m, a, b);
  }

  void persist_range(uintptr_t a, uintptr_t b) {
    for (auto& [base, m] : media)
      if (base < b && base + m.length > a) flush(m, a, b);
  }

  static void rollback(Medium& m, const CrashOptions& options, std::mt19937_64& rng) {
    auto tear_piece = [&](const Piece& p) {
      uintptr_t pa = p.addr, pb = p.addr + p.data.size();
      for (uintptr_t w = pa & ~uintptr_t{7}; w < pb; w += 8) {
        if ((rng() & 1) == 0) continue;
        uintptr_t lo = std::max(w, pa), hi = std::min(w + 8, pb);
        std::memcpy(m.durable.data() + (lo - m.base), p.data.data() + (lo - pa), hi - lo);
      }
    };
    if (options.in_placement_order) {
      std::vector<const Piece*> placed;
      for (const Piece& p : m.pieces) placed.push_back(&p);
      std::sort(placed.begin(), placed.end(),
                [](const Piece* a, const Piece* b) { return a->seq < b->seq; });
      size_t cut = placed.empty() ? 0 : static_cast<size_t>(rng() % (placed.size() + 1));
      for (size_t i = 0; i < cut; ++i) {
        const Piece& p = *placed[i];
        std::memcpy(m.durable.data() + (p.addr - m.base), p.data.data(), p.data.size());
      }
      if (cut < placed.size()) tear_piece(*placed[cut]);
    } else if (options.tear) {
      for (const Piece& p : m.pieces) {
        uintptr_t pa = p.addr, pb = p.addr + p.data.size();
        for (uintptr_t w = pa & ~uintptr_t{7}; w < pb; w += 8) {
          if ((rng() & 1) == 0) continue;
          uintptr_t lo = std::max(w, pa), hi = std::min(w + 8, pb);
          std::memcpy(m.durable.data() + (lo - m.base), p.data.data() + (lo - pa), hi - lo);
        }
      }
    }
    m.pieces.clear();
    std::memcpy(reinterpret_cast<void*>(m.base), m.durable.data(), m.length);
  }

  // ---- connection state

  void push_cqe(End& e, Completion c, bool counted) {
    e.cq.push_back(Cqe{std::move(c), counted});
    cv.notify_all();
  }

  // Breaks one end: unfinished operations, then posted receive slots,
  // complete with errors (as verbs flushes its queues).
  void fail_end(End& e, Status reason) {
    if (e.broken) return;
    e.broken = true;
    e.reason = std::move(reason);
    Errc code = e.reason.code() == Errc::kClosed ? Errc::kClosed : Errc::kConnectionError;
    Status flushed(code, "operation flushed: " + e.reason.message());
    for (Wr& w : e.sq) {
      Completion c;
      c.wr_id = w.wr_id;
      c.opcode = w.opcode;
      c.status = flushed;
      push_cqe(e, std::move(c), true);
    }
    e.sq.clear();
    for (uint32_t slot : e.posted) {
      e.slot_posted[slot] = false;
      Completion c;
      c.wr_id = slot;
      c.opcode = Opcode::kRecv;
      c.status = flushed;
      push_cqe(e, std::move(c), false);
    }
    e.posted.clear();
    cv.notify_all();
  }

  void break_pair(End& e, Status e_reason, Status peer_reason) {
    fail_end(e, std::move(e_reason));
    auto it = ends.find(e.peer);
    if (it != ends.end()) fail_end(it->second, std::move(peer_reason));
  }

  Status lost(const End& peer, const std::string& why) const {
    return Status(Errc::kConnectionError, "connection to " + peer.peer_address + " lost: " + why);
  }

  Result<Reg*> check_remote(const End& target, uint32_t rkey, uint64_t addr, size_t len,
                            uint32_t need, std::string_view op) {
    auto it = regs.find(rkey);
    if (it == regs.end() || it->second.end != target.id)
      return Status(Errc::kPermissionDenied, "remote access error: " + std::string(op) +
                                                 " with rkey " + hex(rkey) +
                                                 ", which is not registered on this connection");
    Reg& reg = it->second;
    if ((reg.access & need) == 0)
      return Status(Errc::kPermissionDenied,
                    "remote access error: " + std::string(op) +
                        (need == kRemoteWrite ? " into" : " from") + " rkey " + hex(rkey) +
                        ", which was registered without " +
                        (need == kRemoteWrite ? "kRemoteWrite" : "kRemoteRead") + " access");
    auto base = reinterpret_cast<uint64_t>(reg.base);
    if (addr < base || addr - base > reg.length || len > reg.length - (addr - base))
      return Status(Errc::kPermissionDenied,
                    "remote access error: " + std::string(op) + " of " + std::to_string(len) +
                        " bytes at " + hex(addr) + " is outside registration rkey " + hex(rkey) +
                        " [" + hex(base) + ", +" + std::to_string(reg.length) + ")");
    return &reg;
  }

  // APM: a Read executing for `reader` makes every Write it placed durable,
  // then calls the registrations' PersistFns on the merged ranges. Returns
  // the first PersistFn failure (the Read then fails, as over tcp).
  Status flush_writes_of(uint64_t reader) {
    std::map<uint32_t, std::vector<std::pair<uintptr_t, uintptr_t>>> by_rkey;
    std::vector<std::pair<Medium*, std::pair<uintptr_t, uintptr_t>>> ranges;
    for (auto& [base, m] : media)
      for (const Piece& p : m.pieces)
        if (p.writer == reader) {
          std::pair<uintptr_t, uintptr_t> r{p.addr, p.addr + p.data.size()};
          ranges.emplace_back(&m, r);
          by_rkey[p.rkey].push_back(r);
        }
    for (auto& [m, r] : ranges) flush(*m, r.first, r.second);
    Status first;
    for (auto& [rkey, rs] : by_rkey) {
      auto it = regs.find(rkey);
      if (it == regs.end() || !it->second.persist) continue;
      std::sort(rs.begin(), rs.end());
      std::vector<std::pair<uintptr_t, uintptr_t>> merged;
      for (auto& r : rs) {
        if (!merged.empty() && r.first <= merged.back().second)
          merged.back().second = std::max(merged.back().second, r.second);
        else
          merged.push_back(r);
      }
      ScopeDepth in_persist_fn(t_in_persist_fn);
      for (auto& r : merged) {
        Status persisted =
            it->second.persist(reinterpret_cast<const void*>(r.first), r.second - r.first);
        if (!persisted.ok() && first.ok()) first = std::move(persisted);
      }
    }
    return first;
  }

  bool runnable(const End& e) const {
    if (e.broken || e.sq.empty()) return false;
    if (e.sq.front().opcode != Opcode::kSend) return true;
    auto it = ends.find(e.peer);
    return it == ends.end() || it->second.broken || !it->second.posted.empty();
  }

  // Executes the operation at the head of e's send queue.
  Exec exec_head(End& e) {
    if (e.broken || e.sq.empty()) return Exec::kNone;
    if (!runnable(e)) return Exec::kBlocked;
    End& p = ends.at(e.peer);
    Wr w = std::move(e.sq.front());
    e.sq.pop_front();
    Completion c;
    c.wr_id = w.wr_id;
    c.opcode = w.opcode;

    if (e.fail_skip && *e.fail_skip == 0) {
      e.fail_skip.reset();
      c.status = e.fail_reason;
      push_cqe(e, std::move(c), true);
      break_pair(e, e.fail_reason, lost(p, e.fail_reason.message()));
      return Exec::kDone;
    }
    if (w.opcode == Opcode::kWrite || w.opcode == Opcode::kRead) {
      auto lr = regs.find(w.local_rkey);
      if (lr == regs.end() || lr->second.end != e.id) {
        Status why(Errc::kInvalidArgument, "local protection error: the local region of " +
                                               std::string(opcode_name(w.opcode)) + " wr_id " +
                                               std::to_string(w.wr_id) +
                                               " was deregistered before the operation executed");
        c.status = why;
        push_cqe(e, std::move(c), true);
        break_pair(e, why, lost(p, "the peer hit a local protection error"));
        return Exec::kDone;
      }
    }
    std::string_view op = opcode_name(w.opcode);
    switch (w.opcode) {
      case Opcode::kWrite:
      case Opcode::kRead: {
        uint32_t need = w.opcode == Opcode::kWrite ? kRemoteWrite : kRemoteRead;
        auto reg = check_remote(p, w.rkey, w.addr, w.length, need, op);
        if (!reg.ok()) {
          Status why = reg.status();
          c.status =
              Status(why.code(), "peer " + e.peer_address + " refused " + std::string(op) +
                                     " wr_id " + std::to_string(w.wr_id) + ": " + why.message());
          Status mine = c.status;
          push_cqe(e, std::move(c), true);
          break_pair(e, mine,
                     Status(why.code(), "refused a " + std::string(op) + " from peer " +
                                            p.peer_address + ": " + why.message()));
          return Exec::kDone;
        }
        auto* remote = reinterpret_cast<std::byte*>(w.addr);
        if (w.opcode == Opcode::kWrite) {
          if (w.length > 0) std::memmove(remote, w.local, w.length);
          if (Medium* m = medium_containing(w.addr, w.length); m != nullptr && w.length > 0) {
            trim(*m, w.addr, w.addr + w.length);
            m->pieces.push_back(Piece{w.seq, e.id, w.rkey, w.addr,
                                      std::vector<std::byte>(remote, remote + w.length)});
            if (((*reg)->access & kPersistEachWrite) != 0) {
              // Durable before the next operation executes (transport.h).
              flush(*m, w.addr, w.addr + w.length);
              Status persisted;
              {
                ScopeDepth in_persist_fn(t_in_persist_fn);
                persisted = (*reg)->persist(remote, w.length);
              }
              if (!persisted.ok()) {
                c.status = Status(persisted.code(), "peer " + e.peer_address + " refused " +
                                                        std::string(op) + " wr_id " +
                                                        std::to_string(w.wr_id) + ": " +
                                                        persisted.message());
                Status mine = c.status;
                push_cqe(e, std::move(c), true);
                break_pair(e, mine,
                           Status(persisted.code(), "refused a " + std::string(op) +
                                                        " from peer " + p.peer_address + ": " +
                                                        persisted.message()));
                return Exec::kDone;
              }
            }
          }
        } else {
          if (Status flushed = options.read_flushes ? flush_writes_of(e.id) : Status::Ok();
              !flushed.ok()) {
            // The flush did not make the Writes durable: the Read fails and
            // the connection breaks, as the tcp passive side refuses it.
            c.status = Status(flushed.code(),
                              "peer " + e.peer_address + " refused " + std::string(op) + " wr_id " +
                                  std::to_string(w.wr_id) + ": " + flushed.message());
            Status mine = c.status;
            push_cqe(e, std::move(c), true);
            break_pair(e, mine,
                       Status(flushed.code(), "refused a " + std::string(op) + " from peer " +
                                                  p.peer_address + ": " + flushed.message()));
            return Exec::kDone;
          }
          if (w.length > 0) std::memmove(w.local, remote, w.length);
        }
        break;
      }
      case Opcode::kSend: {
        uint32_t slot = p.posted.front();
        p.posted.pop_front();
        p.slot_posted[slot] = false;
        if (!w.message.empty())
          std::memcpy(p.slots + size_t{slot} * p.options.message_size, w.message.data(),
                      w.message.size());
        Completion r;
        r.wr_id = slot;
        r.opcode = Opcode::kRecv;
        r.byte_len = static_cast<uint32_t>(w.message.size());
        push_cqe(p, std::move(r), false);
        break;
      }
      case Opcode::kFlush:
      case Opcode::kAtomicWrite: {
        const bool flush = w.opcode == Opcode::kFlush;
        auto reg = check_remote(p, w.rkey, w.addr, w.length,
                                flush ? uint32_t{kRemoteFlush} : uint32_t{kRemoteAtomicWrite}, op);
        Status done = reg.status();
        if (done.ok() && flush) {
          persist_range(w.addr, w.addr + w.length);
          if ((*reg)->persist) {
            ScopeDepth in_persist_fn(t_in_persist_fn);
            done = (*reg)->persist(reinterpret_cast<const void*>(w.addr), w.length);
          }
        } else if (done.ok()) {
          auto* remote = reinterpret_cast<std::byte*>(w.addr);
          std::memcpy(remote, w.message.data(), sizeof(uint64_t));
          if (Medium* m = medium_containing(w.addr, sizeof(uint64_t)); m != nullptr) {
            trim(*m, w.addr, w.addr + sizeof(uint64_t));
            m->pieces.push_back(Piece{w.seq, e.id, w.rkey, w.addr,
                                      std::vector<std::byte>(remote, remote + sizeof(uint64_t))});
          }
        }
        if (!done.ok()) {
          c.status =
              Status(done.code(), "peer " + e.peer_address + " refused " + std::string(op) +
                                      " wr_id " + std::to_string(w.wr_id) + ": " + done.message());
          Status mine = c.status;
          push_cqe(e, std::move(c), true);
          break_pair(e, mine,
                     Status(done.code(), "refused a " + std::string(op) + " from peer " +
                                             p.peer_address + ": " + done.message()));
          return Exec::kDone;
        }
        break;
      }
      case Opcode::kRecv:
        break;
    }
    if (e.fail_skip) --*e.fail_skip;
    if (w.signaled) {
      push_cqe(e, std::move(c), true);
    } else {
      --e.outstanding;
    }
    count_executed(e);
    return Exec::kDone;
  }

  // An operation posted from e executed successfully: counts it, and fires
  // an armed crash_after() whose count it completes.
  void count_executed(const End& e) {
    ++executed_total;
    ++executed_by_node[e.node];
    if (!trigger || (!trigger->counted_node.empty() && trigger->counted_node != e.node)) return;
    if (trigger->remaining > 0) --trigger->remaining;
    if (trigger->remaining == 0) fire_trigger();
  }

  void fire_trigger() {
    CrashTrigger t = std::move(*trigger);
    trigger.reset();
    if (t.node.empty()) {
      crash_everything(t.options);
    } else {
      crash_node(t.node, t.options);
    }
  }

  // ---- crashes (lock held)

  void crash_node(const std::string& node, const CrashOptions& options) {
    ++crashes;
    std::string why = "node " + node + " crashed (injected)";
    for (auto& [id, e] : ends) {
      if (e.broken) continue;
      auto peer = ends.find(e.peer);
      bool hit = e.node == node || (peer != ends.end() && peer->second.node == node);
      if (!hit) continue;
      Status theirs = peer == ends.end() ? Status() : lost(peer->second, why);
      break_pair(e, lost(e, why), std::move(theirs));
    }
    std::mt19937_64 rng(options.seed);
    for (auto& [base, m] : media)
      if (m.node == node) rollback(m, options, rng);
  }

  void crash_everything(const CrashOptions& options) {
    ++crashes;
    for (auto& [id, e] : ends) {
      if (e.broken) continue;
      auto peer = ends.find(e.peer);
      Status theirs = peer == ends.end() ? Status() : lost(peer->second, "everything crashed");
      break_pair(e, lost(e, "everything crashed (injected)"), std::move(theirs));
    }
    std::mt19937_64 rng(options.seed);
    for (auto& [base, m] : media) rollback(m, options, rng);
  }

  // Immediate mode: executes everything runnable.
  void run() {
    if (manual) return;
    for (bool progress = true; progress;) {
      progress = false;
      for (auto& [id, e] : ends)
        while (exec_head(e) == Exec::kDone) progress = true;
    }
  }

  bool step_one() {
    End* best = nullptr;
    for (auto& [id, e] : ends)
      if (runnable(e) && (best == nullptr || e.sq.front().seq < best->sq.front().seq)) best = &e;
    return best != nullptr && exec_head(*best) == Exec::kDone;
  }

  Status closed_status(const End& e) const {
    return Status(Errc::kClosed,
                  "connection to " + e.peer_address + " is closed: " + e.reason.message());
  }
};

// ------------------------------------------------------------------ objects

class FakeMemoryRegion final : public MemoryRegion {
 public:
  FakeMemoryRegion(std::shared_ptr<Hub> hub, uint64_t end, std::byte* base, size_t length,
                   RemoteKey key)
      : hub_(std::move(hub)), end_(end), base_(base), length_(length), key_(key) {}
  ~FakeMemoryRegion() override {
    std::lock_guard lk(hub_->mu);
    auto it = hub_->regs.find(key_.rkey);
    if (it == hub_->regs.end()) return;
    bool remote_write = (it->second.access & kRemoteWrite) != 0;
    hub_->regs.erase(it);
    if (!remote_write) return;
    if (Medium* m = hub_->medium_containing(reinterpret_cast<uintptr_t>(base_), length_)) {
      --m->refs;
      hub_->release_medium(*m);
    }
  }
  std::byte* base() const override { return base_; }
  size_t length() const override { return length_; }
  RemoteKey remote_key() const override { return key_; }
  const Hub* hub() const { return hub_.get(); }
  uint64_t end() const { return end_; }

 private:
  std::shared_ptr<Hub> hub_;
  uint64_t end_;
  std::byte* base_;
  size_t length_;
  RemoteKey key_;
};

class FakeConnection final : public Connection {
 public:
  FakeConnection(std::shared_ptr<Hub> hub, End& end)
      : hub_(std::move(hub)),
        id_(end.id),
        options_(end.options),
        peer_address_(end.peer_address),
        slots_(std::make_unique<std::byte[]>(size_t{options_.recv_slots} *
                                             std::max<uint32_t>(options_.message_size, 1))) {
    end.slots = slots_.get();
  }

  ~FakeConnection() override {
    std::shared_future<void> stall;
    {
      std::lock_guard lk(hub_->mu);
      stall = hub_->teardown_stall(id_);
    }
    if (stall.valid()) stall.wait();
    shutdown();
    std::lock_guard lk(hub_->mu);
    End& e = hub_->ends.at(id_);
    e.alive = false;
    e.slots = nullptr;
    auto peer = hub_->ends.find(e.peer);
    if (peer == hub_->ends.end() || !peer->second.alive) {
      if (peer != hub_->ends.end()) hub_->ends.erase(peer);
      hub_->ends.erase(id_);
    }
  }

  uint64_t id() const { return id_; }
  const std::shared_ptr<Hub>& hub() const { return hub_; }

  Result<std::unique_ptr<MemoryRegion>> register_memory(void* addr, size_t len, uint32_t access,
                                                        PersistFn persist) override {
    if (addr == nullptr || len == 0)
      return Status(Errc::kInvalidArgument, "register_memory: empty region (addr " +
                                                hex(reinterpret_cast<uint64_t>(addr)) +
                                                ", length " + std::to_string(len) + ")");
    if ((access & (kRemoteFlush | kRemoteAtomicWrite)) != 0 && !hub_->options.native_persistence)
      return Status(Errc::kUnsupported,
                    "register_memory: FLUSH and ATOMIC WRITE are the fabric's verbs (rdma where "
                    "the device has them); this transport has neither");
    if ((access & ~uint32_t{kRemoteWrite | kRemoteRead | kPersistEachWrite | kRemoteFlush |
                            kRemoteAtomicWrite}) != 0)
      return Status(Errc::kInvalidArgument, "register_memory: unknown access bits " + hex(access));
    if ((access & kPersistEachWrite) != 0 && ((access & kRemoteWrite) == 0 || !persist))
      return Status(Errc::kInvalidArgument,
                    "register_memory: kPersistEachWrite needs kRemoteWrite and a persist function");
    auto* base = static_cast<std::byte*>(addr);
    std::lock_guard lk(hub_->mu);
    uint32_t rkey = 0;
    do {
      rkey = hub_->rkey_counter++ * 0x9E3779B1u;  // odd: a bijection, spreads the keys
    } while (rkey == 0 || hub_->regs.count(rkey) != 0);
    hub_->regs[rkey] = Reg{id_, base, len, access, std::move(persist)};
    if ((access & kRemoteWrite) != 0) {
      Medium& m = hub_->attach_medium(hub_->ends.at(id_).node, base, len);
      ++m.refs;
    }
    RemoteKey key{reinterpret_cast<uint64_t>(addr), rkey, len};
    return std::unique_ptr<MemoryRegion>(new FakeMemoryRegion(hub_, id_, base, len, key));
  }

  Status post_write(const MemoryRegion& local, size_t local_offset, size_t len,
                    const RemoteKey& remote, uint64_t remote_offset, uint64_t wr_id,
                    bool signaled) override {
    ScopeDepth fabric_code(fabric_code_depth);
    PMIRROR_ASSIGN_OR_RETURN(auto* mr, check_local(local, local_offset, len, "post_write"));
    Wr w;
    w.wr_id = wr_id;
    w.opcode = Opcode::kWrite;
    w.signaled = signaled;
    w.local_rkey = mr->remote_key().rkey;
    w.local = mr->base() + local_offset;
    w.length = len;
    w.rkey = remote.rkey;
    w.addr = remote.address + remote_offset;
    return post(std::move(w));
  }

  Status post_read(const MemoryRegion& local, size_t local_offset, size_t len,
                   const RemoteKey& remote, uint64_t remote_offset, uint64_t wr_id) override {
    ScopeDepth fabric_code(fabric_code_depth);
    PMIRROR_ASSIGN_OR_RETURN(auto* mr, check_local(local, local_offset, len, "post_read"));
    Wr w;
    w.wr_id = wr_id;
    w.opcode = Opcode::kRead;
    w.local_rkey = mr->remote_key().rkey;
    w.local = mr->base() + local_offset;
    w.length = len;
    w.rkey = remote.rkey;
    w.addr = remote.address + remote_offset;
    return post(std::move(w));
  }

  FabricPersistence fabric_persistence() const override {
    FabricPersistence f;
    if (!hub_->options.native_persistence) return f;
    f.flush_global = f.flush_persistent = f.atomic_write = true;
    f.verbs_api = f.can_post_flush = f.can_post_atomic_write = true;
    return f;
  }

  // With native persistence: FLUSH and ATOMIC WRITE queue as operations of
  // their own; everything else as the single posts (the seam's fallback).
  Result<size_t> post_list(std::span<const WorkRequest> requests) override {
    if (!hub_->options.native_persistence) return Connection::post_list(requests);
    size_t posted = 0;
    for (const WorkRequest& request : requests) {
      Status status;
      if (request.opcode == Opcode::kFlush || request.opcode == Opcode::kAtomicWrite) {
        ScopeDepth fabric_code(fabric_code_depth);
        Wr w;
        w.wr_id = request.wr_id;
        w.opcode = request.opcode;
        w.rkey = request.remote.rkey;
        w.addr = request.remote.address + request.remote_offset;
        if (request.opcode == Opcode::kFlush) {
          w.signaled = request.signaled;
          w.length = request.length;
        } else if (w.addr % sizeof(uint64_t) != 0) {
          return Status(Errc::kInvalidArgument,
                        "post_list: ATOMIC WRITE to an address that is not 8-byte aligned");
        } else {
          w.length = sizeof(uint64_t);
          w.message.resize(sizeof(uint64_t));
          std::memcpy(w.message.data(), &request.value, sizeof(uint64_t));
        }
        status = post(std::move(w));
      } else {
        PMIRROR_ASSIGN_OR_RETURN(size_t one, Connection::post_list({&request, 1}));
        if (one == 0) return posted;
        ++posted;
        continue;
      }
      if (status.code() == Errc::kResourceExhausted) return posted;
      PMIRROR_RETURN_IF_ERROR(status);
      ++posted;
    }
    return posted;
  }

  Status post_send(std::span<const std::byte> message, uint64_t wr_id) override {
    ScopeDepth fabric_code(fabric_code_depth);
    if (message.size() > options_.message_size)
      return Status(Errc::kInvalidArgument,
                    "post_send: message of " + std::to_string(message.size()) +
                        " bytes exceeds message_size " + std::to_string(options_.message_size));
    Wr w;
    w.wr_id = wr_id;
    w.opcode = Opcode::kSend;
    w.length = message.size();
    w.message.assign(message.begin(), message.end());
    return post(std::move(w));
  }

  Result<size_t> poll(std::span<Completion> out, std::chrono::milliseconds timeout) override {
    ScopeDepth fabric_code(fabric_code_depth);
    std::unique_lock lk(hub_->mu);
    End& e = hub_->ends.at(id_);
    if (e.cq.empty() && !e.broken && !e.woken && timeout.count() > 0 && !out.empty())
      hub_->cv.wait_for(lk, timeout, [&] { return !e.cq.empty() || e.broken || e.woken; });
    e.woken = false;
    size_t n = 0;
    while (n < out.size() && !e.cq.empty()) {
      Cqe& c = e.cq.front();
      out[n++] = std::move(c.completion);
      if (c.counted) --e.outstanding;
      e.cq.pop_front();
    }
    if (n == 0 && e.broken && !out.empty()) return hub_->closed_status(e);
    return n;
  }

  std::span<const std::byte> recv_data(uint32_t slot, uint32_t byte_len) const override {
    if (slot >= options_.recv_slots) return {};
    return {slots_.get() + size_t{slot} * options_.message_size,
            std::min(byte_len, options_.message_size)};
  }

  Status repost_recv(uint32_t slot) override {
    ScopeDepth fabric_code(fabric_code_depth);
    std::lock_guard lk(hub_->mu);
    End& e = hub_->ends.at(id_);
    if (slot >= options_.recv_slots)
      return Status(Errc::kInvalidArgument, "repost_recv: slot " + std::to_string(slot) +
                                                " out of range (recv_slots " +
                                                std::to_string(options_.recv_slots) + ")");
    if (e.broken) return hub_->closed_status(e);
    if (e.slot_posted[slot])
      return Status(Errc::kInvalidArgument,
                    "repost_recv: slot " + std::to_string(slot) + " is already posted");
    e.slot_posted[slot] = true;
    e.posted.push_back(slot);
    hub_->run();
    return Status::Ok();
  }

  void shutdown() override {
    std::lock_guard lk(hub_->mu);
    End& e = hub_->ends.at(id_);
    if (e.broken) return;
    Status mine(Errc::kClosed, "connection to " + peer_address_ + " was shut down locally");
    auto peer = hub_->ends.find(e.peer);
    Status theirs = peer == hub_->ends.end()
                        ? Status()
                        : hub_->lost(peer->second, "the peer closed the connection");
    hub_->break_pair(e, std::move(mine), std::move(theirs));
  }

  void wake() override {
    std::lock_guard lk(hub_->mu);
    hub_->ends.at(id_).woken = true;
    hub_->cv.notify_all();
  }

  const ConnectionOptions& options() const override { return options_; }
  std::string peer_address() const override { return peer_address_; }

 private:
  Result<const FakeMemoryRegion*> check_local(const MemoryRegion& local, size_t offset, size_t len,
                                              std::string_view op) const {
    auto* mr = dynamic_cast<const FakeMemoryRegion*>(&local);
    if (mr == nullptr || mr->hub() != hub_.get() || mr->end() != id_)
      return Status(Errc::kInvalidArgument,
                    std::string(op) + ": the local region is not registered on this connection");
    if (offset > mr->length() || len > mr->length() - offset)
      return Status(Errc::kInvalidArgument,
                    std::string(op) + ": local range [" + std::to_string(offset) + ", +" +
                        std::to_string(len) + ") exceeds the local region (" +
                        std::to_string(mr->length()) + " bytes)");
    if (len > UINT32_MAX)
      return Status(Errc::kInvalidArgument,
                    std::string(op) + ": " + std::to_string(len) + " bytes exceed 4 GiB - 1");
    return mr;
  }

  Status post(Wr w) {
    std::lock_guard lk(hub_->mu);
    End& e = hub_->ends.at(id_);
    if (e.broken) return hub_->closed_status(e);
    if (e.outstanding >= options_.max_outstanding)
      return Status(Errc::kResourceExhausted, "send queue to " + peer_address_ +
                                                  " is full: " + std::to_string(e.outstanding) +
                                                  " operations outstanding (max_outstanding " +
                                                  std::to_string(options_.max_outstanding) +
                                                  "); poll completions before posting more");
    w.seq = hub_->next_seq++;
    ++e.outstanding;
    e.sq.push_back(std::move(w));
    hub_->run();
    return Status::Ok();
  }

  std::shared_ptr<Hub> hub_;
  uint64_t id_;
  ConnectionOptions options_;
  std::string peer_address_;
  std::unique_ptr<std::byte[]> slots_;
};

class FakeListener final : public Listener {
 public:
  FakeListener(std::shared_ptr<Hub> hub, std::string name, uint16_t port)
      : hub_(std::move(hub)), name_(std::move(name)), port_(port) {}
  ~FakeListener() override {
    shutdown();
    std::lock_guard lk(hub_->mu);
    hub_->listeners.erase(name_);
  }

  Result<std::unique_ptr<Connection>> accept(std::chrono::milliseconds timeout) override {
    std::unique_lock lk(hub_->mu);
    ListenerState& l = hub_->listeners.at(name_);
    hub_->cv.wait_for(lk, timeout, [&] { return l.shut || !l.backlog.empty(); });
    if (l.shut) return Status(Errc::kClosed, "listener fake:" + name_ + " was shut down");
    if (l.backlog.empty()) return std::unique_ptr<Connection>();
    std::unique_ptr<Connection> c = std::move(l.backlog.front());
    l.backlog.pop_front();
    return c;
  }

  uint16_t port() const override { return port_; }

  void shutdown() override {
    std::deque<std::unique_ptr<Connection>> unaccepted;
    {
      std::lock_guard lk(hub_->mu);
      ListenerState& l = hub_->listeners.at(name_);
      l.shut = true;
      unaccepted.swap(l.backlog);
      hub_->cv.notify_all();
    }
    // Destroyed without the lock: each closes its pair.
  }

 private:
  std::shared_ptr<Hub> hub_;
  std::string name_;
  uint16_t port_;
};

End* end_of(Hub& hub, const Connection& connection) {
  auto* c = dynamic_cast<const FakeConnection*>(&connection);
  if (c == nullptr || c->hub().get() != &hub) return nullptr;
  auto it = hub.ends.find(c->id());
  return it == hub.ends.end() ? nullptr : &it->second;
}

}  // namespace detail

using detail::End;
using detail::Hub;
using detail::Medium;

FakeFabric::FakeFabric(const FabricOptions& options) : hub_(std::make_shared<Hub>(options)) {}

FakeFabric::~FakeFabric() = default;

std::shared_ptr<FakeFabric> FakeFabric::create(const FabricOptions& options) {
  return std::shared_ptr<FakeFabric>(new FakeFabric(options));
}

Result<std::unique_ptr<Listener>> FakeFabric::listen(const std::string& name,
                                                     const ConnectionOptions& options,
                                                     uint16_t port) {
  std::lock_guard lk(hub_->mu);
  auto [it, inserted] = hub_->listeners.try_emplace(name);
  if (!inserted)
    return Status(Errc::kAlreadyExists, "listen on fake:" + name + ": already listening there");
  it->second.options = options;
  it->second.port = port != 0 ? port : hub_->next_port++;
  return std::unique_ptr<Listener>(new detail::FakeListener(hub_, name, it->second.port));
}

Result<uint16_t> FakeFabric::port_of(const std::string& name) const {
  std::lock_guard lk(hub_->mu);
  auto it = hub_->listeners.find(name);
  if (it == hub_->listeners.end() || it->second.shut)
    return Status(Errc::kNotFound, "fake:" + name + ": nobody is listening there");
  return it->second.port;
}

Result<std::unique_ptr<Connection>> FakeFabric::connect(const std::string& name,
                                                        const ConnectionOptions& options,
                                                        const std::string& from) {
  std::lock_guard lk(hub_->mu);
  auto l = hub_->listeners.find(name);
  if (l == hub_->listeners.end() || l->second.shut)
    return Status(Errc::kConnectionError,
                  "connect to fake:" + name + ": nobody is listening there");
  if (l->second.options.message_size != options.message_size)
    return Status(Errc::kConfigError, "connect to fake:" + name + ": message_size mismatch (" +
                                          std::to_string(options.message_size) + " here, " +
                                          std::to_string(l->second.options.message_size) +
                                          " at the listener)");
  uint64_t a = hub_->next_end++, p = hub_->next_end++;
  auto init = [&](uint64_t id, uint64_t peer, const std::string& node, std::string peer_address,
                  const ConnectionOptions& o) -> End& {
    End& e = hub_->ends[id];
    e.id = id;
    e.peer = peer;
    e.node = node;
    e.peer_address = std::move(peer_address);
    e.options = o;
    e.slot_posted.assign(o.recv_slots, true);
    for (uint32_t s = 0; s < o.recv_slots; ++s) e.posted.push_back(s);
    return e;
  };
  End& active = init(a, p, from, "fake:" + name, options);
  End& passive = init(p, a, name, "fake:" + from + "#" + std::to_string(a), l->second.options);
  auto ac = std::make_unique<detail::FakeConnection>(hub_, active);
  l->second.backlog.push_back(std::make_unique<detail::FakeConnection>(hub_, passive));
  hub_->cv.notify_all();
  return std::unique_ptr<Connection>(std::move(ac));
}

void FakeFabric::set_manual(bool manual) {
  std::lock_guard lk(hub_->mu);
  hub_->manual = manual;
  hub_->run();
}

bool FakeFabric::manual() const {
  std::lock_guard lk(hub_->mu);
  return hub_->manual;
}

bool FakeFabric::step() {
  std::lock_guard lk(hub_->mu);
  return hub_->step_one();
}

bool FakeFabric::step(const Connection& connection) {
  std::lock_guard lk(hub_->mu);
  End* e = detail::end_of(*hub_, connection);
  return e != nullptr && hub_->exec_head(*e) == detail::Exec::kDone;
}

size_t FakeFabric::run_until_idle() {
  std::lock_guard lk(hub_->mu);
  size_t n = 0;
  while (hub_->step_one()) ++n;
  return n;
}

size_t FakeFabric::pending() const {
  std::lock_guard lk(hub_->mu);
  size_t n = 0;
  for (auto& [id, e] : hub_->ends) n += e.sq.size();
  return n;
}

void FakeFabric::break_connection(const Connection& connection, Status reason) {
  std::lock_guard lk(hub_->mu);
  End* e = detail::end_of(*hub_, connection);
  if (e == nullptr || e->broken) return;
  auto peer = hub_->ends.find(e->peer);
  Status theirs = peer == hub_->ends.end() ? reason : hub_->lost(peer->second, reason.message());
  hub_->break_pair(*e, hub_->lost(*e, reason.message()), std::move(theirs));
}

void FakeFabric::fail_after(const Connection& connection, uint64_t skip, Status reason) {
  std::lock_guard lk(hub_->mu);
  End* e = detail::end_of(*hub_, connection);
  if (e == nullptr) return;
  e->fail_skip = skip;
  e->fail_reason = hub_->lost(*e, reason.message());
  e->fail_reason = Status(reason.code(), e->fail_reason.message());
}

void FakeFabric::drop_next(const Connection& connection) { fail_after(connection, 0); }

void FakeFabric::stall_teardown(const std::string& peer_node, std::shared_future<void> until) {
  std::lock_guard lk(hub_->mu);
  if (until.valid()) {
    hub_->teardown_stalls[peer_node] = std::move(until);
  } else {
    hub_->teardown_stalls.erase(peer_node);
  }
}

Status FakeFabric::track(const std::string& node, void* addr, size_t len) {
  if (addr == nullptr || len == 0) return Status(Errc::kInvalidArgument, "track: empty range");
  std::lock_guard lk(hub_->mu);
  Medium& m = hub_->attach_medium(node, static_cast<std::byte*>(addr), len);
  m.pinned = true;
  m.node = node;
  return Status::Ok();
}

void FakeFabric::untrack(const void* addr) {
  std::lock_guard lk(hub_->mu);
  if (Medium* m = hub_->medium_containing(reinterpret_cast<uintptr_t>(addr), 0)) {
    m->pinned = false;
    hub_->release_medium(*m);
  }
}

Status FakeFabric::persist(const void* addr, size_t len) {
  std::lock_guard lk(hub_->mu);
  auto a = reinterpret_cast<uintptr_t>(addr);
  uintptr_t b = a + len;
  hub_->persist_range(a, b);
  ScopeDepth in_persist_fn(t_in_persist_fn);
  Status first;
  for (auto& [rkey, reg] : hub_->regs) {
    auto ra = reinterpret_cast<uintptr_t>(reg.base);
    uintptr_t rb = ra + reg.length;
    uintptr_t lo = std::max(a, ra), hi = std::min(b, rb);
    if (lo >= hi || !reg.persist) continue;
    Status persisted = reg.persist(reinterpret_cast<const void*>(lo), hi - lo);
    if (!persisted.ok() && first.ok()) first = std::move(persisted);
  }
  return first;
}

void FakeFabric::mark_durable(const void* addr, size_t len) {
  if (t_in_persist_fn > 0 || len == 0) return;
  std::lock_guard lk(hub_->mu);
  auto a = reinterpret_cast<uintptr_t>(addr);
  hub_->persist_range(a, a + len);
}

PersistFn FakeFabric::tracking_persist_fn(PersistFn real) {
  std::weak_ptr<Hub> weak = hub_;
  return [weak, real = std::move(real)](const void* addr, size_t len) {
    if (auto hub = weak.lock(); hub && t_in_persist_fn == 0) {
      std::lock_guard lk(hub->mu);
      auto a = reinterpret_cast<uintptr_t>(addr);
      hub->persist_range(a, a + len);
    }
    return real ? real(addr, len) : Status::Ok();
  };
}

void FakeFabric::crash(const std::string& node, const CrashOptions& options) {
  std::lock_guard lk(hub_->mu);
  hub_->crash_node(node, options);
}

void FakeFabric::crash(const MemoryRegion& region, const CrashOptions& options) {
  std::lock_guard lk(hub_->mu);
  ++hub_->crashes;
  auto it = hub_->regs.find(region.remote_key().rkey);
  if (it != hub_->regs.end()) {
    auto e = hub_->ends.find(it->second.end);
    if (e != hub_->ends.end() && !e->second.broken) {
      std::string why = "the memory behind rkey " + hex(it->first) + " crashed (injected)";
      auto peer = hub_->ends.find(e->second.peer);
      Status theirs = peer == hub_->ends.end() ? Status() : hub_->lost(peer->second, why);
      hub_->break_pair(e->second, hub_->lost(e->second, why), std::move(theirs));
    }
  }
  std::mt19937_64 rng(options.seed);
  if (Medium* m =
          hub_->medium_containing(reinterpret_cast<uintptr_t>(region.base()), region.length()))
    Hub::rollback(*m, options, rng);
}

void FakeFabric::crash_all(const CrashOptions& options) {
  std::lock_guard lk(hub_->mu);
  hub_->crash_everything(options);
}

void FakeFabric::crash_after(uint64_t operations, const std::string& node,
                             const CrashOptions& options, const std::string& counted_node) {
  std::lock_guard lk(hub_->mu);
  hub_->trigger = detail::CrashTrigger{operations, node, options, counted_node};
  if (operations == 0) hub_->fire_trigger();
}

void FakeFabric::cancel_crash() {
  std::lock_guard lk(hub_->mu);
  hub_->trigger.reset();
}

uint64_t FakeFabric::crashes() const {
  std::lock_guard lk(hub_->mu);
  return hub_->crashes;
}

uint64_t FakeFabric::executed(const std::string& node) const {
  std::lock_guard lk(hub_->mu);
  if (node.empty()) return hub_->executed_total;
  auto it = hub_->executed_by_node.find(node);
  return it == hub_->executed_by_node.end() ? 0 : it->second;
}

Result<std::vector<std::byte>> FakeFabric::durable_bytes(const void* addr, size_t len) const {
  std::lock_guard lk(hub_->mu);
  auto a = reinterpret_cast<uintptr_t>(addr);
  const Medium* m = hub_->medium_containing(a, len);
  if (m == nullptr)
    return Status(Errc::kNotFound, "durable_bytes: [" + hex(a) + ", +" + std::to_string(len) +
                                       ") is not inside one tracked medium (register it with "
                                       "kRemoteWrite, or track() it)");
  auto first = m->durable.begin() + static_cast<ptrdiff_t>(a - m->base);
  return std::vector<std::byte>(first, first + static_cast<ptrdiff_t>(len));
}

Result<std::vector<std::byte>> FakeFabric::durable_bytes(const MemoryRegion& region) const {
  return durable_bytes(region.base(), region.length());
}

size_t FakeFabric::undurable_writes() const {
  std::lock_guard lk(hub_->mu);
  size_t n = 0;
  for (auto& [base, m] : hub_->media) n += m.pieces.size();
  return n;
}

}  // namespace pmirror::transport::fake

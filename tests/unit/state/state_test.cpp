#include "state/state.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <libpmemobj.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace pmirror::state {
namespace {

namespace fs = std::filesystem;

class StateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "pmirror-state-XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr) << std::strerror(errno);
    dir_ = templ;
    pool_ = (dir_ / "state.pool").string();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::unique_ptr<StateStore> open_store(bool create = true) {
    auto store = StateStore::open(pool_, create);
    EXPECT_TRUE(store.ok()) << store.status().to_string();
    return store.ok() ? std::move(store).value() : nullptr;
  }

  fs::path dir_;
  std::string pool_;
};

bool is_zero(const Uuid& uuid) {
  for (uint8_t b : uuid) {
    if (b != 0) return false;
  }
  return true;
}

TEST_F(StateTest, CreateRecordReopenFindsRecord) {
  Uuid uuid{};
  {
    auto store = open_store();
    ASSERT_NE(store, nullptr);
    EXPECT_TRUE(fs::exists(pool_));
    auto v = store->get_or_create("db0");
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    EXPECT_EQ(v->name, "db0");
    EXPECT_EQ(v->generation, 1u);
    EXPECT_EQ(v->last_sequence, 0u);
    EXPECT_EQ(v->last_writer, "");
    EXPECT_FALSE(is_zero(v->uuid));
    EXPECT_EQ(v->uuid[6] >> 4, 4);                                 // version 4
    EXPECT_EQ(v->uuid[8] & 0xc0, 0x80);                            // RFC 4122 variant
    EXPECT_GT(v->created_unix_ns, 1600000000ull * 1000000000ull);  // a real wall clock time
    uuid = v->uuid;
    ASSERT_TRUE(store->record("db0", 1, 42, "app1").ok());
  }
  auto store = open_store(/*create=*/false);
  ASSERT_NE(store, nullptr);
  auto v = store->get("db0");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(v->generation, 1u);
  EXPECT_EQ(v->last_sequence, 42u);
  EXPECT_EQ(v->last_writer, "app1");
  EXPECT_EQ(v->uuid, uuid);
  EXPECT_GE(v->updated_unix_ns, v->created_unix_ns);
  // get_or_create on an existing record returns it unchanged.
  auto again = store->get_or_create("db0");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->uuid, uuid);
  EXPECT_EQ(again->last_sequence, 42u);
  EXPECT_EQ(store->list().size(), 1u);
}

TEST_F(StateTest, UuidsDiffer) {
  auto store = open_store();
  ASSERT_NE(store, nullptr);
  auto a = store->get_or_create("a");
  auto b = store->get_or_create("b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->uuid, b->uuid);
  EXPECT_EQ(uuid_to_string(a->uuid).size(), 36u);
  EXPECT_EQ(uuid_to_string(
                Uuid{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0, 1, 2, 3, 4, 5, 6, 0xff}),
            "01234567-89ab-cdef-0001-0203040506ff");
}

TEST_F(StateTest, RecordIsMonotonic) {
  auto store = open_store();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->get_or_create("v").ok());
  ASSERT_TRUE(store->record("v", 1, 10, "w1").ok());
  ASSERT_TRUE(store->record("v", 1, 10, "w1").ok());  // idempotent retry

  Status back = store->record("v", 1, 9, "w1");
  EXPECT_EQ(back.code(), Errc::kInvalidArgument);
  EXPECT_NE(back.message().find("backwards"), std::string::npos) << back.message();

  // A new generation may restart the sequence.
  ASSERT_TRUE(store->record("v", 2, 3, "w2").ok());
  Status stale = store->record("v", 1, 100, "w1");
  EXPECT_EQ(stale.code(), Errc::kInvalidArgument);
  EXPECT_NE(stale.message().find("stale generation"), std::string::npos) << stale.message();

  auto v = store->get("v");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->generation, 2u);
  EXPECT_EQ(v->last_sequence, 3u);
  EXPECT_EQ(v->last_writer, "w2");

  EXPECT_EQ(store->record("nope", 1, 1, "w").code(), Errc::kNotFound);
}

TEST_F(StateTest, GenerationChanges) {
  auto store = open_store();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->get_or_create("v").ok());
  ASSERT_TRUE(store->record("v", 1, 50, "w1").ok());

  ASSERT_TRUE(store->set_generation("v", 1).ok());  // no-op
  EXPECT_EQ(store->get("v")->last_sequence, 50u);

  ASSERT_TRUE(store->set_generation("v", 5).ok());
  EXPECT_EQ(store->get("v")->generation, 5u);
  EXPECT_EQ(store->get("v")->last_sequence, 0u);
  EXPECT_EQ(store->set_generation("v", 4).code(), Errc::kInvalidArgument);

  auto bumped = store->bump_generation("v", "w2");
  ASSERT_TRUE(bumped.ok()) << bumped.status().to_string();
  EXPECT_EQ(*bumped, 6u);
  auto v = store->get("v");
  EXPECT_EQ(v->generation, 6u);
  EXPECT_EQ(v->last_writer, "w2");
  EXPECT_EQ(store->record("v", 5, 1, "w1").code(), Errc::kInvalidArgument);  // fenced
  EXPECT_EQ(store->set_generation("nope", 3).code(), Errc::kNotFound);
  EXPECT_EQ(store->bump_generation("nope", "w").status().code(), Errc::kNotFound);
}

TEST_F(StateTest, NamesAreValidated) {
  auto store = open_store();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->get_or_create("").status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(store->get_or_create(std::string(65, 'n')).status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(store->get_or_create(std::string("a\0b", 3)).status().code(), Errc::kInvalidArgument);
  std::string longest(64, 'n');
  ASSERT_TRUE(store->get_or_create(longest).ok());
  EXPECT_EQ(store->record(longest, 1, 1, std::string(65, 'w')).code(), Errc::kInvalidArgument);
  ASSERT_TRUE(store->record(longest, 1, 1, std::string(64, 'w')).ok());
  auto v = store->get(longest);
  EXPECT_EQ(v->name, longest);
  EXPECT_EQ(v->last_writer, std::string(64, 'w'));
}

TEST_F(StateTest, RemoveFreesTheRecord) {
  auto store = open_store();
  ASSERT_NE(store, nullptr);
  auto first = store->get_or_create("v");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(store->record("v", 3, 7, "w").ok());
  ASSERT_TRUE(store->remove("v").ok());
  EXPECT_EQ(store->get("v").status().code(), Errc::kNotFound);
  EXPECT_EQ(store->remove("v").code(), Errc::kNotFound);
  EXPECT_TRUE(store->list().empty());

  auto second = store->get_or_create("v");
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->generation, 1u);
  EXPECT_EQ(second->last_sequence, 0u);
  EXPECT_NE(second->uuid, first->uuid);
}

TEST_F(StateTest, ManyVolumesFillTheTableAndSurviveReopen) {
  // 1000+ transactions: on a disk filesystem each costs several msyncs
  // (~10 ms), so use tmpfs when there is one. Same code path: msync on
  // tmpfs is just cheap.
  fs::path shm_dir;
  if (fs::is_directory("/dev/shm")) {
    std::string templ = "/dev/shm/pmirror-state-XXXXXX";
    if (::mkdtemp(templ.data()) != nullptr) {
      shm_dir = templ;
      pool_ = (shm_dir / "state.pool").string();
    }
  }
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      if (!dir.empty()) fs::remove_all(dir, ec);
    }
  } cleanup{shm_dir};
  {
    auto store = open_store();
    ASSERT_NE(store, nullptr);
    for (size_t i = 0; i < kMaxVolumes; ++i) {
      std::string name = "vol" + std::to_string(i);
      ASSERT_TRUE(store->get_or_create(name).ok()) << name;
    }
    auto full = store->get_or_create("one-too-many");
    EXPECT_EQ(full.status().code(), Errc::kResourceExhausted);
    EXPECT_NE(full.status().message().find("1024"), std::string::npos);

    ASSERT_TRUE(store->remove("vol500").ok());
    ASSERT_TRUE(store->get_or_create("one-too-many").ok());  // the freed slot is reused
    ASSERT_TRUE(store->record("vol7", 2, 77, "w").ok());
  }
  auto store = open_store(false);
  ASSERT_NE(store, nullptr);
  auto all = store->list();
  ASSERT_EQ(all.size(), kMaxVolumes);
  std::set<std::string> names;
  for (size_t i = 0; i < all.size(); ++i) {
    names.insert(all[i].name);
    if (i > 0) {
      EXPECT_LT(all[i - 1].name, all[i].name);  // sorted
    }
  }
  EXPECT_EQ(names.count("vol500"), 0u);
  EXPECT_EQ(names.count("one-too-many"), 1u);
  EXPECT_EQ(store->get("vol7")->last_sequence, 77u);
  EXPECT_EQ(store->get("vol1023")->generation, 1u);
}

TEST_F(StateTest, MissingPoolWithoutCreate) {
  auto store = StateStore::open(pool_, false);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), Errc::kNotFound);
  EXPECT_NE(store.status().message().find(pool_), std::string::npos);
  EXPECT_NE(store.status().message().find("pmempool create"), std::string::npos)
      << store.status().message();
  EXPECT_FALSE(fs::exists(pool_));
}

TEST_F(StateTest, MissingDirectory) {
  std::string p = (dir_ / "no" / "dir" / "state.pool").string();
  auto store = StateStore::open(p, true);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), Errc::kNotFound);
  EXPECT_NE(store.status().message().find("mkdir -p"), std::string::npos)
      << store.status().message();
}

TEST_F(StateTest, DirectoryIsNotAPool) {
  auto store = StateStore::open(dir_.string(), true);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(store.status().message().find("directory"), std::string::npos);
}

TEST_F(StateTest, FileThatIsNotAPool) {
  {
    std::ofstream out(pool_, std::ios::binary);
    std::string junk(16 * 1024 * 1024, 'j');
    out << "this is a text file, not a pool\n" << junk;
  }
  auto store = StateStore::open(pool_, true);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(store.status().message().find("not a libpmemobj pool"), std::string::npos)
      << store.status().message();
  EXPECT_NE(store.status().message().find(pool_), std::string::npos);

  // An empty file too; and neither is overwritten.
  fs::resize_file(pool_, 0);
  auto empty = StateStore::open(pool_, true);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), Errc::kInvalidArgument) << empty.status().to_string();
  EXPECT_EQ(fs::file_size(pool_), 0u);
}

TEST_F(StateTest, PoolWithAnotherLayout) {
  PMEMobjpool* other = pmemobj_create(pool_.c_str(), "somebody-else", PMEMOBJ_MIN_POOL, 0600);
  ASSERT_NE(other, nullptr) << pmemobj_errormsg();
  pmemobj_close(other);

  auto store = StateStore::open(pool_, true);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(store.status().message().find("another program"), std::string::npos)
      << store.status().message();
  EXPECT_NE(store.status().message().find(kLayoutName), std::string::npos);
}

TEST_F(StateTest, CorruptPoolHeader) {
  { ASSERT_NE(open_store(), nullptr); }
  // Scribble over the pool header's UUID fields, which its checksum covers.
  int fd = ::open(pool_.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  char junk[64];
  std::memset(junk, 0x5a, sizeof(junk));
  ASSERT_EQ(::pwrite(fd, junk, sizeof(junk), 16), static_cast<ssize_t>(sizeof(junk)));
  ::close(fd);

  auto store = StateStore::open(pool_, true);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), Errc::kIoError) << store.status().to_string();
  EXPECT_NE(store.status().message().find("pmempool check"), std::string::npos)
      << store.status().message();
}

TEST_F(StateTest, SecondOpenIsBusy) {
  auto first = open_store();
  ASSERT_NE(first, nullptr);
  auto second = StateStore::open(pool_, true);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Errc::kBusy) << second.status().to_string();
}

TEST_F(StateTest, ConcurrentUpdatesFromThreads) {
  auto store = open_store();
  ASSERT_NE(store, nullptr);
  constexpr int kThreads = 4;
  constexpr int kIterations = 40;
  ASSERT_TRUE(store->get_or_create("shared").ok());
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(store->get_or_create("own" + std::to_string(t)).ok());
  }

  std::atomic<uint64_t> next_sequence{0};
  std::atomic<int> unexpected{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::string writer = "t" + std::to_string(t);
      for (int i = 1; i <= kIterations; ++i) {
        // Sequences race each other; a lower one arriving late is refused.
        uint64_t seq = ++next_sequence;
        Status s = store->record("shared", 1, seq, writer);
        if (!s.ok() && s.code() != Errc::kInvalidArgument) ++unexpected;
        if (!store->record("own" + std::to_string(t), 1, i, writer).ok()) ++unexpected;
        if (store->list().size() != kThreads + 1) ++unexpected;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(unexpected.load(), 0);
  // The highest sequence can never be refused, so it is what remains.
  EXPECT_EQ(store->get("shared")->last_sequence, uint64_t{kThreads * kIterations});
  for (int t = 0; t < kThreads; ++t) {
    auto v = store->get("own" + std::to_string(t));
    EXPECT_EQ(v->last_sequence, uint64_t{kIterations});
    EXPECT_EQ(v->last_writer, "t" + std::to_string(t));
  }
}

// Generation and writer are derived from the sequence so a record mixing
// two updates (torn) is detectable.
uint64_t generation_for(uint64_t seq) { return 1 + seq / 7; }
std::string writer_for(uint64_t seq) { return "writer-" + std::to_string(seq); }

TEST_F(StateTest, SurvivesSigkillMidUpdate) {
  {
    auto store = open_store();
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->get_or_create("v").ok());
  }
  uint64_t base = 0;
  for (int round = 0; round < 5; ++round) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      auto store = StateStore::open(pool_, false);
      if (!store.ok()) ::_exit(2);
      for (uint64_t seq = base + 1;; ++seq) {
        if (!(*store)->record("v", generation_for(seq), seq, writer_for(seq)).ok()) ::_exit(3);
        // Reported only after the transaction committed.
        if (::write(fds[1], &seq, sizeof(seq)) != sizeof(seq)) ::_exit(4);
      }
    }
    ::close(fds[1]);
    // Let the child commit a varying number of updates, then kill it at
    // whatever point of a transaction it happens to be.
    uint64_t last_reported = base;
    int wanted = 5 + round * 6;
    for (int n = 0; n < wanted; ++n) {
      uint64_t seq = 0;
      ASSERT_EQ(::read(fds[0], &seq, sizeof(seq)), static_cast<ssize_t>(sizeof(seq)))
          << "child died early";
      last_reported = seq;
    }
    ::usleep(static_cast<useconds_t>(round * 700));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int wstatus = 0;
    ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(wstatus)) << "child exited with " << WEXITSTATUS(wstatus);
    uint64_t seq = 0;
    while (::read(fds[0], &seq, sizeof(seq)) == static_cast<ssize_t>(sizeof(seq))) {
      last_reported = seq;
    }
    ::close(fds[0]);

    auto store = StateStore::open(pool_, false);
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    auto v = (*store)->get("v");
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    // Every reported update is durable; at most one more committed unreported.
    EXPECT_GE(v->last_sequence, last_reported) << "round " << round;
    EXPECT_LE(v->last_sequence, last_reported + 1) << "round " << round;
    // Never torn: all fields come from the same committed update.
    EXPECT_EQ(v->generation, generation_for(v->last_sequence)) << "round " << round;
    EXPECT_EQ(v->last_writer, writer_for(v->last_sequence)) << "round " << round;
    base = v->last_sequence;
  }
}

}  // namespace
}  // namespace pmirror::state

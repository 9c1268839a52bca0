// What a persist costs the application's thread in steady state: no heap
// allocation (issue 11). This binary replaces operator new to count the
// allocations made by the test's own thread while counting is on, except
// those of the fake fabric's own code (transport::fake::in_fabric_code():
// it simulates the NIC and the media, which a real NIC does without
// touching the application's heap). The targets run on threads of their
// own and are not counted either: they are another process in production.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "failover/lease_file.h"
#include "initiator/persist_pipeline.h"
#include "transport/fake/fake_fabric.h"
#include "unit/initiator/fake_targets.h"

namespace {

thread_local bool counting = false;
std::atomic<uint64_t> allocations{0};

void* counted_alloc(std::size_t size, std::size_t alignment) {
  if (counting && !pmirror::transport::fake::in_fabric_code()) ++allocations;
  if (size == 0) size = 1;
  void* p = alignment <= alignof(std::max_align_t)
                ? std::malloc(size)
                : std::aligned_alloc(alignment, (size + alignment - 1) / alignment * alignment);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

// The replacement operators pair malloc with free by construction; GCC's
// -Wmismatched-new-delete sees operator new's malloc inlined into a caller
// that frees through operator delete (the TSan build at -O1) and cannot
// tell.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t size) { return counted_alloc(size, 0); }
void* operator new[](std::size_t size) { return counted_alloc(size, 0); }
void* operator new(std::size_t size, std::align_val_t al) {
  return counted_alloc(size, static_cast<std::size_t>(al));
}
void* operator new[](std::size_t size, std::align_val_t al) {
  return counted_alloc(size, static_cast<std::size_t>(al));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace pmirror::initiator {
namespace {

using testing::FakeTargetsTest;

class HotPathTest : public FakeTargetsTest,
                    public ::testing::WithParamInterface<config::ApmPolicy> {
 protected:
  // Persists `count` times, `length` bytes each at rotating offsets of the
  // first 64 KiB, each with new bytes; returns the allocations made by this
  // thread meanwhile (with `count_them`).
  uint64_t persist_many(int count, uint64_t length, bool count_them) {
    allocations = 0;
    counting = count_them;
    for (int i = 0; i < count; ++i) {
      const uint64_t offset = (uint64_t(i) * 4096) % (64 * 1024);
      std::memset(volume_->core.local->data() + offset, (round_ + i) & 0xff, length);
      Status persisted = persist(offset, length);
      if (!persisted.ok()) {
        counting = false;
        ADD_FAILURE() << "persist " << i << ": " << persisted.to_string();
        return UINT64_MAX;
      }
    }
    counting = false;
    round_ += count;
    return allocations.load();
  }

  int round_ = 1;
};

TEST_P(HotPathTest, ThousandPersistsToTwoReplicasAllocateNothing) {
  open_volume(2, {}, GetParam());
  ASSERT_TRUE(all_in_sync());
  for (uint64_t length : {uint64_t{64}, uint64_t{4096}}) {
    // Warm-up: the reused buffers grow to what a persist needs.
    ASSERT_NE(persist_many(200, length, false), UINT64_MAX);
    EXPECT_EQ(persist_many(1000, length, true), 0u)
        << "heap allocations by the application's thread across 1000 persists of " << length
        << " bytes";
    // And the persists arrived: the replicas hold the last round's bytes.
    auto local = std::vector<std::byte>(volume_->core.local->data(),
                                        volume_->core.local->data() + 64 * 1024);
    for (size_t i = 0; i < 2; ++i) {
      auto bytes = target_bytes(i);
      ASSERT_GE(bytes.size(), local.size());
      EXPECT_EQ(0, std::memcmp(bytes.data(), local.data(), local.size())) << "replica " << i;
    }
  }
}

// Under a failover lease (docs/failover.md, section 2) a persist adds one
// clock read and one atomic load: still nothing on the heap.
TEST_P(HotPathTest, PersistsUnderALeaseAllocateNothing) {
  open_volume(1, {}, GetParam());
  ASSERT_TRUE(all_in_sync());
  const std::string path = "/dev/shm/pmirror-hot-path-" + std::to_string(::getpid()) + ".lease";
  auto writer = failover::LeaseFileWriter::create(path, "v", "a");
  ASSERT_TRUE(writer.ok()) << writer.status().to_string();
  writer->publish(failover::monotonic_now_ns() + 600'000'000'000ull, 1);
  auto reader = failover::LeaseFileReader::open(path, "v", "a");
  ASSERT_TRUE(reader.ok()) << reader.status().to_string();
  volume_->core.lease = std::make_unique<failover::LeaseFileReader>(std::move(reader).value());
  ::unlink(path.c_str());  // the mappings stay
  ASSERT_NE(persist_many(200, 64, false), UINT64_MAX);
  EXPECT_EQ(persist_many(1000, 64, true), 0u)
      << "heap allocations by the application's thread across 1000 persists under a lease";
}

INSTANTIATE_TEST_SUITE_P(Flush, HotPathTest,
                         ::testing::Values(config::ApmPolicy::kOn, config::ApmPolicy::kOff),
                         [](const auto& info) {
                           return info.param == config::ApmPolicy::kOn ? std::string("Apm")
                                                                       : std::string("Gpspm");
                         });

}  // namespace
}  // namespace pmirror::initiator

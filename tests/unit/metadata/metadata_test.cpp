#include "metadata/metadata.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <libpmemobj.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace pmirror::metadata {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMiB = 1ull << 20;

class MetadataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // tmpfs when there is one: every persist is an msync on a plain file.
    fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    std::string templ = (base / "pmirror-metadata-XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr) << std::strerror(errno);
    dir_ = templ;
    path_ = (dir_ / "copy.pmirror").string();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  CopyMetadata::Options options(uint64_t volume_size, uint64_t chunk = kDefaultChunk,
                                bool create = true) const {
    CopyMetadata::Options o;
    o.path = path_;
    o.volume_size = volume_size;
    o.chunk_size = chunk;
    o.create_if_missing = create;
    return o;
  }

  std::unique_ptr<CopyMetadata> open_md(uint64_t volume_size, uint64_t chunk = kDefaultChunk,
                                        bool create = true) {
    auto md = CopyMetadata::open(options(volume_size, chunk, create));
    EXPECT_TRUE(md.ok()) << md.status().to_string();
    return md.ok() ? std::move(md).value() : nullptr;
  }

  fs::path dir_;
  std::string path_;
};

bool is_zero(const Uuid& uuid) {
  return std::all_of(uuid.begin(), uuid.end(), [](uint8_t b) { return b == 0; });
}

std::vector<uint64_t> dirty_chunks(const CopyMetadata& md, size_t peer) {
  std::vector<uint64_t> out;
  uint64_t chunks = md.info().chunks;
  for (uint64_t c = md.next_dirty(peer, 0); c < chunks; c = md.next_dirty(peer, c + 1)) {
    out.push_back(c);
  }
  return out;
}

// --- opening ---

TEST_F(MetadataTest, NewPoolDefaultsAndReopenKeepsEverything) {
  Uuid uuid{};
  Uuid peer_uuid{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  Generations gens;
  {
    auto md = open_md(64 * kMiB);
    ASSERT_NE(md, nullptr);
    EXPECT_EQ(md->path(), path_);
    struct stat st {};
    ASSERT_EQ(::stat(path_.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_GE(static_cast<uint64_t>(st.st_size), PMEMOBJ_MIN_POOL);

    CopyInfo info = md->info();
    EXPECT_FALSE(is_zero(info.uuid));
    EXPECT_EQ(info.uuid[6] >> 4, 4);
    EXPECT_EQ(info.generations, Generations{});
    EXPECT_TRUE(info.consistent);
    EXPECT_FALSE(info.promoted);
    EXPECT_TRUE(info.clean);
    EXPECT_EQ(info.volume_size, 64 * kMiB);
    EXPECT_EQ(info.chunk_size, kDefaultChunk);
    EXPECT_EQ(info.chunks, 1024u);
    EXPECT_TRUE(md->peers().empty());
    EXPECT_TRUE(md->activity_extents().empty());
    uuid = info.uuid;

    auto a = md->peer("node-a");
    auto b = md->peer("node-b");
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, 0u);
    EXPECT_EQ(*b, 1u);
    ASSERT_TRUE(md->set_peer_uuid(*b, peer_uuid).ok());
    ASSERT_TRUE(md->track_peer(*a, 1234).ok());
    ASSERT_TRUE(md->new_generation().ok());
    ASSERT_TRUE(md->new_generation().ok());
    ASSERT_EQ(*md->mark(*a, 0, 1), 1u);
    ASSERT_EQ(*md->mark(*b, 64 * kMiB - 1, 1), 1u);
    ASSERT_TRUE(md->mark_all(*b).ok());
    ASSERT_TRUE(md->set_promoted(true).ok());
    ASSERT_TRUE(md->set_clean(false).ok());
    ASSERT_TRUE(md->set_consistent(false).ok());
    ASSERT_EQ(*md->activity_begin(5 * kMiB, 1, nullptr), 1u);
    gens = md->info().generations;
  }
  auto md = open_md(64 * kMiB, kDefaultChunk, /*create=*/false);
  ASSERT_NE(md, nullptr);
  CopyInfo info = md->info();
  EXPECT_EQ(info.uuid, uuid);
  EXPECT_EQ(info.generations, gens);
  EXPECT_NE(gens.current, 0u);
  EXPECT_NE(gens.history[0], 0u);
  EXPECT_FALSE(info.consistent);
  EXPECT_TRUE(info.promoted);
  EXPECT_FALSE(info.clean);
  auto peers = md->peers();
  ASSERT_EQ(peers.size(), 2u);
  EXPECT_EQ(peers[0].name, "node-a");
  EXPECT_EQ(peers[0].bitmap_generation, 1234u);
  EXPECT_TRUE(is_zero(peers[0].peer_uuid));
  EXPECT_FALSE(peers[0].full_sync);
  EXPECT_EQ(peers[0].dirty_chunks, 1u);
  EXPECT_EQ(peers[1].name, "node-b");
  EXPECT_EQ(peers[1].bitmap_generation, gens.history[0]);  // tracked by the second bump
  EXPECT_EQ(peers[1].peer_uuid, peer_uuid);
  EXPECT_TRUE(peers[1].full_sync);
  EXPECT_EQ(peers[1].dirty_chunks, 1024u);
  EXPECT_EQ(dirty_chunks(*md, 0), std::vector<uint64_t>{0});
  EXPECT_EQ(md->activity_extents(), std::vector<uint64_t>{1});
  EXPECT_EQ(*md->peer("node-b"), 1u);
}

TEST_F(MetadataTest, SizeOrChunkMismatchIsRefused) {
  { ASSERT_NE(open_md(64 * kMiB, 64 * 1024), nullptr); }
  auto size = CopyMetadata::open(options(128 * kMiB, 64 * 1024));
  ASSERT_FALSE(size.ok());
  EXPECT_EQ(size.status().code(), Errc::kInvalidArgument);
  const std::string& m = size.status().message();
  EXPECT_NE(m.find(path_), std::string::npos) << m;
  EXPECT_NE(m.find(std::to_string(64 * kMiB)), std::string::npos) << m;
  EXPECT_NE(m.find(std::to_string(128 * kMiB)), std::string::npos) << m;

  auto chunk = CopyMetadata::open(options(64 * kMiB, 4096));
  ASSERT_FALSE(chunk.ok());
  EXPECT_EQ(chunk.status().code(), Errc::kInvalidArgument);
  const std::string& c = chunk.status().message();
  EXPECT_NE(c.find(path_), std::string::npos) << c;
  EXPECT_NE(c.find("65536"), std::string::npos) << c;
  EXPECT_NE(c.find("4096"), std::string::npos) << c;

  EXPECT_NE(open_md(64 * kMiB, 64 * 1024), nullptr);  // the pool is untouched
}

TEST_F(MetadataTest, InvalidOptions) {
  for (uint64_t chunk : {uint64_t{0}, uint64_t{2048}, uint64_t{12288}, uint64_t{2 * kMiB}}) {
    auto md = CopyMetadata::open(options(64 * kMiB, chunk));
    ASSERT_FALSE(md.ok()) << chunk;
    EXPECT_EQ(md.status().code(), Errc::kInvalidArgument) << chunk;
    EXPECT_NE(md.status().message().find("chunk"), std::string::npos);
  }
  for (uint64_t size : {uint64_t{0}, uint64_t{4097}}) {
    auto md = CopyMetadata::open(options(size));
    ASSERT_FALSE(md.ok()) << size;
    EXPECT_EQ(md.status().code(), Errc::kInvalidArgument) << size;
  }
  CopyMetadata::Options o = options(64 * kMiB);
  o.path.clear();
  EXPECT_EQ(CopyMetadata::open(o).status().code(), Errc::kInvalidArgument);
  // 1 PiB in 4 KiB chunks: 256 Gi bits per peer.
  auto huge = CopyMetadata::open(options(1ull << 50, 4096));
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("larger chunk"), std::string::npos);
  EXPECT_FALSE(fs::exists(path_));
}

TEST_F(MetadataTest, MissingPoolOrDirectory) {
  auto md = CopyMetadata::open(options(64 * kMiB, kDefaultChunk, /*create=*/false));
  ASSERT_FALSE(md.ok());
  EXPECT_EQ(md.status().code(), Errc::kNotFound);
  EXPECT_NE(md.status().message().find(path_), std::string::npos);
  EXPECT_FALSE(fs::exists(path_));

  CopyMetadata::Options o = options(64 * kMiB);
  o.path = (dir_ / "no" / "dir" / "x.pmirror").string();
  auto nodir = CopyMetadata::open(o);
  ASSERT_FALSE(nodir.ok());
  EXPECT_EQ(nodir.status().code(), Errc::kNotFound);
  EXPECT_NE(nodir.status().message().find("mkdir -p"), std::string::npos);
}

TEST_F(MetadataTest, SecondOpenIsBusy) {
  auto first = open_md(64 * kMiB);
  ASSERT_NE(first, nullptr);
  auto second = CopyMetadata::open(options(64 * kMiB));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Errc::kBusy) << second.status().to_string();
  EXPECT_NE(second.status().message().find("primary in another process on this node"),
            std::string::npos)
      << second.status().message();
  EXPECT_NE(second.status().message().find(path_), std::string::npos);
  first.reset();
  EXPECT_NE(open_md(64 * kMiB), nullptr);  // released on close
}

TEST_F(MetadataTest, NotAPoolOrAnotherLayout) {
  {
    std::ofstream out(path_, std::ios::binary);
    out << "not a pool\n" << std::string(9 * kMiB, 'x');
  }
  auto text = CopyMetadata::open(options(64 * kMiB));
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(text.status().message().find("not a libpmemobj pool"), std::string::npos);
  fs::remove(path_);

  PMEMobjpool* other = pmemobj_create(path_.c_str(), "somebody-else", PMEMOBJ_MIN_POOL, 0600);
  ASSERT_NE(other, nullptr) << pmemobj_errormsg();
  pmemobj_close(other);
  auto layout = CopyMetadata::open(options(64 * kMiB));
  ASSERT_FALSE(layout.ok());
  EXPECT_EQ(layout.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(layout.status().message().find(kLayoutName), std::string::npos);
}

TEST_F(MetadataTest, LargeVolumeGetsALargerPool) {
  // 64 GiB in 4 KiB chunks: 16 Mi bits, 2 MiB per peer, 16 MiB of bitmaps.
  auto md = open_md(64ull << 30, 4096);
  ASSERT_NE(md, nullptr);
  EXPECT_GT(fs::file_size(path_), 16 * kMiB);
  size_t p = *md->peer("x");
  uint64_t last = md->info().chunks - 1;
  ASSERT_EQ(*md->mark(p, (64ull << 30) - 4096, 4096), 1u);
  EXPECT_EQ(md->next_dirty(p, 0), last);
  ASSERT_TRUE(md->mark_all(p).ok());
  EXPECT_EQ(md->dirty_count(p), last + 1);
}

// --- dirty bits ---

TEST_F(MetadataTest, MarkClearAcrossWordBoundaries) {
  // 130 chunks of 4 KiB: three words, the last one partly used.
  const uint64_t size = 130 * 4096;
  auto md = open_md(size, 4096);
  ASSERT_NE(md, nullptr);
  size_t p = *md->peer("p");
  EXPECT_EQ(md->next_dirty(p, 0), 130u);
  EXPECT_EQ(*md->mark(p, 0, 0), 0u);            // empty: no-op
  EXPECT_EQ(*md->mark(p, size + 4096, 0), 0u);  // even out of range

  // Chunks 60..69 straddle words 0 and 1.
  EXPECT_EQ(*md->mark(p, 60 * 4096, 10 * 4096), 10u);
  EXPECT_EQ(*md->mark(p, 60 * 4096, 10 * 4096), 0u);  // already dirty: nothing written
  EXPECT_EQ(*md->mark(p, 65 * 4096 + 100, 1), 0u);
  // Unaligned: touches chunks 69 and 70, one new.
  EXPECT_EQ(*md->mark(p, 70 * 4096 - 1, 2), 1u);
  // Whole words 1 and 2 up to the last chunk.
  EXPECT_EQ(*md->mark(p, 127 * 4096, 3 * 4096), 3u);
  EXPECT_EQ(md->dirty_count(p), 14u);
  EXPECT_TRUE(md->is_dirty(p, 63));
  EXPECT_TRUE(md->is_dirty(p, 64));
  EXPECT_FALSE(md->is_dirty(p, 59));
  EXPECT_FALSE(md->is_dirty(p, 71));
  EXPECT_TRUE(md->is_dirty(p, 129));
  EXPECT_FALSE(md->is_dirty(p, 130));  // outside: false
  EXPECT_EQ(md->next_dirty(p, 0), 60u);
  EXPECT_EQ(md->next_dirty(p, 64), 64u);
  EXPECT_EQ(md->next_dirty(p, 71), 127u);
  EXPECT_EQ(md->next_dirty(p, 130), 130u);
  EXPECT_EQ(md->next_dirty(p, 1000), 130u);

  auto outside = md->mark(p, size - 4096, 4097);
  EXPECT_EQ(outside.status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(md->mark(p, size + 1, 1).status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(md->mark(p, ~0ull, 2).status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(md->dirty_count(p), 14u);

  ASSERT_TRUE(md->clear(p, 63).ok());
  ASSERT_TRUE(md->clear(p, 63).ok());  // already clear
  ASSERT_TRUE(md->clear(p, 129).ok());
  EXPECT_EQ(md->clear(p, 130).code(), Errc::kInvalidArgument);
  EXPECT_EQ(md->dirty_count(p), 12u);
  EXPECT_EQ(md->next_dirty(p, 63), 64u);
  EXPECT_EQ(md->next_dirty(p, 128), 128u);
  EXPECT_EQ(md->next_dirty(p, 129), 130u);
  std::vector<uint64_t> want = {60, 61, 62, 64, 65, 66, 67, 68, 69, 70, 127, 128};
  EXPECT_EQ(dirty_chunks(*md, p), want);

  // Invalid peers.
  EXPECT_EQ(md->mark(1, 0, 1).status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(md->mark(kMaxPeers, 0, 1).status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(md->clear(5, 0).code(), Errc::kInvalidArgument);
  EXPECT_EQ(md->dirty_count(5), 0u);
  EXPECT_EQ(md->next_dirty(5, 0), 130u);

  md.reset();
  md = open_md(size, 4096);
  ASSERT_NE(md, nullptr);
  EXPECT_EQ(md->dirty_count(p), 12u);  // recounted at open
  EXPECT_EQ(dirty_chunks(*md, p), want);
}

TEST_F(MetadataTest, PartialLastChunk) {
  // 7 pages in 8 KiB chunks: 4 chunks, the last one half a chunk.
  const uint64_t size = 7 * 4096;
  auto md = open_md(size, 8192);
  ASSERT_NE(md, nullptr);
  EXPECT_EQ(md->info().chunks, 4u);
  size_t p = *md->peer("p");
  EXPECT_EQ(*md->mark(p, 6 * 4096, 4096), 1u);
  EXPECT_TRUE(md->is_dirty(p, 3));
  EXPECT_EQ(md->mark(p, 6 * 4096, 8192).status().code(), Errc::kInvalidArgument);
  ASSERT_TRUE(md->mark_all(p).ok());
  EXPECT_EQ(md->dirty_count(p), 4u);
  EXPECT_EQ(dirty_chunks(*md, p), (std::vector<uint64_t>{0, 1, 2, 3}));
}

TEST_F(MetadataTest, RandomOperationsMatchAModel) {
  const uint64_t chunks = 1000;
  const uint64_t size = chunks * 4096;
  auto md = open_md(size, 4096);
  ASSERT_NE(md, nullptr);
  size_t a = *md->peer("a");
  size_t b = *md->peer("b");
  std::vector<std::vector<bool>> model(2, std::vector<bool>(chunks));
  std::mt19937_64 rng(42);
  for (int i = 0; i < 3000; ++i) {
    size_t p = rng() % 2 == 0 ? a : b;
    if (rng() % 3 == 0) {
      uint64_t c = rng() % chunks;
      ASSERT_TRUE(md->clear(p, c).ok());
      model[p][c] = false;
    } else {
      uint64_t off = rng() % size;
      uint64_t len = 1 + rng() % std::min<uint64_t>(size - off, 300 * 4096);
      uint64_t expect_new = 0;
      for (uint64_t c = off / 4096; c <= (off + len - 1) / 4096; ++c) {
        if (!model[p][c]) ++expect_new;
        model[p][c] = true;
      }
      ASSERT_EQ(*md->mark(p, off, len), expect_new) << i;
    }
  }
  for (int round = 0; round < 2; ++round) {
    for (size_t p : {a, b}) {
      std::vector<uint64_t> want;
      for (uint64_t c = 0; c < chunks; ++c) {
        if (model[p][c]) want.push_back(c);
        ASSERT_EQ(md->is_dirty(p, c), model[p][c]) << c;
      }
      EXPECT_EQ(dirty_chunks(*md, p), want);
      EXPECT_EQ(md->dirty_count(p), want.size());
    }
    md.reset();
    md = open_md(size, 4096);
    ASSERT_NE(md, nullptr);
  }
}

TEST_F(MetadataTest, MarkAllThenReopenEveryChunkDirty) {
  {
    auto md = open_md(200 * 4096, 4096);
    ASSERT_NE(md, nullptr);
    size_t p = *md->peer("p");
    size_t q = *md->peer("q");
    ASSERT_TRUE(md->mark_all(p).ok());
    EXPECT_EQ(md->dirty_count(p), 200u);
    EXPECT_EQ(md->dirty_count(q), 0u);
    EXPECT_TRUE(md->peers()[p].full_sync);
    EXPECT_FALSE(md->peers()[q].full_sync);
  }
  auto md = open_md(200 * 4096, 4096);
  ASSERT_NE(md, nullptr);
  EXPECT_EQ(md->dirty_count(0), 200u);
  auto all = dirty_chunks(*md, 0);
  ASSERT_EQ(all.size(), 200u);
  for (uint64_t c = 0; c < 200; ++c) EXPECT_EQ(all[c], c);
  EXPECT_TRUE(md->peers()[0].full_sync);
  EXPECT_TRUE(dirty_chunks(*md, 1).empty());
}

// The on-media offsets this white-box test pokes (docs/state.md, "Copy
// metadata pool"): the root's peer table starts at byte 256, 128 bytes a
// peer, `filling` is its fourth word; the bitmaps start at byte 1792.
TEST_F(MetadataTest, InterruptedMarkAllIsCompletedAtOpen) {
  {
    auto md = open_md(300 * 4096, 4096);
    ASSERT_NE(md, nullptr);
    size_t p = *md->peer("p");
    ASSERT_TRUE(md->track_peer(p, 5).ok());
    ASSERT_EQ(*md->mark(p, 0, 4096), 1u);
  }
  // A crash after mark_all's transaction, before the fill: full_sync and
  // filling set, bitmap still sparse.
  PMEMobjpool* pop = pmemobj_open(path_.c_str(), kLayoutName);
  ASSERT_NE(pop, nullptr) << pmemobj_errormsg();
  auto* root = static_cast<uint8_t*>(pmemobj_direct(pmemobj_root(pop, 1)));
  ASSERT_NE(root, nullptr);
  auto* peer0 = reinterpret_cast<uint64_t*>(root + 256);
  ASSERT_EQ(peer0[0], 1u);  // in_use
  ASSERT_EQ(peer0[1], 5u);  // bitmap_generation
  peer0[2] = 1;             // full_sync
  peer0[3] = 1;             // filling
  pmemobj_persist(pop, peer0, 32);
  ASSERT_EQ(*reinterpret_cast<uint64_t*>(root + 1792), 1u);  // chunk 0 of peer 0
  pmemobj_close(pop);

  auto md = open_md(300 * 4096, 4096);
  ASSERT_NE(md, nullptr);
  EXPECT_EQ(md->dirty_count(0), 300u);
  EXPECT_EQ(dirty_chunks(*md, 0).size(), 300u);
  EXPECT_TRUE(md->peers()[0].full_sync);
  // Finished: clearing now sticks across a reopen.
  ASSERT_TRUE(md->clear(0, 7).ok());
  md.reset();
  md = open_md(300 * 4096, 4096);
  ASSERT_NE(md, nullptr);
  EXPECT_EQ(md->dirty_count(0), 299u);
  EXPECT_FALSE(md->is_dirty(0, 7));
}

// --- peers and generations ---

TEST_F(MetadataTest, Peers) {
  auto md = open_md(64 * kMiB);
  ASSERT_NE(md, nullptr);
  for (size_t i = 0; i < kMaxPeers; ++i) {
    auto p = md->peer("n" + std::to_string(i));
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_EQ(*p, i);
  }
  EXPECT_EQ(*md->peer("n3"), 3u);
  auto full = md->peer("one-too-many");
  EXPECT_EQ(full.status().code(), Errc::kResourceExhausted);
  EXPECT_NE(full.status().message().find("n7"), std::string::npos);
  EXPECT_EQ(md->peer("").status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(md->peer(std::string(kMaxPeerName + 1, 'x')).status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(md->peer(std::string("a\0b", 3)).status().code(), Errc::kInvalidArgument);
  EXPECT_TRUE(md->peer(std::string(kMaxPeerName, 'x')).status().code() == Errc::kResourceExhausted);
  EXPECT_EQ(md->set_peer_uuid(kMaxPeers, Uuid{}).code(), Errc::kInvalidArgument);
  EXPECT_EQ(md->track_peer(0, 0).code(), Errc::kInvalidArgument);

  ASSERT_EQ(*md->mark(2, 0, 64 * kMiB), 1024u);
  ASSERT_TRUE(md->new_generation().ok());
  ASSERT_TRUE(md->forget_peers().ok());
  EXPECT_TRUE(md->peers().empty());
  EXPECT_EQ(md->dirty_count(2), 0u);
  EXPECT_EQ(md->mark(0, 0, 1).status().code(), Errc::kInvalidArgument);
  // Slots are reused from the start, with clean bitmaps.
  for (int i = 0; i < 3; ++i) ASSERT_EQ(*md->peer("m" + std::to_string(i)), size_t(i));
  EXPECT_EQ(md->dirty_count(2), 0u);
  EXPECT_EQ(md->next_dirty(2, 0), 1024u);
  md.reset();
  md = open_md(64 * kMiB);
  ASSERT_NE(md, nullptr);
  auto peers = md->peers();
  ASSERT_EQ(peers.size(), 3u);
  EXPECT_EQ(peers[2].name, "m2");
  EXPECT_EQ(peers[2].dirty_chunks, 0u);
  EXPECT_EQ(peers[2].bitmap_generation, 0u);
}

TEST_F(MetadataTest, NewGenerationTracksUntrackedPeersAtTheOldCurrent) {
  auto md = open_md(64 * kMiB);
  ASSERT_NE(md, nullptr);
  size_t a = *md->peer("a");
  size_t b = *md->peer("b");
  auto g1 = md->new_generation();
  ASSERT_TRUE(g1.ok());
  EXPECT_NE(*g1, 0u);
  Generations gens = md->info().generations;
  EXPECT_EQ(gens.current, *g1);
  EXPECT_EQ(gens.history, (std::array<uint64_t, kHistory>{}));  // 0 is not remembered
  // Nothing to track from at generation 0.
  EXPECT_EQ(md->peers()[a].bitmap_generation, 0u);
  EXPECT_EQ(md->peers()[b].bitmap_generation, 0u);

  ASSERT_TRUE(md->track_peer(b, 777).ok());
  ASSERT_TRUE(md->track_peer(b, 888).ok());  // already tracking: no-op
  auto g2 = md->new_generation();
  ASSERT_TRUE(g2.ok());
  EXPECT_NE(*g2, *g1);
  EXPECT_EQ(md->peers()[a].bitmap_generation, *g1);
  EXPECT_EQ(md->peers()[b].bitmap_generation, 777u);
  gens = md->info().generations;
  EXPECT_EQ(gens.current, *g2);
  EXPECT_EQ(gens.history[0], *g1);
  EXPECT_TRUE(gens.knows(*g1));
  EXPECT_TRUE(gens.knows(*g2));
  EXPECT_FALSE(gens.knows(0));

  std::vector<uint64_t> all = {*g1, *g2};
  for (int i = 0; i < 5; ++i) all.push_back(*md->new_generation());
  gens = md->info().generations;
  EXPECT_EQ(gens.current, all[6]);
  EXPECT_EQ(gens.history, (std::array<uint64_t, kHistory>{all[5], all[4], all[3], all[2]}));
  EXPECT_FALSE(gens.knows(all[1]));
  EXPECT_EQ(std::set<uint64_t>(all.begin(), all.end()).size(), all.size());
  // Tracked peers keep where they started.
  EXPECT_EQ(md->peers()[a].bitmap_generation, *g1);
}

TEST_F(MetadataTest, AdoptGenerationHistoryOrder) {
  auto md = open_md(64 * kMiB);
  ASSERT_NE(md, nullptr);
  ASSERT_TRUE(md->adopt_generation(100, true).ok());
  Generations g = md->info().generations;
  EXPECT_EQ(g.current, 100u);
  EXPECT_EQ(g.history, (std::array<uint64_t, kHistory>{}));

  ASSERT_TRUE(md->adopt_generation(200, false).ok());
  EXPECT_FALSE(md->info().consistent);
  ASSERT_TRUE(md->adopt_generation(200, true).ok());  // same: only consistency changes
  CopyInfo info = md->info();
  EXPECT_TRUE(info.consistent);
  EXPECT_EQ(info.generations.current, 200u);
  EXPECT_EQ(info.generations.history, (std::array<uint64_t, kHistory>{100, 0, 0, 0}));

  for (uint64_t v : {300, 400, 500, 600}) ASSERT_TRUE(md->adopt_generation(v, true).ok());
  g = md->info().generations;
  EXPECT_EQ(g.current, 600u);
  EXPECT_EQ(g.history, (std::array<uint64_t, kHistory>{500, 400, 300, 200}));
  EXPECT_FALSE(g.knows(100));
  EXPECT_TRUE(g.knows(200));

  ASSERT_TRUE(md->set_consistent(false).ok());
  md.reset();
  md = open_md(64 * kMiB);
  ASSERT_NE(md, nullptr);
  EXPECT_EQ(md->info().generations, g);
  EXPECT_FALSE(md->info().consistent);
}

TEST_F(MetadataTest, FenceIsKeptFollowsTheAdoptedGenerationAndIsCleared) {
  auto md = open_md(64 * kMiB);
  ASSERT_NE(md, nullptr);
  EXPECT_EQ(md->info().fence, Fence{}) << "a new copy is not fenced";
  ASSERT_TRUE(md->adopt_generation(100, true).ok());
  EXPECT_EQ(md->info().fence.generation, 0u) << "adopting does not fence";
  EXPECT_EQ(md->set_fence(0, "b").code(), Errc::kInvalidArgument);
  EXPECT_EQ(md->set_fence(7, "").code(), Errc::kInvalidArgument);
  EXPECT_EQ(md->set_fence(7, std::string(kMaxPeerName + 1, 'n')).code(), Errc::kInvalidArgument);
  const std::string longest(kMaxPeerName, 'n');
  ASSERT_TRUE(md->set_fence(7, longest).ok());
  Fence fence = md->info().fence;
  EXPECT_EQ(fence.generation, 7u);
  EXPECT_EQ(fence.node, longest);
  EXPECT_GT(fence.since_unix_ns, 0u);
  EXPECT_EQ(md->info().generations.current, 100u) << "the fence leaves the copy's data alone";

  md.reset();
  md = open_md(64 * kMiB);
  ASSERT_NE(md, nullptr);
  EXPECT_EQ(md->info().fence, fence) << "the fence survives a reopen";
  ASSERT_TRUE(md->set_fence(8, "b").ok());  // a later promotion replaces it
  EXPECT_EQ(md->info().fence.node, "b");
  // The writer that passed the fence moves the copy on: the fence follows.
  ASSERT_TRUE(md->adopt_generation(9, false).ok());
  EXPECT_EQ(md->info().fence.generation, 9u);
  ASSERT_TRUE(md->adopt_generation(9, true).ok());
  EXPECT_EQ(md->info().fence.generation, 9u);
  ASSERT_TRUE(md->clear_fence().ok());
  EXPECT_EQ(md->info().fence, Fence{});
  ASSERT_TRUE(md->adopt_generation(10, true).ok());
  EXPECT_EQ(md->info().fence.generation, 0u) << "no fence, nothing to follow";
  md.reset();
  md = open_md(64 * kMiB);
  ASSERT_NE(md, nullptr);
  EXPECT_EQ(md->info().fence, Fence{});
}

TEST_F(MetadataTest, UntrackNeedsACleanBitmap) {
  auto md = open_md(64 * kMiB);
  ASSERT_NE(md, nullptr);
  size_t p = *md->peer("p");
  ASSERT_TRUE(md->track_peer(p, 9).ok());
  ASSERT_EQ(*md->mark(p, 3 * kDefaultChunk, 2 * kDefaultChunk), 2u);
  Status s = md->untrack_peer(p);
  EXPECT_EQ(s.code(), Errc::kFailedPrecondition);
  EXPECT_NE(s.message().find("2 dirty chunks"), std::string::npos) << s.message();
  EXPECT_EQ(md->peers()[p].bitmap_generation, 9u);
  ASSERT_TRUE(md->clear(p, 3).ok());
  ASSERT_TRUE(md->clear(p, 4).ok());
  ASSERT_TRUE(md->untrack_peer(p).ok());
  EXPECT_EQ(md->peers()[p].bitmap_generation, 0u);

  // full_sync goes with it.
  ASSERT_TRUE(md->track_peer(p, 10).ok());
  ASSERT_TRUE(md->mark_all(p).ok());
  EXPECT_EQ(md->untrack_peer(p).code(), Errc::kFailedPrecondition);
  for (uint64_t c = md->next_dirty(p, 0); c < 1024; c = md->next_dirty(p, c)) {
    ASSERT_TRUE(md->clear(p, c).ok());
  }
  EXPECT_EQ(md->dirty_count(p), 0u);
  EXPECT_TRUE(md->peers()[p].full_sync);
  ASSERT_TRUE(md->untrack_peer(p).ok());
  EXPECT_FALSE(md->peers()[p].full_sync);
  EXPECT_EQ(md->peers()[p].bitmap_generation, 0u);
}

// --- activity log ---

TEST_F(MetadataTest, ActivityLogFillEvictExhaust) {
  const uint64_t size = 1ull << 30;  // 256 extents
  auto md = open_md(size, kMaxChunk);
  ASSERT_NE(md, nullptr);
  auto never = [](uint64_t) { return false; };
  for (uint64_t e = 0; e < kActivityLogSlots; ++e) {
    auto n = md->activity_begin(e * kActivityExtent + 17, 100, never);
    ASSERT_TRUE(n.ok()) << n.status().to_string();
    EXPECT_EQ(*n, 1u);
  }
  EXPECT_EQ(*md->activity_begin(5 * kActivityExtent, kActivityExtent, never), 0u);  // logged
  EXPECT_EQ(md->activity_extents().size(), kActivityLogSlots);

  // Full, nothing evictable.
  std::vector<uint64_t> asked;
  auto none = md->activity_begin(70 * kActivityExtent, 1, [&](uint64_t e) {
    asked.push_back(e);
    return false;
  });
  EXPECT_EQ(none.status().code(), Errc::kResourceExhausted);
  EXPECT_EQ(asked.size(), kActivityLogSlots);
  EXPECT_EQ(md->activity_extents().back(), kActivityLogSlots - 1);

  // One evictable: replaced.
  auto one = md->activity_begin(70 * kActivityExtent, 1, [](uint64_t e) { return e == 10; });
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, 1u);
  auto logged = md->activity_extents();
  EXPECT_EQ(std::count(logged.begin(), logged.end(), 10u), 0);
  EXPECT_EQ(std::count(logged.begin(), logged.end(), 70u), 1);

  // A range needing two slots with only one evictable: nothing written.
  auto before = md->activity_extents();
  auto two = md->activity_begin(80 * kActivityExtent, 2 * kActivityExtent,
                                [](uint64_t e) { return e == 11; });
  EXPECT_EQ(two.status().code(), Errc::kResourceExhausted);
  EXPECT_EQ(md->activity_extents(), before);

  // Extents of the range itself are never evicted for it: [62, 72) needs
  // 71 and the only candidates offered are in the range.
  std::vector<uint64_t> offered;
  auto own = md->activity_begin(62 * kActivityExtent, 10 * kActivityExtent, [&](uint64_t e) {
    offered.push_back(e);
    return e >= 62 && e < 72;
  });
  EXPECT_EQ(own.status().code(), Errc::kResourceExhausted);
  for (uint64_t e : offered) EXPECT_FALSE(e >= 62 && e < 72) << e;

  // Wider than the log.
  auto wide = md->activity_begin(0, (kActivityLogSlots + 1) * kActivityExtent,
                                 [](uint64_t) { return true; });
  EXPECT_EQ(wide.status().code(), Errc::kResourceExhausted);
  EXPECT_EQ(md->activity_begin(size, 1, never).status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(*md->activity_begin(size, 0, never), 0u);

  // Several evicted at once.
  auto three = md->activity_begin(200 * kActivityExtent, 3 * kActivityExtent,
                                  [](uint64_t e) { return e < 3; });
  ASSERT_TRUE(three.ok()) << three.status().to_string();
  EXPECT_EQ(*three, 3u);
  logged = md->activity_extents();
  EXPECT_EQ(logged.size(), kActivityLogSlots);
  EXPECT_EQ(logged.front(), 3u);
  EXPECT_EQ(logged.back(), 202u);

  md.reset();
  md = open_md(size, kMaxChunk);
  ASSERT_NE(md, nullptr);
  EXPECT_EQ(md->activity_extents(), logged);
  ASSERT_TRUE(md->clear_activity_log().ok());
  EXPECT_TRUE(md->activity_extents().empty());
}

TEST_F(MetadataTest, RecoverActivityLogMarksEveryPeer) {
  // 10 MiB in 64 KiB chunks: extents 0, 1 and a short extent 2 (2 MiB).
  const uint64_t size = 10 * kMiB;
  auto md = open_md(size, 64 * 1024);
  ASSERT_NE(md, nullptr);
  size_t a = *md->peer("a");
  size_t b = *md->peer("b");
  ASSERT_EQ(*md->mark(b, 0, 1), 1u);
  ASSERT_EQ(*md->activity_begin(kActivityExtent - 1, 2, nullptr), 2u);  // extents 0 and 1
  ASSERT_TRUE(md->set_clean(false).ok());
  md.reset();

  md = open_md(size, 64 * 1024);
  ASSERT_NE(md, nullptr);
  EXPECT_FALSE(md->info().clean);
  auto extents = md->recover_activity_log();
  ASSERT_TRUE(extents.ok());
  EXPECT_EQ(*extents, (std::vector<uint64_t>{0, 1}));
  EXPECT_TRUE(md->activity_extents().empty());
  for (size_t p : {a, b}) {
    EXPECT_EQ(md->dirty_count(p), 128u);  // 2 extents of 64 chunks
    EXPECT_EQ(md->next_dirty(p, 0), 0u);
    EXPECT_EQ(md->next_dirty(p, 128), 160u);
  }
  EXPECT_TRUE(md->recover_activity_log()->empty());

  // The last extent is clipped to the volume.
  ASSERT_TRUE(md->mark_extent(a, 2).ok());
  EXPECT_EQ(md->dirty_count(a), 160u);
  EXPECT_EQ(md->mark_extent(a, 3).code(), Errc::kInvalidArgument);
  EXPECT_EQ(md->mark_extent(7, 0).code(), Errc::kInvalidArgument);
  ASSERT_EQ(*md->activity_begin(9 * kMiB, kMiB, nullptr), 1u);
  auto last = md->recover_activity_log();
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(*last, std::vector<uint64_t>{2});
  EXPECT_EQ(md->dirty_count(b), 160u);
  EXPECT_EQ(md->next_dirty(b, 0), 0u);
}

// --- misc ---

TEST(MetadataPaths, DefaultMetadataPath) {
  EXPECT_EQ(default_metadata_path("/mnt/pmem0/db0", "db0"), "/mnt/pmem0/db0.pmirror");
  EXPECT_EQ(default_metadata_path("/dev/dax0.0", "db0"), "/var/lib/pmirror/db0.pmirror");
  EXPECT_EQ(default_metadata_path("relative/file", "v"), "relative/file.pmirror");
  EXPECT_EQ(default_metadata_path("/devices/file", "v"), "/devices/file.pmirror");
  // tmpfs under /dev is a directory of plain files: the pool goes beside them.
  EXPECT_EQ(default_metadata_path("/dev/shm/db0.img", "db0"), "/dev/shm/db0.img.pmirror");
}

TEST(MetadataPaths, UuidToString) {
  EXPECT_EQ(uuid_to_string(
                Uuid{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0, 1, 2, 3, 4, 5, 6, 0xff}),
            "01234567-89ab-cdef-0001-0203040506ff");
}

TEST_F(MetadataTest, ConcurrentCallsFromThreads) {
  const uint64_t chunks = 4096;
  auto md = open_md(chunks * 4096, 4096);
  ASSERT_NE(md, nullptr);
  size_t p = *md->peer("p");
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      // Each thread owns every fourth chunk: marks all of them, clears half.
      for (uint64_t c = t; c < chunks; c += 4) {
        if (!md->mark(p, c * 4096, 4096).ok()) ++errors;
      }
      for (uint64_t c = t; c < chunks; c += 8) {
        if (!md->clear(p, c).ok()) ++errors;
      }
      if (t == 0 && !md->new_generation().ok()) ++errors;
      (void)md->dirty_count(p);
      (void)md->info();
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  // Cleared: c % 8 < 4.
  EXPECT_EQ(md->dirty_count(p), chunks / 2);
  EXPECT_EQ(dirty_chunks(*md, p).size(), chunks / 2);
  EXPECT_TRUE(md->is_dirty(p, 4));
  EXPECT_FALSE(md->is_dirty(p, 3));
}

// --- crashes ---

// What a child reports over a pipe after a call returned.
struct Report {
  uint64_t kind;
  uint64_t a;
  uint64_t b;
  uint64_t c;
};
enum : uint64_t { kMarked = 1, kGeneration = 2, kMarkAllBegin = 3, kMarkAllDone = 4, kCleared = 5 };

bool read_report(int fd, Report* r) {
  auto* p = reinterpret_cast<char*>(r);
  size_t got = 0;
  while (got < sizeof(Report)) {
    ssize_t n = ::read(fd, p + got, sizeof(Report) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}

void report(int fd, Report r) {
  if (::write(fd, &r, sizeof(r)) != static_cast<ssize_t>(sizeof(r))) ::_exit(4);
}

// Runs `body(md, fd)` in a child that opens the pool, lets it send `wanted`
// reports, kills it after a random pause and returns every report it sent.
template <typename Body>
std::vector<Report> run_and_kill(const CopyMetadata::Options& options, int wanted, useconds_t pause,
                                 Body body) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  EXPECT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    auto md = CopyMetadata::open(options);
    if (!md.ok()) ::_exit(2);
    body(**md, fds[1]);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::vector<Report> out;
  Report r{};
  for (int n = 0; n < wanted && read_report(fds[0], &r); ++n) out.push_back(r);
  ::usleep(pause);
  EXPECT_EQ(::kill(pid, SIGKILL), 0);
  int wstatus = 0;
  EXPECT_EQ(::waitpid(pid, &wstatus, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(wstatus)) << "child exited with " << WEXITSTATUS(wstatus);
  while (read_report(fds[0], &r)) out.push_back(r);
  ::close(fds[0]);
  return out;
}

TEST_F(MetadataTest, MarksAndGenerationsSurviveSigkill) {
  const uint64_t size = 64 * kMiB;
  const uint64_t chunk = 4096;
  const uint64_t chunks = size / chunk;
  {
    auto md = open_md(size, chunk);
    ASSERT_NE(md, nullptr);
    ASSERT_EQ(*md->peer("a"), 0u);
    ASSERT_EQ(*md->peer("b"), 1u);
  }
  uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<std::vector<bool>> reported(2, std::vector<bool>(chunks));
  std::vector<uint64_t> gens;  // every committed generation, oldest first

  for (int round = 0; round < 25; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    uint64_t child_seed = rng();
    auto reports =
        run_and_kill(options(size, chunk), 20 + (round % 8) * 40,
                     static_cast<useconds_t>(rng() % 3000), [&](CopyMetadata& md, int fd) {
                       std::mt19937_64 crng(child_seed);
                       for (uint64_t i = 0;; ++i) {
                         if (i % 6 == 5) {
                           auto g = md.new_generation();
                           if (!g.ok()) ::_exit(3);
                           report(fd, {kGeneration, *g, 0, 0});
                           continue;
                         }
                         uint64_t peer = crng() % 2;
                         uint64_t off = crng() % size;
                         uint64_t len = 1 + crng() % std::min(size - off, 2 * kMiB);
                         if (!md.mark(peer, off, len).ok()) ::_exit(3);
                         report(fd, {kMarked, peer, off, len});
                       }
                     });
    ASSERT_FALSE(reports.empty());
    for (const Report& r : reports) {
      if (r.kind == kGeneration) {
        gens.push_back(r.a);
      } else {
        ASSERT_EQ(r.kind, kMarked);
        for (uint64_t c = r.b / chunk; c <= (r.b + r.c - 1) / chunk; ++c) reported[r.a][c] = true;
      }
    }

    auto md = open_md(size, chunk, false);
    ASSERT_NE(md, nullptr);
    for (size_t p = 0; p < 2; ++p) {
      std::vector<uint64_t> dirty = dirty_chunks(*md, p);
      EXPECT_EQ(md->dirty_count(p), dirty.size());
      std::vector<bool> is(chunks);
      for (uint64_t c : dirty) is[c] = true;
      for (uint64_t c = 0; c < chunks; ++c) {
        // Every reported mark is durable (more may be: the one cut short).
        if (reported[p][c]) {
          ASSERT_TRUE(is[c]) << "peer " << p << " chunk " << c;
        }
      }
    }
    // The generations: after the last reported bump, or after one more.
    Generations g = md->info().generations;
    uint64_t last = gens.empty() ? 0 : gens.back();
    if (g.current != last) {
      ASSERT_NE(g.current, 0u);
      ASSERT_EQ(std::count(gens.begin(), gens.end(), g.current), 0);
      gens.push_back(g.current);  // committed, not reported
    }
    Generations want;
    want.current = gens.empty() ? 0 : gens.back();
    for (size_t i = 0; i < kHistory && i + 1 < gens.size(); ++i) {
      want.history[i] = gens[gens.size() - 2 - i];
    }
    EXPECT_EQ(g, want);
    // Untracked peers started tracking at the first bump from a nonzero
    // current, never anything else.
    for (const PeerInfo& p : md->peers()) {
      EXPECT_EQ(p.bitmap_generation, gens.size() >= 2 ? gens[0] : 0) << p.name;
    }
  }
  EXPECT_GE(gens.size(), 8u);
}

TEST_F(MetadataTest, MarkAllAndClearsSurviveSigkill) {
  const uint64_t chunks = 512;
  const uint64_t size = chunks * 4096;
  {
    auto md = open_md(size, 4096);
    ASSERT_NE(md, nullptr);
    ASSERT_EQ(*md->peer("p"), 0u);
  }
  uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  bool any_done = false;
  for (int round = 0; round < 25; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // Each cycle: mark every chunk, then clear them in order.
    auto reports =
        run_and_kill(options(size, 4096), static_cast<int>(rng() % (2 * chunks)),
                     static_cast<useconds_t>(rng() % 2000), [&](CopyMetadata& md, int fd) {
                       for (;;) {
                         report(fd, {kMarkAllBegin, 0, 0, 0});
                         if (!md.mark_all(0).ok()) ::_exit(3);
                         report(fd, {kMarkAllDone, 0, 0, 0});
                         for (uint64_t c = 0; c < chunks; ++c) {
                           if (!md.clear(0, c).ok()) ::_exit(3);
                           report(fd, {kCleared, c, 0, 0});
                         }
                       }
                     });
    auto md = open_md(size, 4096, false);
    ASSERT_NE(md, nullptr);
    // Before the child starts, every chunk is clean (the first round) or
    // every chunk of the previous cycle was cleared... or it was killed
    // mid-cycle: the dirty chunks are always a suffix [k, chunks).
    std::vector<uint64_t> dirty = dirty_chunks(*md, 0);
    uint64_t k = chunks - dirty.size();
    for (size_t i = 0; i < dirty.size(); ++i) ASSERT_EQ(dirty[i], k + i);
    EXPECT_EQ(md->dirty_count(0), dirty.size());
    std::set<uint64_t> allowed;
    const Report& last = reports.empty() ? Report{kMarkAllBegin, 0, 0, 0} : reports.back();
    if (last.kind == kMarkAllBegin) {
      // Cut short in mark_all: before it (all clean) or after it.
      allowed = {chunks, 0};
    } else if (last.kind == kMarkAllDone) {
      allowed = {0, 1};
    } else {
      ASSERT_EQ(last.kind, kCleared);
      allowed = {last.a + 1, std::min(last.a + 2, chunks)};
    }
    EXPECT_EQ(allowed.count(k), 1u) << "k=" << k << " last kind " << last.kind << " a " << last.a;
    if (std::any_of(reports.begin(), reports.end(),
                    [](const Report& r) { return r.kind == kMarkAllDone; })) {
      any_done = true;
    }
    if (any_done) {
      EXPECT_TRUE(md->peers()[0].full_sync);
    }
    // Leave the pool clean for the next round's "all clean before".
    for (uint64_t c : dirty) ASSERT_TRUE(md->clear(0, c).ok());
  }
}

}  // namespace
}  // namespace pmirror::metadata

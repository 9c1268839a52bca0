#include "support/records.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>

namespace pmirror::testing {
namespace {

constexpr size_t kHeader = 32;

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void put64(std::byte* p, uint64_t v) { std::memcpy(p, &v, 8); }
void put32(std::byte* p, uint32_t v) { std::memcpy(p, &v, 4); }
uint64_t get64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
uint32_t get32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

RecordLayout::RecordLayout(uint64_t volume_size, uint64_t record_size)
    : volume_size_(volume_size), record_size_(record_size) {
  if (record_size < kRecordMinSize || record_size % 8 != 0 || record_size > volume_size) {
    throw std::invalid_argument("record size must be a multiple of 8, >= 64, <= the volume");
  }
  slots_ = volume_size / record_size;
  // A stride near the golden ratio of the slot count, coprime with it:
  // (seq - 1) * stride mod slots is then a permutation.
  stride_ = std::max<uint64_t>(1, slots_ * 618 / 1000) | 1;
  while (std::gcd(stride_, slots_) != 1) stride_ += 2;
  if (slots_ == 1) stride_ = 1;
  seq_of_slot_.assign(slots_, 0);
  for (uint64_t seq = 1; seq <= slots_; ++seq) seq_of_slot_[slot_of(seq)] = seq;
}

void make_record(std::byte* dst, const RecordLayout& layout, uint64_t seq, uint64_t tag) {
  const uint64_t size = layout.record_size();
  put64(dst, kRecordMagic);
  put64(dst + 8, seq);
  put64(dst + 16, tag);
  put32(dst + 24, static_cast<uint32_t>(size));
  put32(dst + 28, static_cast<uint32_t>(layout.slot_of(seq)));
  uint64_t state = seq * 0x2545f4914f6cdd1dull ^ tag;
  for (uint64_t at = kHeader; at + 16 <= size; at += 8) put64(dst + at, splitmix64(state));
  put64(dst + size - 8, XXH64(dst, size - 8, 0));
}

RecordView read_record(const uint8_t* volume, const RecordLayout& layout, uint64_t seq) {
  const uint64_t size = layout.record_size();
  const uint8_t* p = volume + layout.offset_of(seq);
  RecordView view;
  bool zero = std::all_of(p, p + size, [](uint8_t b) { return b == 0; });
  if (zero) return view;
  view.state = RecordState::kTorn;
  if (get64(p) != kRecordMagic || get64(p + 8) != seq || get32(p + 24) != size ||
      get32(p + 28) != layout.slot_of(seq)) {
    return view;
  }
  if (XXH64(p, size - 8, 0) != get64(p + size - 8)) return view;
  // The checksum could have been copied along with a stale header: compare
  // the payload too.
  uint64_t tag = get64(p + 16);
  std::vector<std::byte> expected(size);
  make_record(expected.data(), layout, seq, tag);
  if (std::memcmp(expected.data(), p, size) != 0) return view;
  view.state = RecordState::kValid;
  view.tag = tag;
  return view;
}

RecordScan scan_records(const uint8_t* volume, const RecordLayout& layout) {
  RecordScan scan;
  scan.records.resize(layout.slots() + 1);
  bool gap = false;
  for (uint64_t seq = 1; seq <= layout.slots(); ++seq) {
    RecordView view = read_record(volume, layout, seq);
    scan.records[seq] = view;
    switch (view.state) {
      case RecordState::kEmpty:
        ++scan.empty;
        break;
      case RecordState::kTorn:
        ++scan.torn;
        break;
      case RecordState::kValid:
        ++scan.valid;
        scan.max_valid = seq;
        break;
    }
    if (view.state != RecordState::kValid) gap = true;
    if (!gap) scan.contiguous = seq;
  }
  return scan;
}

std::string RecordScan::summary() const {
  std::ostringstream out;
  out << "slots=" << (records.empty() ? 0 : records.size() - 1) << " valid=" << valid
      << " torn=" << torn << " empty=" << empty << " contiguous=1.." << contiguous
      << " max_valid=" << max_valid;
  return out.str();
}

std::string check_acknowledged(const RecordScan& scan, uint64_t first, uint64_t acked,
                               uint64_t window, uint64_t tag) {
  std::ostringstream problems;
  int count = 0;
  auto problem = [&](const std::string& text) {
    if (count++ < 8) problems << text << "; ";
  };
  const uint64_t slots = scan.records.size() - 1;
  uint64_t prefix_end = first - 1;  // [first, prefix_end] all valid
  for (uint64_t seq = first; seq <= slots && scan.records[seq].state == RecordState::kValid;
       ++seq) {
    prefix_end = seq;
  }
  for (uint64_t seq = first; seq <= std::min(acked, slots); ++seq) {
    const RecordView& r = scan.records[seq];
    if (r.state != RecordState::kValid) {
      problem("acknowledged record " + std::to_string(seq) + " is " +
              (r.state == RecordState::kEmpty ? "missing" : "torn"));
    } else if (tag != 0 && r.tag != tag) {
      problem("record " + std::to_string(seq) + " has tag " + std::to_string(r.tag) +
              ", expected " + std::to_string(tag));
    }
  }
  for (uint64_t seq = acked + 1; seq <= std::min(acked + window, slots); ++seq) {
    if (scan.records[seq].state == RecordState::kValid && seq > prefix_end) {
      problem("record " + std::to_string(seq) + " (in flight) is present but record " +
              std::to_string(prefix_end + 1) + " before it is not");
    }
  }
  for (uint64_t seq = acked + window + 1; seq <= slots; ++seq) {
    if (scan.records[seq].state != RecordState::kEmpty) {
      problem("record " + std::to_string(seq) + " was never started but its slot is " +
              (scan.records[seq].state == RecordState::kValid ? "valid" : "not empty"));
    }
  }
  if (count > 8) problems << "(" << count - 8 << " more)";
  return problems.str();
}

std::string check_present(const RecordScan& scan, uint64_t first, uint64_t last, uint64_t tag) {
  std::ostringstream problems;
  int count = 0;
  const uint64_t slots = scan.records.size() - 1;
  for (uint64_t seq = first; seq <= std::min(last, slots); ++seq) {
    const RecordView& r = scan.records[seq];
    std::string problem;
    if (r.state != RecordState::kValid) {
      problem = "record " + std::to_string(seq) + " is " +
                (r.state == RecordState::kEmpty ? "missing" : "torn");
    } else if (tag != 0 && r.tag != tag) {
      problem = "record " + std::to_string(seq) + " has tag " + std::to_string(r.tag) +
                ", expected " + std::to_string(tag);
    }
    if (!problem.empty() && count++ < 8) problems << problem << "; ";
  }
  if (count > 8) problems << "(" << count - 8 << " more)";
  return problems.str();
}

std::string check_absent(const RecordScan& scan, uint64_t first, uint64_t last) {
  std::ostringstream problems;
  int count = 0;
  const uint64_t slots = scan.records.size() - 1;
  for (uint64_t seq = first; seq <= std::min(last, slots); ++seq) {
    if (scan.records[seq].state != RecordState::kEmpty && count++ < 8) {
      problems << "record " << seq << " should be absent; ";
    }
  }
  if (count > 8) problems << "(" << count - 8 << " more)";
  return problems.str();
}

std::vector<uint64_t> record_chunks(const RecordLayout& layout, uint64_t from, uint64_t to,
                                    uint64_t chunk) {
  std::set<uint64_t> chunks;
  for (uint64_t seq = std::max<uint64_t>(from, 1); seq <= std::min(to, layout.slots()); ++seq) {
    uint64_t begin = layout.offset_of(seq);
    uint64_t end = begin + layout.record_size() - 1;
    for (uint64_t c = begin / chunk; c <= end / chunk; ++c) chunks.insert(c);
  }
  return {chunks.begin(), chunks.end()};
}

}  // namespace pmirror::testing

// Self-checking records for fault-injection tests (tests/integration/
// recovery_test.cpp, tests/tools/record_writer.cpp, the lab scripts).
//
// A volume is cut into `slots` records of `record_size` bytes. Record `seq`
// (1..slots) lives in slot `(seq - 1) * stride mod slots` -- a permutation,
// so consecutive records land far apart (many chunks, several activity
// extents) and no slot is written twice. Each record is
//
//   magic u64 | seq u64 | tag u64 | length u32 | slot u32 | payload ... | xxh64 u64
//
// with a payload derived from (seq, tag) and an XXH64 of everything before
// it. Reading a slot tells empty (all zeros), valid (the expected seq,
// intact), or torn/foreign (anything else).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pmirror::testing {

inline constexpr uint64_t kRecordMagic = 0x44524f4345524d50ull;  // "PMRECORD"
inline constexpr uint64_t kRecordMinSize = 64;

class RecordLayout {
 public:
  // record_size: a multiple of 8, at least kRecordMinSize, dividing nothing
  // in particular (the tail of the volume past the last slot is unused).
  RecordLayout(uint64_t volume_size, uint64_t record_size);

  uint64_t volume_size() const { return volume_size_; }
  uint64_t record_size() const { return record_size_; }
  uint64_t slots() const { return slots_; }
  // seq in [1, slots].
  uint64_t slot_of(uint64_t seq) const { return ((seq - 1) * stride_) % slots_; }
  uint64_t offset_of(uint64_t seq) const { return slot_of(seq) * record_size_; }
  uint64_t seq_at_slot(uint64_t slot) const { return seq_of_slot_[slot]; }

 private:
  uint64_t volume_size_;
  uint64_t record_size_;
  uint64_t slots_;
  uint64_t stride_;
  std::vector<uint64_t> seq_of_slot_;
};

// Writes record `seq` (with `tag`) into dst[0, record_size).
void make_record(std::byte* dst, const RecordLayout& layout, uint64_t seq, uint64_t tag);

enum class RecordState { kEmpty, kValid, kTorn };
struct RecordView {
  RecordState state = RecordState::kEmpty;
  uint64_t tag = 0;  // kValid only
};
// Reads the slot of `seq` out of a whole-volume image.
RecordView read_record(const uint8_t* volume, const RecordLayout& layout, uint64_t seq);

// What a copy holds, seq by seq (index 0 unused).
struct RecordScan {
  std::vector<RecordView> records;  // [0, slots]
  uint64_t valid = 0, torn = 0, empty = 0;
  uint64_t max_valid = 0;       // highest seq present and intact
  uint64_t contiguous = 0;      // records 1..contiguous are all valid
  std::string summary() const;  // one line, for test messages and the tool
};
RecordScan scan_records(const uint8_t* volume, const RecordLayout& layout);

// The rules for a copy after the writer died having printed "acked <acked>"
// last, with at most `window` persists in flight beyond it:
//  - every seq in [first, acked] is valid (and carries `tag` unless tag is 0);
//  - a seq in (acked, acked + window] may be anything, but if it is valid
//    every earlier seq from `first` is valid too;
//  - every seq in (acked + window, slots] is empty.
// Returns "" when they hold, else what broke (first few problems).
std::string check_acknowledged(const RecordScan& scan, uint64_t first, uint64_t acked,
                               uint64_t window, uint64_t tag);

// Only that every seq in [first, last] is valid (with `tag` unless 0).
std::string check_present(const RecordScan& scan, uint64_t first, uint64_t last, uint64_t tag);
// Only that every seq in [first, last] is empty.
std::string check_absent(const RecordScan& scan, uint64_t first, uint64_t last);

// Distinct chunks (of `chunk` bytes) that records [from, to] touch.
std::vector<uint64_t> record_chunks(const RecordLayout& layout, uint64_t from, uint64_t to,
                                    uint64_t chunk);

}  // namespace pmirror::testing

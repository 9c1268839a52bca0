// pmirror-record-writer: writes self-checking records (tests/support/
// records.h) through libpmirror and says which ones were acknowledged, so
// that a test may kill -9 it at any moment and know what must be on the
// replicas. Also checks copies and answers small questions for scripts.
//
//   pmirror-record-writer write --config FILE --volume V --node NODE [--identity ID]
//        [--record-size 4096] [--first-seq 1] [--count N] [--tag T] [--depth D]
//        [--rate RECORDS_PER_S] [--hold-open] [--keep-going] [--open-timeout SEC]
//        [--threads N]
//     prints "opened V size S slots N", then "acked SEQ" after each persist
//     returns (flushed at once), "done LAST" when count records are written.
//     SIGTERM/SIGINT: stops after the persist in progress, drains, closes,
//     prints "stopped LAST" and exits 0. --hold-open: after the last record,
//     prints "idle" and keeps the volume open until SIGTERM. Exit 1 on a
//     failed persist (without --keep-going: then "failed SEQ MESSAGE").
//     --threads N: N threads persist records first+t, first+t+N, ... at
//     once; "acked SEQ" in any order, "done N" the number acknowledged.
//     --timing (one thread, --depth 1): "acked SEQ LATENCY_US UNIX_MS", the
//     persist's duration and when it returned (scripts/soak.sh); "failed"
//     lines get UNIX_MS before the message.
//     --c-api (one thread, --depth 1): through the C API (pmirror.h:
//     pmirror_open_from_config, pmirror_persist, pmirror_close), as a C
//     application writes (scripts/soak.sh); --hold-open is not taken.
//
//   pmirror-record-writer check --path P --size S [--record-size 4096]
//        [--acked A] [--first 1] [--window 1] [--tag T]
//     reads the copy through a mapping (devdax too), prints a summary, how
//     many acknowledged records are not intact ("acknowledged F..A, not
//     intact N") and the rules of check_acknowledged that broke; exit 0 if
//     none did.
//     Without --acked: only the summary (exit 0).
//     --last L (instead of --acked): only that records first..L are valid
//     (with --tag), whatever else the copy holds (check_present: another
//     writer's records elsewhere are no fault); with --absent, that they
//     are all empty (check_absent). For scripts where a second writer took
//     over (scripts/pacemaker-cluster.sh).
//
//   pmirror-record-writer chunks --size S [--record-size 4096] --from A --to B --chunk C
//     prints how many distinct chunks records A..B touch.
//
//   pmirror-record-writer status-field --volume V --peer P --field F [--role primary]
//     reads `pmirrorctl status --json` on stdin and prints peers[P].F of
//     volume V (exit 1 if absent). F may be dotted (resync.left_bytes).
#include <pmirror/pmirror.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iostream>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <pmirror/pmirror.hpp>
#include <thread>
#include <vector>

#include "config/config.h"
#include "region/region.h"
#include "support/records.h"

namespace {

using namespace std::chrono_literals;
using pmirror::testing::RecordLayout;

volatile std::sig_atomic_t g_stop = 0;
void on_stop(int) { g_stop = 1; }

uint64_t size_arg(const std::string& text, const char* what) {
  auto size = pmirror::config::parse_size(text);
  if (!size.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, size.status().message().c_str());
    std::exit(2);
  }
  return *size;
}

std::mutex g_say_mutex;  // writer threads share stdout, a line at a time

void say(const std::string& line) {
  std::lock_guard lock(g_say_mutex);
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

struct WriteArgs {
  std::string config, volume, node, identity = "app";
  std::string record_size = "4096";
  uint64_t first_seq = 1, count = 0, tag = 1, depth = 1, threads = 1;
  double rate = 0;
  bool hold_open = false, keep_going = false, timing = false, c_api = false;
  int open_timeout = 0;
};

// --threads N: thread t writes records first+t, first+t+N, ... with a
// persist each (depth 1), all at once on the one volume. "acked SEQ" lines
// then come in any order; "done N" counts the records acknowledged.
int write_from_threads(const WriteArgs& a, pmirror::Volume& volume, const RecordLayout& layout,
                       uint64_t last) {
  std::atomic<uint64_t> acknowledged{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> writers;
  for (uint64_t t = 0; t < a.threads; ++t) {
    writers.emplace_back([&, t] {
      for (uint64_t seq = a.first_seq + t; seq <= last && !g_stop; seq += a.threads) {
        uint64_t offset = layout.offset_of(seq);
        pmirror::testing::make_record(volume.data() + offset, layout, seq, a.tag);
        pmirror::Status s = volume.persist(offset, layout.record_size());
        if (!s.ok()) {
          say("failed " + std::to_string(seq) + " " + s.message());
          ++failures;
          if (!a.keep_going) return;
          continue;
        }
        ++acknowledged;
        say("acked " + std::to_string(seq));
      }
    });
  }
  for (auto& writer : writers) writer.join();
  if (!g_stop && failures == 0) {
    say("done " + std::to_string(acknowledged.load()));
    if (a.hold_open) {
      say("idle");
      while (!g_stop) std::this_thread::sleep_for(50ms);
    }
  }
  if (g_stop) say("stopped " + std::to_string(acknowledged.load()));
  return failures == 0 ? 0 : 1;
}

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The same records, one at a time, through the C API.
int run_write_c(const WriteArgs& a) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(a.open_timeout);
  pmirror_volume* volume = nullptr;
  int rc = 0;
  while (true) {
    rc = pmirror_open_from_config(a.config.c_str(), a.volume.c_str(), a.identity.c_str(),
                                  a.node.c_str(), &volume);
    if (rc == 0 || g_stop || std::chrono::steady_clock::now() >= deadline) break;
    std::fprintf(stderr, "open failed (retrying): %s: %s\n", pmirror_strerror(rc),
                 pmirror_errormsg());
    std::this_thread::sleep_for(500ms);
  }
  if (rc != 0) {
    std::fprintf(stderr, "cannot open %s as %s: %s: %s\n", a.volume.c_str(), a.node.c_str(),
                 pmirror_strerror(rc), pmirror_errormsg());
    return 1;
  }
  RecordLayout layout(pmirror_size(volume), size_arg(a.record_size, "--record-size"));
  say("opened " + a.volume + " size " + std::to_string(pmirror_size(volume)) + " slots " +
      std::to_string(layout.slots()));
  const uint64_t last =
      a.count == 0 ? layout.slots() : std::min(layout.slots(), a.first_seq + a.count - 1);
  auto* base = static_cast<std::byte*>(pmirror_data(volume));
  uint64_t acked = a.first_seq - 1;
  int failures = 0;
  auto next_due = std::chrono::steady_clock::now();
  for (uint64_t seq = a.first_seq; seq <= last && !g_stop; ++seq) {
    if (a.rate > 0) {
      auto due = next_due;
      next_due = std::max(due, std::chrono::steady_clock::now()) +
                 std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                     std::chrono::duration<double>(1.0 / a.rate));
      while (std::chrono::steady_clock::now() < due && !g_stop) {
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
            due - std::chrono::steady_clock::now(), 20ms));
      }
      if (g_stop) break;
    }
    const uint64_t offset = layout.offset_of(seq);
    pmirror::testing::make_record(base + offset, layout, seq, a.tag);
    const auto t0 = std::chrono::steady_clock::now();
    rc = pmirror_persist(volume, offset, layout.record_size());
    const auto took = std::chrono::steady_clock::now() - t0;
    const std::string when = a.timing ? " " + std::to_string(unix_ms()) : "";
    if (rc != 0) {
      say("failed " + std::to_string(seq) + when + " " + pmirror_strerror(rc) + ": " +
          pmirror_errormsg());
      ++failures;
      if (!a.keep_going) break;
      continue;
    }
    acked = seq;
    say("acked " + std::to_string(seq) +
        (a.timing ? " " + std::to_string(
                              std::chrono::duration_cast<std::chrono::microseconds>(took).count())
                  : "") +
        when);
  }
  if (!g_stop && (failures == 0 || a.keep_going)) say("done " + std::to_string(acked));
  if (g_stop) say("stopped " + std::to_string(acked));
  rc = pmirror_close(&volume);
  if (rc != 0) {
    std::fprintf(stderr, "close: %s: %s\n", pmirror_strerror(rc), pmirror_errormsg());
    return 1;
  }
  say("closed");
  return failures == 0 ? 0 : 1;
}

int run_write(const WriteArgs& a) {
  if (a.threads > 1 && (a.depth > 1 || a.rate > 0)) {
    std::fprintf(stderr, "--threads takes neither --depth nor --rate\n");
    return 2;
  }
  if ((a.timing || a.c_api) && (a.threads > 1 || a.depth > 1)) {
    std::fprintf(stderr, "--timing and --c-api take one thread and --depth 1\n");
    return 2;
  }
  if (a.c_api && a.hold_open) {
    std::fprintf(stderr, "--c-api does not take --hold-open\n");
    return 2;
  }
  std::signal(SIGTERM, on_stop);
  std::signal(SIGINT, on_stop);
  if (a.c_api) return run_write_c(a);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(a.open_timeout);
  pmirror::Result<std::unique_ptr<pmirror::Volume>> opened =
      pmirror::Status(pmirror::Errc::kInternal, "not opened");
  while (true) {
    opened = pmirror::Volume::open_from_config(a.config, a.volume, a.identity, a.node);
    if (opened.ok() || g_stop || std::chrono::steady_clock::now() >= deadline) break;
    std::fprintf(stderr, "open failed (retrying): %s\n", opened.status().to_string().c_str());
    std::this_thread::sleep_for(500ms);
  }
  if (!opened.ok()) {
    std::fprintf(stderr, "cannot open %s as %s: %s\n", a.volume.c_str(), a.node.c_str(),
                 opened.status().to_string().c_str());
    return 1;
  }
  auto& volume = *opened;
  RecordLayout layout(volume->size(), size_arg(a.record_size, "--record-size"));
  say("opened " + a.volume + " size " + std::to_string(volume->size()) + " slots " +
      std::to_string(layout.slots()));
  uint64_t last =
      a.count == 0 ? layout.slots() : std::min(layout.slots(), a.first_seq + a.count - 1);
  if (a.threads > 1) {
    int status = write_from_threads(a, *volume, layout, last);
    volume.reset();
    say("closed");
    return status;
  }
  std::deque<std::pair<uint64_t, uint64_t>> in_flight;  // (volume sequence, record seq)
  uint64_t acked = a.first_seq - 1;
  int failures = 0;
  auto next_due = std::chrono::steady_clock::now();
  std::chrono::steady_clock::duration slowest{0};
  uint64_t slowest_seq = 0;
  auto complete_one = [&]() -> bool {
    auto [sequence, seq] = in_flight.front();
    in_flight.pop_front();
    pmirror::Status s = volume->wait(sequence);
    if (!s.ok()) {
      say("failed " + std::to_string(seq) + " " + s.message());
      std::fprintf(stderr, "persist of record %llu failed: %s\n",
                   static_cast<unsigned long long>(seq), s.to_string().c_str());
      ++failures;
      return a.keep_going;
    }
    acked = seq;
    say("acked " + std::to_string(seq));
    return true;
  };
  bool ok = true;
  uint64_t seq = a.first_seq;
  for (; seq <= last && !g_stop && ok; ++seq) {
    if (a.rate > 0) {
      // One record every 1/rate seconds after the previous one started: no
      // burst to catch up after a slow stretch (it would only inflate the
      // chunks written around a fault).
      auto due = next_due;
      next_due = std::max(due, std::chrono::steady_clock::now()) +
                 std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                     std::chrono::duration<double>(1.0 / a.rate));
      while (std::chrono::steady_clock::now() < due && !g_stop) {
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
            due - std::chrono::steady_clock::now(), 20ms));
      }
      if (g_stop) break;
    }
    uint64_t offset = layout.offset_of(seq);
    pmirror::testing::make_record(volume->data() + offset, layout, seq, a.tag);
    if (a.depth <= 1) {
      auto t0 = std::chrono::steady_clock::now();
      pmirror::Status s = volume->persist(offset, layout.record_size());
      if (std::chrono::steady_clock::now() - t0 > slowest) {
        slowest = std::chrono::steady_clock::now() - t0;
        slowest_seq = seq;
      }
      const auto took = std::chrono::steady_clock::now() - t0;
      const std::string when =
          a.timing ? " " + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                              std::chrono::system_clock::now().time_since_epoch())
                                              .count())
                   : "";
      if (!s.ok()) {
        say("failed " + std::to_string(seq) + when + " " + s.message());
        std::fprintf(stderr, "persist of record %llu failed: %s\n",
                     static_cast<unsigned long long>(seq), s.to_string().c_str());
        ++failures;
        ok = a.keep_going;
        continue;
      }
      acked = seq;
      if (a.timing) {
        say("acked " + std::to_string(seq) + " " +
            std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(took).count()) +
            when);
      } else {
        say("acked " + std::to_string(seq));
      }
      continue;
    }
    auto sequence = volume->persist_async(offset, layout.record_size());
    if (!sequence.ok()) {
      say("failed " + std::to_string(seq) + " " + sequence.status().message());
      ++failures;
      ok = a.keep_going;
      continue;
    }
    in_flight.emplace_back(*sequence, seq);
    while (ok && in_flight.size() >= a.depth) ok = complete_one();
  }
  while (ok && !in_flight.empty()) ok = complete_one();
  if (!g_stop && ok) {
    say("done " + std::to_string(acked));
    if (a.hold_open) {
      say("idle");
      while (!g_stop) std::this_thread::sleep_for(50ms);
    }
  }
  if (g_stop) say("stopped " + std::to_string(acked));
  if (slowest_seq != 0) {
    say("slowest persist " +
        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(slowest).count()) +
        " ms (record " + std::to_string(slowest_seq) + ")");
  }
  volume.reset();
  say("closed");
  return failures == 0 ? 0 : 1;
}

int run_check(const std::string& path, uint64_t size, uint64_t record_size, int64_t acked,
              uint64_t first, uint64_t window, uint64_t tag, uint64_t last, bool absent) {
  auto region = pmirror::region::Region::open({path, size, false});
  if (!region.ok()) {
    std::fprintf(stderr, "%s\n", region.status().to_string().c_str());
    return 2;
  }
  RecordLayout layout(size, record_size);
  auto scan =
      pmirror::testing::scan_records(reinterpret_cast<const uint8_t*>((*region)->data()), layout);
  say(path + ": " + scan.summary());
  if (last != 0) {
    std::string problems = absent ? pmirror::testing::check_absent(scan, first, last)
                                  : pmirror::testing::check_present(scan, first, last, tag);
    std::string range = std::to_string(first) + ".." + std::to_string(last);
    if (problems.empty()) {
      say("OK: records " + range + (absent ? " absent" : " intact"));
      return 0;
    }
    say("FAILED: " + problems);
    return 1;
  }
  if (acked < 0) return 0;
  uint64_t lost = 0;  // acknowledged and not intact here (scripts/soak.sh counts them)
  for (uint64_t seq = first;
       seq <= std::min<uint64_t>(static_cast<uint64_t>(acked), layout.slots()); ++seq) {
    if (scan.records[seq].state != pmirror::testing::RecordState::kValid) ++lost;
  }
  say("acknowledged " + std::to_string(first) + ".." + std::to_string(acked) + ", not intact " +
      std::to_string(lost));
  std::string problems =
      pmirror::testing::check_acknowledged(scan, first, static_cast<uint64_t>(acked), window, tag);
  if (problems.empty()) {
    say("OK: records " + std::to_string(first) + ".." + std::to_string(acked) +
        " intact, nothing beyond the window");
    return 0;
  }
  say("FAILED: " + problems);
  return 1;
}

const nlohmann::json* dotted(const nlohmann::json& object, const std::string& field) {
  const nlohmann::json* at = &object;
  size_t start = 0;
  while (start <= field.size()) {
    size_t dot = field.find('.', start);
    std::string key =
        field.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!at->is_object() || !at->contains(key)) return nullptr;
    at = &(*at)[key];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return at;
}

int run_status_field(const std::string& volume, const std::string& peer, const std::string& field,
                     const std::string& role) {
  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  auto merged = nlohmann::json::parse(input, nullptr, false);
  if (merged.is_discarded()) {
    std::fprintf(stderr, "stdin is not JSON\n");
    return 2;
  }
  std::vector<nlohmann::json> processes;
  if (merged.contains("processes")) {
    for (const auto& p : merged["processes"]) processes.push_back(p);
  } else {
    processes.push_back(merged);
  }
  for (const auto& process : processes) {
    if (!process.contains("volumes")) continue;
    for (const auto& v : process["volumes"]) {
      if (v.value("name", "") != volume || (!role.empty() && v.value("role", "") != role)) continue;
      if (peer.empty()) {
        const nlohmann::json* value = dotted(v, field);
        if (value == nullptr) continue;
        say(value->is_string() ? value->get<std::string>() : value->dump());
        return 0;
      }
      for (const auto& p : v.value("peers", nlohmann::json::array())) {
        std::string name = p.value("name", "");
        if (name != peer && name.rfind(peer + "@", 0) != 0) continue;
        const nlohmann::json* value = dotted(p, field);
        if (value == nullptr) continue;
        say(value->is_string() ? value->get<std::string>() : value->dump());
        return 0;
      }
    }
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"pmirror-record-writer: self-checking records for fault-injection tests"};
  app.require_subcommand(1);

  WriteArgs w;
  auto* write = app.add_subcommand("write", "write records through libpmirror");
  write->add_option("--config", w.config, "cluster file")->required();
  write->add_option("--volume", w.volume, "volume")->required();
  write->add_option("--node", w.node, "open as this node")->required();
  write->add_option("--identity", w.identity, "identity (allowed_peers)");
  write->add_option("--record-size", w.record_size, "bytes per record (default 4096)");
  write->add_option("--first-seq", w.first_seq, "first record to write (default 1)");
  write->add_option("--count", w.count, "records to write (0: up to the last slot)");
  write->add_option("--tag", w.tag, "a number stored in every record (default 1)");
  write->add_option("--depth", w.depth, "asynchronous persists in flight (default 1)");
  write->add_option("--rate", w.rate, "records per second (0: as fast as possible)");
  write->add_option("--threads", w.threads,
                    "writer threads, each persisting its own records (default 1; more: "
                    "depth 1, no --rate)");
  write->add_flag("--hold-open", w.hold_open, "keep the volume open after the last record");
  write->add_flag("--keep-going", w.keep_going, "report failed persists and go on");
  write->add_flag("--timing", w.timing, "acked lines with the latency (us) and the time (ms)");
  write->add_flag("--c-api", w.c_api, "write through the C API (pmirror.h)");
  write->add_option("--open-timeout", w.open_timeout, "retry opening for this many seconds");

  std::string path, size = "0", record_size = "4096", field, peer, volume, role = "primary";
  int64_t acked = -1;
  uint64_t first = 1, window = 1, tag = 0, from = 1, to = 0, last = 0;
  bool absent = false;
  std::string chunk = "64KiB";
  auto* check = app.add_subcommand("check", "check the records of a copy");
  check->add_option("--path", path, "the copy")->required();
  check->add_option("--size", size, "volume size")->required();
  check->add_option("--record-size", record_size, "bytes per record");
  check->add_option("--acked", acked, "last acknowledged record");
  check->add_option("--first", first, "first record of the run (default 1)");
  check->add_option("--window", window, "persists in flight beyond --acked (default 1)");
  check->add_option("--tag", tag, "expected tag (0: any)");
  check->add_option("--last", last,
                    "only check that records --first..--last are intact (not with --acked)");
  check->add_flag("--absent", absent, "with --last: that records --first..--last are empty");

  auto* chunks = app.add_subcommand("chunks", "count the chunks records touch");
  chunks->add_option("--size", size, "volume size")->required();
  chunks->add_option("--record-size", record_size, "bytes per record");
  chunks->add_option("--from", from, "first record")->required();
  chunks->add_option("--to", to, "last record")->required();
  chunks->add_option("--chunk", chunk, "chunk size (default 64KiB)");

  auto* status_field = app.add_subcommand("status-field", "a peer's field from status --json");
  status_field->add_option("--volume", volume, "volume")->required();
  status_field->add_option("--peer", peer, "peer name (empty: the volume's own field)");
  status_field->add_option("--field", field, "field, dotted for nested")->required();
  status_field->add_option("--role", role, "role of the volume (default primary; '' any)");

  CLI11_PARSE(app, argc, argv);
  if (*write) return run_write(w);
  if (*check) {
    return run_check(path, size_arg(size, "--size"), size_arg(record_size, "--record-size"), acked,
                     first, window, tag, last, absent);
  }
  if (*chunks) {
    RecordLayout layout(size_arg(size, "--size"), size_arg(record_size, "--record-size"));
    say(std::to_string(
        pmirror::testing::record_chunks(layout, from, to, size_arg(chunk, "--chunk")).size()));
    return 0;
  }
  return run_status_field(volume, peer, field, role);
}

// pmirrorctl's presentation, against golden strings.
#include <gtest/gtest.h>

#include <limits>

#include "common/rfc3339.h"
#include "control/control.h"
#include "unit/control/canned.h"

namespace pmirror::control {
namespace {

using json = nlohmann::json;

HumanFormat at(const char* now) {
  HumanFormat format;
  format.now = *parse_rfc3339(now);
  format.utc = true;
  return format;
}

TEST(ControlFormat, StatusGolden) {
  json merged = merge_status({testing::initiator_status(), testing::daemon_status()});
  EXPECT_EQ(format_status_human(merged, std::nullopt, at("2026-11-29T16:03:15Z")),
            testing::kHumanStatus);
}

TEST(ControlFormat, StatusFilteredByVolume) {
  json merged = merge_status({testing::initiator_status(), testing::daemon_status()});
  EXPECT_EQ(
      format_status_human(merged, "db1", at("2026-11-29T16:03:15Z")),
      "db1 role:replica size:256MiB backing:devdax session-generation:3 last-seq:4567 (pmirrord "
      "node2)\n"
      "  app1@10.0.0.1 connection:connected since 2026-11-28 09:00:00 (1d ago) "
      "persists:4567\n");
  EXPECT_EQ(format_status_human(merged, "nope", at("2026-11-29T16:03:15Z")), "");
}

// A replica lists its writers by identity, the address as a field, and
// says of a session that ended that it did, and when.
TEST(ControlFormat, AReplicasWritersByIdentityAndEndedSessionsSaySo) {
  json live = {
      {"name", "app1"},       {"address", "10.0.0.1:40412"},     {"ended", false},
      {"state", "connected"}, {"since", "2026-11-29T16:01:00Z"}, {"acknowledged_sequence", 120},
      {"persists", 120}};
  json ended = {{"name", "app1"},    {"address", "10.0.0.1:39980"},     {"ended", true},
                {"state", "closed"}, {"since", "2026-11-29T16:00:15Z"}, {"reason", "goodbye"},
                {"persists", 80}};
  json merged = merge_status(
      {json{{"process", {{"kind", "pmirrord"}, {"node", "n2"}}},
            {"volumes",
             {{{"name", "db1"}, {"role", "replica"}, {"peers", json::array({live, ended})}}}}}});
  EXPECT_EQ(format_status_human(merged, std::nullopt, at("2026-11-29T16:03:15Z")),
            "db1 role:replica (pmirrord n2)\n"
            "  app1 connection:connected since 16:01:00 (2m ago) address:10.0.0.1:40412 "
            "acked:120 persists:120\n"
            "  app1 session ended 16:00:15 (3m ago) address:10.0.0.1:39980 persists:80 (closed: "
            "goodbye)\n");
}

TEST(ControlFormat, ProcessWithoutVolumesAndMissingFields) {
  json merged = merge_status({json{{"process", {{"kind", "pmirrord"}, {"pid", 7}}}},
                              json{{"volumes", {{{"name", "v"}, {"peers", {json::object()}}}}}}});
  EXPECT_EQ(format_status_human(merged, std::nullopt, at("2026-11-29T16:03:15Z")),
            "v (process)\n"
            "  ? connection:unknown\n"
            "(pmirrord, pid 7: no volumes)\n");
}

// A peer's text reaches the terminal without its control characters (no
// escape sequence of a stranger's gets to colour or rewrite the screen).
TEST(ControlFormat, ControlCharactersInStatusAreEscaped) {
  json merged = merge_status(
      {json{{"process", {{"kind", "pmirrord"}, {"node", "n1"}}},
            {"volumes",
             {{{"name", "v"},
               {"peers",
                {{{"name", "app@10.0.0.1:5"},
                  {"state", "disconnected"},
                  {"reason", "initiator reported: \x1b[2J\x1b[31mred\r\nforged line"}}}}}}}}});
  std::string text = format_status_human(merged, std::nullopt, at("2026-11-29T16:03:15Z"));
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;
  EXPECT_NE(text.find("\\x1b[2J\\x1b[31mred\\x0d\\x0aforged line"), std::string::npos) << text;
}

// pmirrord's admission counters, only when there is something to say.
TEST(ControlFormat, AdmissionLine) {
  json quiet = {{"process", {{"kind", "pmirrord"}, {"node", "n1"}}},
                {"volumes", json::array()},
                {"admission", {{"unauthenticated", 0}, {"evicted", 0}}}};
  EXPECT_EQ(format_status_human(merge_status({quiet}), std::nullopt, at("2026-11-29T16:03:15Z")),
            "(pmirrord n1: no volumes)\n");
  json flooded = quiet;
  flooded["admission"] = {{"unauthenticated", 64}, {"evicted", 1200},
                          {"timed_out", 3},        {"dropped", 0},
                          {"refused", 2},          {"authentication_failures", 5}};
  EXPECT_EQ(format_status_human(merge_status({flooded}), std::nullopt, at("2026-11-29T16:03:15Z")),
            "(pmirrord n1: no volumes)\n"
            "(pmirrord n1: 64 unauthenticated connection(s) now; since start 1200 evicted, 3 timed "
            "out, 2 refused, 5 failed authentication)\n");
}

TEST(ControlFormat, MergeKeepsOrderAndFilters) {
  json merged = merge_status({testing::initiator_status(), testing::daemon_status()});
  EXPECT_EQ(merged["schema_version"], 1);
  ASSERT_EQ(merged["processes"].size(), 2u);
  EXPECT_EQ(merged["processes"][0], testing::initiator_status());
  EXPECT_EQ(merged["processes"][1], testing::daemon_status());
  EXPECT_EQ(volume_names(merged), (std::vector<std::string>{"db0", "db1", "db2"}));

  json only = merge_status({testing::initiator_status(), testing::daemon_status()}, "db2");
  ASSERT_EQ(only["processes"].size(), 1u);
  EXPECT_EQ(only["processes"][0]["process"]["kind"], "pmirrord");
  ASSERT_EQ(only["processes"][0]["volumes"].size(), 1u);
  EXPECT_EQ(only["processes"][0]["volumes"][0]["name"], "db2");
  EXPECT_TRUE(merge_status({testing::daemon_status()}, "zz")["processes"].empty());
}

TEST(ControlFormat, Events) {
  HumanFormat format = at("2026-11-29T16:03:15Z");
  EXPECT_EQ(format_event_human(json::parse(R"({"time":"2026-11-29T16:01:02Z","process":"pmirrord",
      "node":"node2","volume":"db0","peer":"node2","from":"connected","to":"disconnected",
      "reason":"nothing heard for 5000 ms"})"),
                               format),
            "16:01:02 db0 node2: connected -> disconnected (nothing heard for 5000 ms)");
  EXPECT_EQ(format_event_human(
                json::parse(R"({"time":"2026-11-29T16:01:03Z","volume":"db0","to":"connecting"})"),
                format),
            "16:01:03 db0: connecting");
  EXPECT_EQ(format_event_human(json::parse(R"({"dropped":12})"), format),
            "16:03:15 (12 event(s) dropped: pmirrorctl did not keep up)");
  EXPECT_EQ(format_event_human(
                json::parse(R"({"time":"2026-11-29T16:01:04Z","message":"checkpoint"})"), format),
            "16:01:04 checkpoint");
}

// The recovery fields (docs/control.md): split brain, resync progress,
// dirty bytes, the copy object with a promoted copy.
TEST(ControlFormat, StatusWithRecoveryFields) {
  json initiator = json::parse(R"({
    "process": {"kind": "initiator", "pid": 4242, "identity": "app1"},
    "volumes": [{
      "name": "db0", "role": "primary", "size": 67108864, "generation": "9f3a2b1c4d5e6f70",
      "chunk_size": 65536, "some_future_field": {"x": [1, 2]},
      "peers": [
        {"name": "node2", "state": "syncing", "since": "2026-11-29T16:03:10Z",
         "reason": "catching up", "future": true,
         "resync": {"done_bytes": 12582912, "left_bytes": 54525952, "total_bytes": 67108864,
                    "rate_bytes_per_s": 99824435, "eta_seconds": 1, "full": false}},
        {"name": "node3", "state": "disconnected", "since": "2026-11-29T16:03:10Z",
         "reason": "connection refused", "dirty_bytes": 3355443, "dirty_chunks": 52},
        {"name": "node4", "state": "split-brain", "since": "2026-11-29T16:03:10Z",
         "reason": "both copies moved on from generation 12ab34cd56ef7890"},
        {"name": "node5", "state": "connected", "since": "2026-11-29T16:03:10Z",
         "dirty_bytes": 0, "resynced_bytes": 4194304, "resynced_chunks": 64},
        {"name": "node6", "state": "syncing", "since": "2026-11-29T16:03:10Z",
         "resync": {"done_bytes": 0, "left_bytes": 67108864, "rate_bytes_per_s": 1048576,
                    "full": true}},
        {"name": "node7", "state": "disconnected", "since": "2026-11-29T16:03:10Z",
         "dirty_bytes": 131072}
      ]
    }]
  })");
  json daemon = json::parse(R"({
    "process": {"kind": "pmirrord", "pid": 99, "node": "node2"},
    "volumes": [
      {"name": "db1", "role": "replica", "size": 268435456, "backing": "devdax",
       "generation": 3, "last_sequence": 4567,
       "copy": {"uuid": "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "generation": "9f3a2b1c4d5e6f70",
                "history": ["12ab34cd56ef7890", "0000000000000007"], "consistent": true,
                "promoted": true, "clean": false,
                "fence": {"generation": "0123456789abcdef", "promoted_on": "node3",
                          "since": "2026-12-04T12:00:00Z"}},
       "peers": []},
      {"name": "db2", "role": "replica", "size": 4096, "generation": 1,
       "copy": {"in_use_by_local_primary": true}, "peers": []},
      {"name": "db3", "role": "replica", "size": 4096, "generation": 1,
       "copy": {"error": "cannot open /x.pmirror: No such file or directory"}, "peers": []}
    ]
  })");
  EXPECT_EQ(
      format_status_human(merge_status({daemon, initiator}), std::nullopt,
                          at("2026-11-29T16:03:15Z")),
      "db0 role:primary size:64MiB generation:9f3a2b1c4d5e6f70 (initiator app1, pid 4242)\n"
      "  node2 connection:syncing since 16:03:10 (5s ago) reason: catching up\n"
      "    syncing 12.0 MiB / 64.0 MiB (18%), 95.2 MiB/s, ETA 1s\n"
      "  node3 connection:disconnected since 16:03:10 (5s ago) reason: connection refused\n"
      "    behind by 3.2 MiB (52 chunks)\n"
      "  node4 connection:split-brain since 16:03:10 (5s ago) reason: both copies moved on from "
      "generation 12ab34cd56ef7890\n"
      "    split brain: both copies were written since they last agreed; nothing is copied until "
      "an operator chooses (/usr/share/doc/pmirrord/replica-recovery.md)\n"
      "  node5 connection:connected since 16:03:10 (5s ago) resynced:4MiB\n"
      "  node6 connection:syncing since 16:03:10 (5s ago)\n"
      "    full sync 0 B / 64.0 MiB (0%), 1.0 MiB/s, ETA 1m04s\n"
      "  node7 connection:disconnected since 16:03:10 (5s ago)\n"
      "    behind by 128.0 KiB (2 chunks)\n"
      "db1 role:replica PROMOTED size:256MiB backing:devdax generation:9f3a2b1c4d5e6f70 "
      "session-generation:3 last-seq:4567 (pmirrord node2)\n"
      "  this copy: uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427 "
      "history:12ab34cd56ef7890,0000000000000007 consistent:yes clean:no promoted:yes "
      "fenced-by:node3 fence-generation:0123456789abcdef\n"
      "  (no peers)\n"
      "db2 role:replica size:4KiB session-generation:1 (pmirrord node2)\n"
      "  this copy: in use by the primary on this node (libpmirror has it open)\n"
      "  (no peers)\n"
      "db3 role:replica size:4KiB session-generation:1 (pmirrord node2)\n"
      "  this copy: error: cannot open /x.pmirror: No such file or directory\n"
      "  (no peers)\n");
}

TEST(ControlFormat, APrimaryWithNoReplicaSaysItMirrorsNothing) {
  json initiator = json::parse(R"({
    "process": {"kind": "initiator", "pid": 4242, "identity": "app1"},
    "volumes": [
      {"name": "alone", "role": "primary", "size": 4096, "generation": 1, "local_only": true,
       "peers": []}
    ]
  })");
  std::string out =
      format_status_human(merge_status({initiator}), std::nullopt, at("2026-11-29T16:03:15Z"));
  EXPECT_NE(out.find("\n  (no replicas: a persist is durable on this copy only; nothing is "
                     "mirrored)\n"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("(no peers)"), std::string::npos) << out;
}

TEST(ControlFormat, APeersDiskStateFollowsItsConnection) {
  json initiator = json::parse(R"({
    "process": {"kind": "initiator", "pid": 4242, "identity": "app1"},
    "volumes": [
      {"name": "db0", "role": "primary", "size": 4096, "generation": 1, "peers": [
        {"name": "node2", "state": "connected", "disk": "UpToDate", "lag": 0},
        {"name": "node3", "state": "disconnected", "disk": "Outdated", "dirty_bytes": 8192,
         "dirty_chunks": 2, "reason": "connection refused"}]}
    ]
  })");
  std::string out =
      format_status_human(merge_status({initiator}), std::nullopt, at("2026-11-29T16:03:15Z"));
  EXPECT_NE(out.find("  node2 connection:connected disk:UpToDate lag:0\n"), std::string::npos)
      << out;
  EXPECT_NE(out.find("  node3 connection:disconnected disk:Outdated reason: connection refused\n"),
            std::string::npos)
      << out;
}

TEST(ControlFormat, AVolumeDownByAnOperatorSaysSo) {
  json daemon = json::parse(R"({
    "process": {"kind": "pmirrord", "pid": 99, "node": "node2"},
    "volumes": [{"name": "db1", "role": "replica", "down": true, "peers": []},
                {"name": "db2", "role": "replica", "peers": []}]
  })");
  EXPECT_EQ(format_status_human(merge_status({daemon}), std::nullopt, at("2026-11-29T16:03:15Z")),
            "db1 role:replica down (by operator) (pmirrord node2)\n"
            "  (no peers)\n"
            "db2 role:replica (pmirrord node2)\n"
            "  (no peers)\n");
}

TEST(ControlFormat, APeerDisconnectedByAnOperatorSaysSo) {
  json initiator = json::parse(R"({
    "process": {"kind": "initiator", "pid": 4242, "identity": "app1"},
    "volumes": [{"name": "db0", "role": "primary", "peers": [
      {"name": "node3", "state": "disconnected", "by_operator": true, "disk": "Outdated",
       "reason": "disconnected by an operator"}]}]
  })");
  std::string out =
      format_status_human(merge_status({initiator}), std::nullopt, at("2026-11-29T16:03:15Z"));
  EXPECT_NE(out.find("  node3 connection:disconnected (by operator) disk:Outdated reason: "
                     "disconnected by an operator\n"),
            std::string::npos)
      << out;
}

TEST(ControlFormat, DownAndConnectReplies) {
  EXPECT_EQ(format_down_human(json{{"volume", "db1"},
                                   {"node", "n2"},
                                   {"down", true},
                                   {"changed", false},
                                   {"sessions_ended", 0}}),
            "db1: was down already on n2; new sessions are refused until `pmirrorctl up db1`");
  EXPECT_EQ(format_down_human(json{{"volume", "db1"}, {"down", false}, {"changed", false}}),
            "db1: was not down; nothing changed");
  EXPECT_EQ(format_connect_human(json{{"volume", "db0"},
                                      {"connected", false},
                                      {"peers", {{{"name", "n3"}, {"changed", false}}}}}),
            "db0: n3 was disconnected by an operator already; its writes are recorded dirty "
            "until `pmirrorctl connect db0 --peer n3`\n");
  EXPECT_EQ(format_connect_human(json::object()), "");
}

TEST(ControlFormat, AFailedVolumeSaysWhy) {
  json daemon = json::parse(R"({
    "process": {"kind": "pmirrord", "pid": 99, "node": "node2"},
    "volumes": [
      {"name": "db1", "role": "replica", "size": 4096, "generation": 1, "state": "failed",
       "error": "volume 'db1' (/pmem/db1): msync of [0, +4096) failed: Input/output error",
       "peers": []},
      {"name": "db2", "role": "replica", "size": 4096, "generation": 1, "state": "ok",
       "peers": []}
    ]
  })");
  EXPECT_EQ(format_status_human(merge_status({daemon}), std::nullopt, at("2026-11-29T16:03:15Z")),
            "db1 role:replica FAILED size:4KiB session-generation:1 (pmirrord node2)\n"
            "  failed: volume 'db1' (/pmem/db1): msync of [0, +4096) failed: Input/output error\n"
            "  (no peers)\n"
            "db2 role:replica size:4KiB session-generation:1 (pmirrord node2)\n"
            "  (no peers)\n");
}

// pmirror-promoter's view joined to the volumes (docs/failover.md): who
// holds each lease, since when, and why this node would not take over.
TEST(ControlFormat, LeaseHoldersFromThePromoter) {
  std::vector<json> statuses = {json::parse(R"({
    "process": {"kind": "pmirrord", "pid": 99, "node": "node2"},
    "volumes": [
      {"name": "db1", "role": "replica", "size": 4096, "generation": 1, "peers": []},
      {"name": "db2", "role": "replica", "size": 4096, "generation": 1, "peers": []},
      {"name": "db3", "role": "replica", "size": 4096, "generation": 1, "peers": []}
    ]
  })")};
  json promoter = json::parse(R"json({
    "node": "node2",
    "lease": {"id": 7, "deadline_in_ms": 2500, "error": ""},
    "volumes": [
      {"name": "db1", "holder": "node1", "held": false, "since": "2026-11-29T16:01:07Z",
       "refused": ""},
      {"name": "db2", "holder": "node2", "held": true, "since": "2026-11-29T16:02:00Z",
       "refused": ""},
      {"name": "db3", "holder": "", "held": false, "since": "",
       "refused": "the copy is inconsistent (a resync into it was interrupted)"},
      {"name": "elsewhere", "holder": "node9", "held": false, "since": "", "refused": ""}
    ]
  })json");
  attach_failover(statuses, promoter);
  EXPECT_EQ(statuses[0]["volumes"][1]["failover"]["held_here"], true);
  EXPECT_EQ(statuses[0]["volumes"].size(), 3u) << "a volume this node does not serve is not added";
  EXPECT_EQ(format_status_human(merge_status(statuses), std::nullopt, at("2026-11-29T16:03:15Z")),
            "db1 role:replica size:4KiB session-generation:1 (pmirrord node2)\n"
            "  lease: held by node node1 since 16:01:07\n"
            "  (no peers)\n"
            "db2 role:replica size:4KiB session-generation:1 (pmirrord node2)\n"
            "  lease: held here (node node2) since 16:02:00\n"
            "  (no peers)\n"
            "db3 role:replica size:4KiB session-generation:1 (pmirrord node2)\n"
            "  lease: nobody holds it; this node does not take over: the copy is inconsistent (a "
            "resync into it was interrupted)\n"
            "  (no peers)\n");
  // etcd out of reach: said on every line.
  promoter["lease"]["error"] = "etcd lease/keepalive: no endpoint answered within 2000 ms";
  attach_failover(statuses, promoter);
  EXPECT_NE(
      format_status_human(merge_status(statuses), std::string("db1"), at("2026-11-29T16:03:15Z"))
          .find("  lease: held by node node1 since 16:01:07; etcd: etcd lease/keepalive: no "
                "endpoint answered within 2000 ms\n"),
      std::string::npos);
  EXPECT_EQ(promoter_socket_path("/run/pmirror/pmirrord.sock"),
            "/run/pmirror/pmirrord.promoter.sock");
}

TEST(ControlFormat, Generations) {
  EXPECT_EQ(format_generation(json("9f3a2b1c4d5e6f70")), "9f3a2b1c4d5e6f70");
  EXPECT_EQ(format_generation(json(3)), "3");  // a legacy counter
  EXPECT_EQ(format_generation(json(0x9f3a2b1c4d5e6f70ull)), "9f3a2b1c4d5e6f70");
  EXPECT_EQ(format_generation(json(int64_t{1} << 40)), "0000010000000000");
  EXPECT_EQ(format_generation(json()), "");
  EXPECT_EQ(format_generation(json::array()), "");
}

TEST(ControlFormat, AmountsAndEtas) {
  EXPECT_EQ(format_amount(0), "0 B");
  EXPECT_EQ(format_amount(1023), "1023 B");
  EXPECT_EQ(format_amount(1024), "1.0 KiB");
  EXPECT_EQ(format_amount(12ull << 20), "12.0 MiB");
  EXPECT_EQ(format_amount(3355443), "3.2 MiB");
  EXPECT_EQ(format_amount((1ull << 30) - 1), "1.0 GiB");  // not "1024.0 MiB"
  EXPECT_EQ(format_amount(3ull << 39), "1.5 TiB");
  EXPECT_EQ(format_eta(0), "0s");
  EXPECT_EQ(format_eta(59), "59s");
  EXPECT_EQ(format_eta(125), "2m05s");
  EXPECT_EQ(format_eta(3720), "1h02m");
  EXPECT_EQ(format_eta(93600), "1d02h");
}

TEST(ControlFormat, HasPrimaryVolume) {
  EXPECT_TRUE(has_primary_volume(testing::initiator_status(), "db0"));
  EXPECT_FALSE(has_primary_volume(testing::initiator_status(), "db1"));
  EXPECT_FALSE(has_primary_volume(testing::daemon_status(), "db1"));  // a replica
  EXPECT_FALSE(has_primary_volume(json::object(), "db0"));
  EXPECT_FALSE(has_primary_volume(json{{"volumes", 7}}, "db0"));
}

TEST(ControlFormat, Resync) {
  EXPECT_EQ(format_resync_human(json::parse(
                R"({"volume":"db0","peer":"node3","started":true,"dirty_bytes":3355443,
                    "full":false})")),
            "db0: resync of node3 started: 3.2 MiB to copy; follow it with `pmirrorctl status "
            "db0`");
  EXPECT_EQ(format_resync_human(json::parse(
                R"({"volume":"db0","peer":"node3","started":true,"dirty_bytes":1073741824,
                    "dirty_chunks":16384,"full":true})")),
            "db0: full resync of node3 started: 1.0 GiB (16384 chunks) to copy; follow it with "
            "`pmirrorctl status db0`");
  EXPECT_EQ(format_resync_human(json::parse(
                R"({"volume":"db0","peer":"node3","started":false,"reason":"nothing is dirty"})")),
            "db0: no resync of node3 started: nothing is dirty");
}

json verify_result(size_t ranges, uint64_t count) {
  json mismatches = json::array();
  for (size_t i = 0; i < ranges; ++i) {
    mismatches.push_back({{"offset", i * 0x20000}, {"length", 65536}});
  }
  return {{"volume", "db0"},
          {"chunk_size", 65536},
          {"peers",
           {{{"name", "node2"},
             {"chunks_compared", 16384},
             {"bytes_compared", 1073741824},
             {"mismatches", json::array()},
             {"mismatch_count", 0},
             {"marked_dirty", 0}},
            {{"name", "node3"},
             {"chunks_compared", 16384},
             {"bytes_compared", 1073741824},
             {"mismatches", mismatches},
             {"mismatch_count", count},
             {"marked_dirty", count}}}}};
}

// `pmirrorctl resync --wait` reads the primary's status: progress while a
// resync runs, done once the peer's counter moved and no resync is left,
// stopped when the replica went away.
TEST(ControlFormat, ResyncWaitFollowsThePeer) {
  json status = {{"volumes",
                  {{{"name", "db0"},
                    {"role", "primary"},
                    {"peers",
                     {{{"name", "node3"},
                       {"state", "syncing"},
                       {"resyncs", 2},
                       {"resync",
                        {{"done_bytes", 12582912},
                         {"left_bytes", 54525952},
                         {"total_bytes", 67108864},
                         {"rate_bytes_per_s", 8388608},
                         {"eta_seconds", 7},
                         {"full", true}}}}}}}}}};
  json peer = find_peer(status, "db0", "node3");
  ASSERT_TRUE(peer.is_object());
  EXPECT_TRUE(find_peer(status, "db0", "node2").is_null());
  EXPECT_TRUE(find_peer(status, "db1", "node3").is_null());
  EXPECT_TRUE(find_peer(json::array(), "db0", "node3").is_null());

  ResyncObservation running = observe_resync("db0", peer, 2);
  EXPECT_EQ(running.outcome, ResyncOutcome::kRunning);
  EXPECT_EQ(running.line, "db0 -> node3: 12.0 MiB of 64.0 MiB (18%), 8.0 MiB/s, 7s left");
  EXPECT_EQ(running.done_bytes, 12582912u);
  EXPECT_EQ(running.total_bytes, 67108864u);

  // The counter moved but a resync still runs (a lagging replica starts
  // over): not done yet.
  EXPECT_EQ(observe_resync("db0", peer, 1).outcome, ResyncOutcome::kRunning);

  json done = peer;
  done.erase("resync");
  done["state"] = "connected";
  done["resyncs"] = 3;
  ResyncObservation finished = observe_resync("db0", done, 2);
  EXPECT_EQ(finished.outcome, ResyncOutcome::kDone);
  EXPECT_EQ(finished.line, "db0: node3 in sync");
  // Not started yet: the counter has not moved.
  done["resyncs"] = 2;
  EXPECT_EQ(observe_resync("db0", done, 2).outcome, ResyncOutcome::kRunning);

  json gone = peer;
  gone.erase("resync");
  gone["state"] = "disconnected";
  gone["reason"] = "nothing heard for 5000 ms";
  ResyncObservation stopped = observe_resync("db0", gone, 2);
  EXPECT_EQ(stopped.outcome, ResyncOutcome::kStopped);
  EXPECT_EQ(stopped.line,
            "db0: resync of node3 stopped: node3 is disconnected (nothing heard for 5000 ms); it "
            "resumes when the replica is back: `pmirrorctl status db0`");
  gone["state"] = "split-brain";
  EXPECT_EQ(observe_resync("db0", gone, 2).outcome, ResyncOutcome::kStopped);
  gone["state"] = "connecting";  // between two reconnect attempts
  EXPECT_EQ(observe_resync("db0", gone, 2).outcome, ResyncOutcome::kStopped);
  gone["state"] = "lagging";  // still connected, the copy goes on
  EXPECT_EQ(observe_resync("db0", gone, 2).outcome, ResyncOutcome::kRunning);
}

TEST(ControlFormat, VerifyProgress) {
  json status = {{"volumes",
                  {{{"name", "db0"},
                    {"role", "primary"},
                    {"peers",
                     {{{"name", "node2"}},
                      {{"name", "node3"},
                       {"verify", {{"done_bytes", 12582912}, {"total_bytes", 67108864}}}}}}},
                   {{"name", "db0"},
                    {"role", "replica"},
                    {"peers", {{{"name", "app"}, {"verify", {{"done_bytes", 1}}}}}}}}}};
  auto running = verify_progress(status, "db0");
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(std::get<0>(running[0]), "node3");
  EXPECT_EQ(std::get<1>(running[0]), 12582912u);
  EXPECT_EQ(std::get<2>(running[0]), 67108864u);
  EXPECT_TRUE(verify_progress(status, "db1").empty());
  EXPECT_TRUE(verify_progress(json::array(), "db0").empty());
  EXPECT_EQ(format_verify_progress("db0", "node3", 12582912, 67108864),
            "db0 verify of node3: 12.0 MiB of 64.0 MiB compared (18%)");
  EXPECT_EQ(format_verify_progress("db0", "node3", 0, 0),
            "db0 verify of node3: 0 B of 0 B compared");
}

TEST(ControlFormat, VerifyListsTheFirstRanges) {
  json two = verify_result(2, 2);
  EXPECT_EQ(format_verify_human(two),
            "db0 node2: equal (16384 chunks, 1.0 GiB compared)\n"
            "db0 node3: 2 mismatching ranges (16384 chunks, 1.0 GiB compared):\n"
            "  offset 0x0 length 64.0 KiB\n"
            "  offset 0x20000 length 64.0 KiB\n"
            "  2 chunks marked dirty; the resync copies them\n");
  EXPECT_EQ(verify_mismatches(two), 2u);
  EXPECT_EQ(verify_failures(two), 0u);

  // 25 listed, 30 found: the first 20, then how many more.
  json many = verify_result(25, 30);
  std::string text = format_verify_human(many);
  EXPECT_NE(text.find("  offset 0x260000 length 64.0 KiB\n  ... and 10 more\n"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("0x280000"), std::string::npos) << text;  // the 21st
  EXPECT_EQ(verify_mismatches(many), 30u);
  EXPECT_NE(format_verify_human(many, 1).find("  offset 0x0 length 64.0 KiB\n  ... and 29 more\n"),
            std::string::npos)
      << format_verify_human(many, 1);

  json equal = verify_result(0, 0);
  EXPECT_EQ(verify_mismatches(equal), 0u);
  EXPECT_EQ(format_verify_human(json{{"volume", "db0"}, {"peers", json::array()}}),
            "db0: no replica was compared\n");

  json failed = json::parse(R"({"volume":"db0","peers":[{"name":"node3",
      "error":{"code":"connection error","message":"node3 is not connected"}}]})");
  EXPECT_EQ(format_verify_human(failed), "db0 node3: not compared: node3 is not connected\n");
  EXPECT_EQ(verify_failures(failed), 1u);
  EXPECT_EQ(verify_mismatches(failed), 0u);
}

// Ranges being written while verify looked are listed as busy, apart from
// the mismatches, and are not counted as mismatches.
TEST(ControlFormat, VerifyListsBusyRangesApart) {
  json result = verify_result(1, 1);
  result["peers"][0]["busy"] = json::array({{{"offset", 0x50000}, {"length", 65536}}});
  result["peers"][0]["busy_count"] = 1;
  result["peers"][1]["busy"] = json::array(
      {{{"offset", 0x0}, {"length", 131072}}, {{"offset", 0x90000}, {"length", 65536}}});
  result["peers"][1]["busy_count"] = 2;
  EXPECT_EQ(format_verify_human(result),
            "db0 node2: equal (16384 chunks, 1.0 GiB compared); 1 busy range not verified (being "
            "written; run verify again):\n"
            "  offset 0x50000 length 64.0 KiB\n"
            "db0 node3: 1 mismatching range (16384 chunks, 1.0 GiB compared):\n"
            "  offset 0x0 length 64.0 KiB\n"
            "  2 busy ranges not verified (being written; run verify again):\n"
            "  offset 0x0 length 128.0 KiB\n"
            "  offset 0x90000 length 64.0 KiB\n"
            "  1 chunk marked dirty; the resync copies them\n");
  EXPECT_EQ(verify_mismatches(result), 1u);
}

TEST(ControlFormat, PromoteAndDemote) {
  EXPECT_EQ(format_promote_human(json::parse(
                R"({"volume":"db1","node":"node2","generation":"9f3a2b1c4d5e6f70",
                    "previous":"12ab34cd56ef7890","promoted":true,"forced":false})")),
            "db1 promoted on node2: generation 9f3a2b1c4d5e6f70 (was 12ab34cd56ef7890)");
  EXPECT_EQ(format_promote_human(json::parse(
                R"({"volume":"db1","node":"node2","generation":"9f3a2b1c4d5e6f70",
                    "previous":"12ab34cd56ef7890","promoted":true,"forced":true})")),
            "db1 promoted on node2 (forced): generation 9f3a2b1c4d5e6f70 (was 12ab34cd56ef7890)");
  EXPECT_EQ(format_promote_human(json::parse(
                R"({"volume":"db1","node":"node2","generation":"9f3a2b1c4d5e6f70",
                    "previous":"12ab34cd56ef7890","promoted":true,"already_promoted":true})")),
            "db1 was already promoted on node2: generation 9f3a2b1c4d5e6f70");
  EXPECT_EQ(format_promote_human(json::parse(
                R"({"volume":"db1","node":"node2","generation":"9f3a2b1c4d5e6f70",
                    "previous":"12ab34cd56ef7890","promoted":true,"forced":false,
                    "fences":[{"node":"node1","fenced":false,"error":"timeout: no answer"},
                              {"node":"node3","fenced":true,"sessions_ended":1},
                              {"node":"node4","fenced":true,"sessions_ended":0}]})")),
            "db1 promoted on node2: generation 9f3a2b1c4d5e6f70 (was 12ab34cd56ef7890)\n"
            "  NOT fenced on node1: timeout: no answer (that copy may still take the old "
            "primary's writes; run promote again)\n"
            "  fenced on node3 (the old primary's session there was ended)\n"
            "  fenced on node4");
  // A fence still tried in the background (pmirrord retries it).
  EXPECT_EQ(format_promote_human(json::parse(
                R"({"volume":"db1","node":"node2","generation":"9f3a2b1c4d5e6f70",
                    "previous":"12ab34cd56ef7890","promoted":true,
                    "fences":[{"node":"node1","fenced":false,"pending":true,"attempts":0,
                               "error":"no answer within 1000 ms; still trying"}]})")),
            "db1 promoted on node2: generation 9f3a2b1c4d5e6f70 (was 12ab34cd56ef7890)\n"
            "  NOT fenced on node1 yet: no answer within 1000 ms; still trying (that copy may "
            "still take the old primary's writes until it is; pmirrord retries in the "
            "background, `pmirrorctl status` shows when it lands)");
  EXPECT_EQ(format_promote_human(json::parse(
                R"({"volume":"db1","node":"node2","promoted":false,
                    "generation":"9f3a2b1c4d5e6f70"})")),
            "db1 demoted on node2: generation 9f3a2b1c4d5e6f70; a replica again");
}

TEST(ControlFormat, Sizes) {
  EXPECT_EQ(format_size(0), "0B");
  EXPECT_EQ(format_size(100), "100B");
  EXPECT_EQ(format_size(4096), "4KiB");
  EXPECT_EQ(format_size(64ull << 20), "64MiB");
  EXPECT_EQ(format_size(1ull << 30), "1GiB");
  EXPECT_EQ(format_size(3ull << 29), "1.5GiB");
  EXPECT_EQ(format_size(2ull << 40), "2TiB");
}

TEST(ControlFormat, Latencies) {
  EXPECT_EQ(format_latency_us(55.1), "55us");
  EXPECT_EQ(format_latency_us(0.4), "0us");
  EXPECT_EQ(format_latency_us(1234), "1.2ms");
  EXPECT_EQ(format_latency_us(2500000), "2.5s");
}

// A number no uint64 holds (another process's socket may send anything) is
// shown as the largest, not converted with undefined behaviour (found by
// tests/fuzz/control_fuzz: a size of 1.8e20).
TEST(ControlFormat, NumbersBeyondUint64AreTheLargest) {
  json merged = merge_status({json{{"process", {{"kind", "pmirrord"}, {"pid", 7}}},
                                   {"volumes",
                                    {{{"name", "v"}, {"size", 1.8e20}, {"last_sequence", 1e300}},
                                     {{"name", "w"}, {"size", -5.5}}}}}});
  EXPECT_EQ(format_status_human(merged, std::nullopt, at("2026-11-29T16:03:15Z")),
            "v size:" + format_size(std::numeric_limits<uint64_t>::max()) +
                " last-seq:18446744073709551615 (pmirrord, pid 7)\n  (no peers)\n"
                "w size:0B (pmirrord, pid 7)\n  (no peers)\n");
}

}  // namespace
}  // namespace pmirror::control

#include "metrics/metrics.h"

#include <CivetServer.h>
#include <netdb.h>
#include <netinet/in.h>
#include <prometheus/client_metric.h>
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <exception>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "common/log.h"

namespace pmirror::metrics {

namespace {

using nlohmann::json;
using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

// The peer states of docs/status-schema.md; pmirror_peer_state has one
// series per state so that a dashboard can graph "how many peers are X".
constexpr const char* kPeerStates[] = {"connecting",   "handshaking", "syncing",     "connected",
                                       "disconnected", "refused",     "split-brain", "failed"};

// `text` with every byte sequence that is not UTF-8 replaced by U+FFFD.
std::string valid_utf8(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    auto c = static_cast<unsigned char>(text[i]);
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xe  ? 3
                 : (c >> 3) == 0x1e ? 4
                                    : 0;
    bool ok = len > 0 && i + len <= text.size();
    for (size_t k = 1; ok && k < len; ++k) {
      ok = (static_cast<unsigned char>(text[i + k]) & 0xc0) == 0x80;
    }
    if (ok && len > 1) {
      // No overlong forms, surrogates or code points beyond U+10FFFF.
      uint32_t cp = c & (0x7f >> len);
      for (size_t k = 1; k < len; ++k)
        cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3f);
      static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= kMin[len] && cp <= 0x10ffff && (cp < 0xd800 || cp > 0xdfff);
    }
    if (ok) {
      out.append(text, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
    }
  }
  return out;
}

// Builds the families of one scrape. Unusable fields are skipped and
// counted in errors_.
class Converter {
 public:
  std::vector<MetricFamily> convert(const json& snapshot) {
    bool up = snapshot.is_object();
    if (!up) {
      error("the snapshot is not a JSON object");
    } else {
      process(snapshot);
      admission(snapshot);
      volumes(snapshot);
      promoter(snapshot);
    }
    gauge("pmirror_up", "1 when the process answered its status snapshot, 0 when it failed", {},
          up ? 1 : 0);
    return finish();
  }

  // Called when the snapshot function itself failed.
  std::vector<MetricFamily> failed(const std::string& why) {
    error(why);
    gauge("pmirror_up", "1 when the process answered its status snapshot, 0 when it failed", {}, 0);
    return finish();
  }

  uint64_t errors() const { return errors_; }

 private:
  void error(const std::string& what) {
    ++errors_;
    log::debug("metrics: snapshot: {}", what);
  }

  MetricFamily& family(const std::string& name, const std::string& help, MetricType type) {
    for (auto& f : families_) {
      if (f.name == name) return f;
    }
    families_.push_back(MetricFamily{name, help, type, {}});
    return families_.back();
  }

  void gauge(const std::string& name, const std::string& help, Labels labels, double value) {
    ClientMetric m;
    m.label = std::move(labels);
    m.gauge.value = value;
    family(name, help, MetricType::Gauge).metric.push_back(std::move(m));
  }

  void counter(const std::string& name, const std::string& help, Labels labels, double value) {
    ClientMetric m;
    m.label = std::move(labels);
    m.counter.value = value;
    family(name, help, MetricType::Counter).metric.push_back(std::move(m));
  }

  // A field that should be a number: absent -> nullopt quietly (fields are
  // optional per role), present with another type -> nullopt and an error.
  std::optional<double> number(const json& object, const char* key, const std::string& where) {
    auto it = object.find(key);
    if (it == object.end() || it->is_null()) return std::nullopt;
    if (!it->is_number()) {
      error(where + "." + key + " is not a number");
      return std::nullopt;
    }
    double value = it->get<double>();
    if (!std::isfinite(value)) {
      error(where + "." + key + " is not finite");
      return std::nullopt;
    }
    return value;
  }

  std::optional<std::string> text(const json& object, const char* key, const std::string& where) {
    auto it = object.find(key);
    if (it == object.end() || it->is_null()) return std::nullopt;
    if (!it->is_string()) {
      error(where + "." + key + " is not a string");
      return std::nullopt;
    }
    // Label values must be UTF-8 (the text format says so); a peer's odd
    // bytes must not make the scrape unreadable.
    return valid_utf8(it->get<std::string>());
  }

  // Connections not yet authenticated (pmirrord: "admission").
  void admission(const json& snapshot) {
    auto it = snapshot.find("admission");
    if (it == snapshot.end()) return;
    if (!it->is_object()) {
      error("admission is not an object");
      return;
    }
    if (auto v = number(*it, "unauthenticated", "admission")) {
      gauge("pmirror_unauthenticated_connections",
            "connections whose peer has not authenticated yet (transport hello or handshake)", {},
            *v);
    }
    struct Counter {
      const char* key;
      const char* name;
      const char* help;
    };
    for (const Counter& c :
         {Counter{"evicted", "pmirror_unauthenticated_evicted_total",
                  "unauthenticated connections closed to make room under max_unauthenticated(_per_"
                  "source) or for a file descriptor"},
          Counter{"timed_out", "pmirror_handshake_timeouts_total",
                  "connections that did not complete the handshake within handshake_timeout"},
          Counter{"dropped", "pmirror_connections_dropped_total",
                  "connections accepted and closed at once: out of file descriptors or memory"},
          Counter{"refused", "pmirror_handshakes_refused_total",
                  "connections refused before authentication: not a pmirror peer, unknown volume, "
                  "unexpected message, out of threads"},
          Counter{"authentication_failures", "pmirror_authentication_failures_total",
                  "initiators refused for an unknown identity or a wrong secret"}}) {
      if (auto v = number(*it, c.key, "admission")) counter(c.name, c.help, {}, *v);
    }
  }

  void process(const json& snapshot) {
    auto it = snapshot.find("process");
    if (it == snapshot.end()) return;
    if (!it->is_object()) {
      error("process is not an object");
      return;
    }
    Labels labels;
    for (const char* key : {"kind", "node", "identity", "version"}) {
      if (auto value = text(*it, key, "process")) labels.push_back({key, *value});
    }
    gauge("pmirror_process_info", "constant 1, labelled with what the process is", labels, 1);
  }

  void volumes(const json& snapshot) {
    auto it = snapshot.find("volumes");
    if (it == snapshot.end()) return;
    if (!it->is_array()) {
      error("volumes is not an array");
      return;
    }
    std::set<std::pair<std::string, std::string>> seen;
    for (size_t i = 0; i < it->size(); ++i) {
      const json& v = (*it)[i];
      std::string where = "volumes[" + std::to_string(i) + "]";
      if (!v.is_object()) {
        error(where + " is not an object");
        continue;
      }
      auto name = text(v, "name", where);
      if (!name || name->empty()) {
        error(where + " has no name");
        continue;
      }
      std::string role = text(v, "role", where).value_or("");
      if (!seen.insert({*name, role}).second) {
        error(where + ": volume '" + *name + "' (" + role + ") appears twice");
        continue;
      }
      volume(v, *name, role, "volume '" + *name + "'");
    }
  }

  // This node's copy's metadata (pmirrord): fenced, promoted, consistent.
  void copy(const json& v, const Labels& labels, const std::string& where) {
    auto it = v.find("copy");
    if (it == v.end()) return;
    if (!it->is_object()) {
      error(where + ".copy is not an object");
      return;
    }
    // Open by a local application, or unreadable: nothing to say of it.
    if (it->contains("in_use_by_local_primary") || it->contains("error")) return;
    gauge("pmirror_copy_fenced",
          "1 when the copy is fenced against an old primary (a promotion elsewhere told it so: "
          "it takes writes only from the new primary's lineage), else 0",
          labels, it->contains("fence") && (*it)["fence"].is_object() ? 1 : 0);
    for (const auto& [key, name, help] :
         {std::tuple{"promoted", "pmirror_copy_promoted",
                     "1 when the copy was promoted on this node (pmirrorctl promote), else 0"},
          std::tuple{"consistent", "pmirror_copy_consistent",
                     "0 while a resync into the copy is unfinished (mixed data), else 1"}}) {
      auto field = it->find(key);
      if (field == it->end()) continue;
      if (!field->is_boolean()) {
        error(where + ".copy." + key + " is not a boolean");
        continue;
      }
      gauge(name, help, labels, field->get<bool>() ? 1 : 0);
    }
  }

  // pmirror-promoter's status, which pmirrord adds as "promoter" when one
  // runs on its node (failover.engine: etcd; docs/failover.md section 4).
  void promoter(const json& snapshot) {
    auto it = snapshot.find("promoter");
    if (it == snapshot.end()) return;
    if (!it->is_object()) {
      error("promoter is not an object");
      return;
    }
    if (auto lease = it->find("lease"); lease != it->end() && lease->is_object()) {
      if (auto v = number(*lease, "renewals", "promoter.lease")) {
        counter("pmirror_lease_renewals_total",
                "renewals of this node's etcd lease that etcd answered", {}, *v);
      }
      if (auto v = number(*lease, "renewal_failures", "promoter.lease")) {
        counter("pmirror_lease_renewal_failures_total",
                "renewals of this node's etcd lease that failed or found it expired", {}, *v);
      }
      auto id = number(*lease, "id", "promoter.lease");
      auto left = number(*lease, "deadline_in_ms", "promoter.lease");
      gauge("pmirror_lease_deadline_seconds",
            "seconds until the deadline at which a primary on this node stops writing unless the "
            "lease is renewed (0 without a lease)",
            {}, id && *id != 0 && left ? std::max(0.0, *left / 1000.0) : 0);
    }
    auto list = it->find("volumes");
    if (list == it->end() || !list->is_array()) return;
    for (const json& v : *list) {
      if (!v.is_object()) continue;
      auto name = text(v, "name", "promoter.volumes[]");
      if (!name) continue;
      Labels labels{{"volume", *name}};
      gauge("pmirror_lease_held",
            "1 when this node holds the volume's lease (it is the primary's node), else 0", labels,
            v.value("held", false) ? 1 : 0);
      Labels holder = labels;
      holder.push_back({"holder", text(v, "holder", "promoter.volumes[]").value_or("")});
      gauge("pmirror_lease_holder_info",
            "constant 1, labelled with the node that holds the volume's lease (empty: nobody)",
            holder, 1);
      if (auto n = number(v, "takeovers", "promoter.volumes[]")) {
        counter("pmirror_lease_takeovers_total", "times this node took the volume's lease", labels,
                *n);
      }
      if (auto n = number(v, "losses", "promoter.volumes[]")) {
        counter("pmirror_lease_losses_total", "times this node lost or gave up the volume's lease",
                labels, *n);
      }
      auto application = v.find("application");
      if (application != v.end() && application->is_object()) {
        if (auto n = number(*application, "ended", "promoter.volumes[].application")) {
          counter("pmirror_application_ends_total",
                  "times the volume's application ended while this node held the volume (it "
                  "gave the volume up)",
                  labels, *n);
        }
      }
    }
  }

  void volume(const json& v, const std::string& name, const std::string& role,
              const std::string& where) {
    Labels labels{{"volume", name}, {"role", role}};
    if (auto size = number(v, "size", where)) {
      gauge("pmirror_volume_size_bytes", "size of the volume in bytes", labels, *size);
    }
    // A primary reports its data generation as 16 hex digits (a random
    // identifier, not a quantity): it goes on the info series as a label.
    auto generation_field = v.find("generation");
    bool generation_is_text = generation_field != v.end() && generation_field->is_string();
    if (!generation_is_text) {
      if (auto generation = number(v, "generation", where)) {
        gauge("pmirror_volume_generation",
              "the volume's generation (raised when a new primary takes it over)", labels,
              *generation);
      }
    }
    if (auto last = number(v, "last_sequence", where)) {
      gauge("pmirror_volume_last_sequence",
            "replica: last sequence recorded; primary: last sequence started", labels, *last);
    }
    if (auto state = text(v, "state", where)) {
      gauge("pmirror_volume_failed",
            "replica: 1 when the volume failed (a write-back error, a fault on its mapping) and "
            "takes no writer until reopened, else 0",
            labels, *state == "failed" ? 1 : 0);
    }
    Labels info = labels;
    if (auto path = text(v, "path", where)) info.push_back({"path", *path});
    if (auto backing = text(v, "backing", where)) info.push_back({"backing", *backing});
    if (generation_is_text) info.push_back({"generation", generation_field->get<std::string>()});
    gauge("pmirror_volume_info", "constant 1, labelled with the volume's path and backing", info,
          1);
    copy(v, labels, where);
    // pmirrord: the other copies that the last promotion here has not
    // fenced yet (still retried); only where this node promoted.
    if (auto fences = v.find("fences"); fences != v.end() && fences->is_array()) {
      double pending = 0;
      for (const json& f : *fences) {
        if (f.is_object() && f.value("pending", false)) ++pending;
      }
      gauge("pmirror_fences_pending",
            "other copies that the last promotion on this node has not fenced yet (retried in "
            "the background until they are; until then they may take the old primary's writes)",
            labels, pending);
    }

    auto peers = v.find("peers");
    if (peers == v.end()) return;
    if (!peers->is_array()) {
      error(where + ".peers is not an array");
      return;
    }
    // A replica's peers are its writers' sessions, named
    // "identity@address:port": labelled by identity, since the port changes
    // with every connection and would make a new series each time. Ended
    // sessions are left out, and of several sessions of one identity (one
    // that reconnected before the old one was reaped) a connected one is
    // kept, else the newest: the old session's teardown may change its
    // state after the new one connected. So `pmirror_peer_connected == 0`
    // means a writer that is down now.
    const bool sessions = role == "replica";
    std::map<std::string, size_t> newest;  // identity -> index (sessions only)
    if (sessions) {
      for (size_t i = 0; i < peers->size(); ++i) {
        const json& p = (*peers)[i];
        if (!p.is_object() || p.value("state", json()) == "closed" || p.value("ended", false)) {
          continue;
        }
        auto name = p.find("name");
        if (name == p.end() || !name->is_string()) continue;
        std::string identity = writer_identity(name->get<std::string>());
        auto [at, inserted] = newest.emplace(identity, i);
        if (!inserted && supersedes(p, (*peers)[at->second])) at->second = i;
      }
    }
    std::set<std::string> seen;
    for (size_t i = 0; i < peers->size(); ++i) {
      const json& p = (*peers)[i];
      std::string peer_where = where + ".peers[" + std::to_string(i) + "]";
      if (!p.is_object()) {
        error(peer_where + " is not an object");
        continue;
      }
      auto peer_name = text(p, "name", peer_where);
      if (!peer_name || peer_name->empty()) peer_name = text(p, "address", peer_where);
      if (!peer_name || peer_name->empty()) {
        error(peer_where + " has neither name nor address");
        continue;
      }
      if (sessions) {
        auto it = newest.find(writer_identity(*peer_name));
        if (it == newest.end() || it->second != i) continue;  // ended, or superseded
        peer_name = writer_identity(*peer_name);
      }
      if (!seen.insert(*peer_name).second) {
        error(peer_where + ": peer '" + *peer_name + "' appears twice");
        continue;
      }
      peer(p, labels, *peer_name, where + " peer '" + *peer_name + "'");
    }
  }

  // "app1@10.0.0.1:53422" -> "app1"; a name without '@' as it is.
  static std::string writer_identity(const std::string& session_name) {
    return session_name.substr(0, session_name.rfind('@'));
  }
  // Whether session `a` stands for its writer rather than `b`: connected
  // first, then the later state change.
  static bool supersedes(const json& a, const json& b) {
    const bool a_up = a.value("state", json()) == "connected";
    const bool b_up = b.value("state", json()) == "connected";
    if (a_up != b_up) return a_up;
    return since_of(b) <= since_of(a);
  }
  // RFC 3339 in UTC with a fixed number of digits sorts as text.
  static std::string since_of(const json& p) {
    auto since = p.find("since");
    return since != p.end() && since->is_string() ? since->get<std::string>() : std::string();
  }

  void peer(const json& p, const Labels& volume_labels, const std::string& name,
            const std::string& where) {
    Labels labels = volume_labels;
    labels.push_back({"peer", name});

    if (auto state = text(p, "state", where)) {
      gauge("pmirror_peer_connected", "1 when the connection to the peer is up, else 0", labels,
            *state == "connected" ? 1 : 0);
      bool known = false;
      for (const char* s : kPeerStates) {
        Labels with_state = labels;
        with_state.push_back({"state", s});
        known = known || *state == s;
        gauge("pmirror_peer_state", "1 for the peer's current connection state, 0 for the others",
              with_state, *state == s ? 1 : 0);
      }
      if (!known) {
        Labels with_state = labels;
        with_state.push_back({"state", *state});
        gauge("pmirror_peer_state", "1 for the peer's current connection state, 0 for the others",
              with_state, 1);
      }
    }
    Labels info = labels;
    for (const char* key : {"address", "transport", "method"}) {
      if (auto value = text(p, key, where)) info.push_back({key, *value});
    }
    gauge("pmirror_peer_info", "constant 1, labelled with the peer's address, transport, method",
          info, 1);

    if (auto lag = number(p, "lag", where)) {
      gauge("pmirror_replication_lag",
            "sequences started but not yet acknowledged by the peer (primary side)", labels, *lag);
    }
    if (auto acked = number(p, "acknowledged_sequence", where)) {
      gauge("pmirror_peer_acknowledged_sequence", "last sequence the peer acknowledged", labels,
            *acked);
    }
    if (auto persists = number(p, "persists", where)) {
      counter("pmirror_persists_total",
              "primary: persists completed on the peer; replica: commits applied", labels,
              *persists);
    }
    if (auto bytes = number(p, "bytes", where)) {
      counter("pmirror_bytes_total", "bytes replicated to (primary) or from (replica) the peer",
              labels, *bytes);
    }
    if (auto errors = number(p, "errors", where)) {
      counter("pmirror_errors_total", "errors on the peer's connection", labels, *errors);
    }
    // Recovery (primary side, docs/replica-recovery.md).
    if (auto dirty = number(p, "dirty_bytes", where)) {
      gauge("pmirror_peer_dirty_bytes",
            "bytes recorded dirty for the peer: what a resync must copy to it", labels, *dirty);
    }
    if (auto resynced = number(p, "resynced_bytes", where)) {
      counter("pmirror_peer_resynced_bytes_total", "bytes copied to the peer by resyncs", labels,
              *resynced);
    }
    auto resync = p.find("resync");
    if (resync != p.end() && resync->is_object()) {
      if (auto left = number(*resync, "left_bytes", where + ".resync")) {
        gauge("pmirror_peer_resync_left_bytes", "bytes the running resync has still to copy",
              labels, *left);
      }
      if (auto rate = number(*resync, "rate_bytes_per_s", where + ".resync")) {
        gauge("pmirror_peer_resync_rate_bytes_per_second", "the running resync's copy rate", labels,
              *rate);
      }
    } else if (p.contains("dirty_bytes")) {
      gauge("pmirror_peer_resync_left_bytes", "bytes the running resync has still to copy", labels,
            0);
    }
    latency_summary(p, labels, where);
    latency_histogram(p, labels, where);
  }

  void latency_summary(const json& p, const Labels& labels, const std::string& where) {
    auto it = p.find("latency_us");
    if (it == p.end() || it->is_null()) return;
    if (!it->is_object()) {
      error(where + ".latency_us is not an object");
      return;
    }
    std::string sub = where + ".latency_us";
    auto count = number(*it, "count", sub);
    auto sum = number(*it, "sum", sub);
    // A summary's _sum is the total of every observed latency; a process
    // that does not report it (a libpmirror older than this pmirrord) has
    // no summary rather than a NaN or a made-up value.
    if (!count || *count < 0 || !sum || *sum < 0) {
      error(sub + " needs a count and a sum");
      return;
    }
    ClientMetric m;
    m.label = labels;
    m.summary.sample_count = static_cast<uint64_t>(*count);
    m.summary.sample_sum = *sum / 1e6;
    for (auto [key, q] :
         {std::pair{"p50", 0.5}, std::pair{"p99", 0.99}, std::pair{"p999", 0.999}}) {
      if (auto value = number(*it, key, sub)) {
        m.summary.quantile.push_back({q, *value / 1e6});
      }
    }
    family("pmirror_persist_latency_seconds",
           "persist latency on the peer (primary side): quantiles over the process's recent "
           "persists, count since start",
           MetricType::Summary)
        .metric.push_back(std::move(m));
  }

  void latency_histogram(const json& p, const Labels& labels, const std::string& where) {
    auto it = p.find("latency_histogram");
    if (it == p.end() || it->is_null()) return;
    std::string sub = where + ".latency_histogram";
    if (!it->is_object()) {
      error(sub + " is not an object");
      return;
    }
    auto count = number(*it, "count", sub);
    auto sum = number(*it, "sum_seconds", sub);
    auto buckets = it->find("buckets");
    if (!count || *count < 0 || !sum || *sum < 0 || buckets == it->end() || !buckets->is_array()) {
      error(sub + " needs count, sum_seconds and a buckets array");
      return;
    }
    ClientMetric m;
    m.label = labels;
    m.histogram.sample_count = static_cast<uint64_t>(*count);
    m.histogram.sample_sum = *sum;
    double previous_le = -std::numeric_limits<double>::infinity();
    double previous_count = 0;
    for (const json& b : *buckets) {
      std::optional<double> le, cumulative;
      if (b.is_object()) {
        le = number(b, "le", sub);
        cumulative = number(b, "count", sub);
      }
      if (!le || !cumulative || *le <= previous_le || *cumulative < previous_count ||
          *cumulative > *count) {
        error(sub + ": buckets must be {le, count} with le rising and cumulative counts");
        return;
      }
      m.histogram.bucket.push_back({static_cast<uint64_t>(*cumulative), *le});
      previous_le = *le;
      previous_count = *cumulative;
    }
    m.histogram.bucket.push_back(
        {static_cast<uint64_t>(*count), std::numeric_limits<double>::infinity()});
    family("pmirror_persist_duration_seconds",
           "persist latency on the peer (primary side) as a histogram, since start",
           MetricType::Histogram)
        .metric.push_back(std::move(m));
  }

  std::vector<MetricFamily> finish() {
    std::vector<MetricFamily> out;
    for (auto& f : families_) {
      if (!f.metric.empty()) out.push_back(std::move(f));
    }
    families_.clear();
    return out;
  }

  std::vector<MetricFamily> families_;
  uint64_t errors_ = 0;
};

constexpr const char* kErrorsHelp =
    "status snapshot fields that could not be exported (wrong type, missing name, duplicates) "
    "and failed snapshots, since the exporter started";

MetricFamily errors_family(uint64_t errors) {
  ClientMetric m;
  m.counter.value = static_cast<double>(errors);
  return MetricFamily{
      "pmirror_metrics_snapshot_errors_total", kErrorsHelp, MetricType::Counter, {m}};
}

// Every scrape: the snapshot's families and the error count. Not
// prometheus-cpp's Exposer, which adds its own unprefixed exposer_* series
// (its scrape count, bytes sent, request latency) to every scrape: what the
// endpoint exports is pmirror_* only, one name space an operator can list.
class SnapshotCollectable {
 public:
  explicit SnapshotCollectable(SnapshotFn snapshot) : snapshot_(std::move(snapshot)) {}

  std::vector<MetricFamily> Collect() const {
    Converter converter;
    std::vector<MetricFamily> families;
    try {
      families = converter.convert(snapshot_());
    } catch (const std::exception& e) {
      families = converter.failed(std::string("the snapshot failed: ") + e.what());
    } catch (...) {
      families = converter.failed("the snapshot failed");
    }
    uint64_t total = errors_.fetch_add(converter.errors()) + converter.errors();
    families.push_back(errors_family(total));
    return families;
  }

  std::string text() const { return prometheus::TextSerializer().Serialize(Collect()); }

 private:
  SnapshotFn snapshot_;
  mutable std::atomic<uint64_t> errors_{0};
};

// GET /metrics on civetweb's threads.
class MetricsHandler : public CivetHandler {
 public:
  explicit MetricsHandler(const SnapshotCollectable& collectable) : collectable_(collectable) {}

  bool handleGet(CivetServer* /*server*/, mg_connection* connection) override {
    std::string body;
    try {
      body = collectable_.text();
    } catch (const std::exception& e) {
      mg_send_http_error(connection, 500, "metrics: %s", e.what());
      return true;
    }
    mg_printf(connection,
              "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
              "Content-Length: %zu\r\nConnection: close\r\n\r\n",
              body.size());
    mg_write(connection, body.data(), body.size());
    return true;
  }

 private:
  const SnapshotCollectable& collectable_;
};

Status bad_address(std::string_view host_port, std::string_view why) {
  return Status(Errc::kConfigError, "metrics address '" + std::string(host_port) +
                                        "': expected HOST:PORT (" + std::string(why) +
                                        "), e.g. 127.0.0.1:9942 or [::1]:9942");
}

}  // namespace

Result<Endpoint> parse_endpoint(std::string_view host_port) {
  Endpoint endpoint;
  std::string_view port_text;
  if (!host_port.empty() && host_port.front() == '[') {
    size_t close = host_port.find(']');
    if (close == std::string_view::npos)
      return bad_address(host_port, "no ']' after the IPv6 address");
    endpoint.host = std::string(host_port.substr(1, close - 1));
    if (close + 1 >= host_port.size() || host_port[close + 1] != ':') {
      return bad_address(host_port, "no ':PORT' after ']'");
    }
    port_text = host_port.substr(close + 2);
  } else {
    size_t colon = host_port.rfind(':');
    if (colon == std::string_view::npos) return bad_address(host_port, "no ':PORT'");
    endpoint.host = std::string(host_port.substr(0, colon));
    if (endpoint.host.find(':') != std::string::npos) {
      return bad_address(host_port, "write an IPv6 address in brackets");
    }
    port_text = host_port.substr(colon + 1);
  }
  if (endpoint.host.empty()) return bad_address(host_port, "the host is empty");
  unsigned port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || end != port_text.data() + port_text.size() ||
      port > 65535) {
    return bad_address(host_port, "the port must be a number from 0 to 65535");
  }
  endpoint.port = static_cast<uint16_t>(port);
  return endpoint;
}

std::string render_text(const nlohmann::json& snapshot) {
  SnapshotCollectable collectable([snapshot] { return snapshot; });
  return collectable.text();
}

class Exporter::Impl {
 public:
  explicit Impl(SnapshotFn snapshot) : collectable(std::move(snapshot)), handler(collectable) {}
  // Declared before the server: the server (and its threads) go first.
  SnapshotCollectable collectable;
  MetricsHandler handler;
  std::unique_ptr<CivetServer> server;
  uint16_t port = 0;
};

Result<std::unique_ptr<Exporter>> Exporter::start(const std::string& host_port,
                                                  SnapshotFn snapshot) {
  PMIRROR_ASSIGN_OR_RETURN(Endpoint endpoint, parse_endpoint(host_port));
  if (!snapshot) return Status(Errc::kInvalidArgument, "metrics: no snapshot function");

  // civetweb wants a numeric address; resolve names here so that a typo is
  // reported as such.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::string port_text = std::to_string(endpoint.port);
  int rc = ::getaddrinfo(endpoint.host.c_str(), port_text.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return Status(Errc::kConfigError, "metrics address '" + host_port + "': cannot resolve '" +
                                          endpoint.host + "': " + ::gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, ::freeaddrinfo);
  char numeric[NI_MAXHOST] = {};
  if (::getnameinfo(found->ai_addr, found->ai_addrlen, numeric, sizeof numeric, nullptr, 0,
                    NI_NUMERICHOST) != 0) {
    return Status(Errc::kConfigError,
                  "metrics address '" + host_port + "': cannot print the resolved address");
  }
  bool v6 = found->ai_family == AF_INET6;

  // Bind once ourselves first: civetweb only says "binding failed", the
  // kernel says why.
  {
    int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return errno_status(Errc::kConnectionError, "metrics: socket", errno);
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int bound = ::bind(fd, found->ai_addr, found->ai_addrlen);
    int err = errno;
    ::close(fd);
    if (bound != 0) {
      Status status = errno_status(Errc::kConnectionError,
                                   "metrics address '" + host_port + "': cannot listen", err);
      if (err == EADDRINUSE) {
        return Status(status.code(), status.message() +
                                         " (another process has the port: stop it or choose "
                                         "another port for daemon.metrics)");
      }
      return status;
    }
  }

  std::string listen =
      v6 ? "[" + std::string(numeric) + "]:" + port_text : std::string(numeric) + ":" + port_text;
  auto impl = std::make_unique<Impl>(std::move(snapshot));
  try {
    impl->server = std::make_unique<CivetServer>(std::vector<std::string>{
        "listening_ports", listen, "num_threads", "2", "request_timeout_ms", "10000"});
  } catch (const std::exception& e) {
    return Status(
        Errc::kConnectionError,
        "metrics address '" + host_port + "': cannot listen on " + listen + ": " + e.what() +
            (v6 ? " (this civetweb may be built without IPv6: use an IPv4 address)" : ""));
  }
  impl->server->addHandler("/metrics", impl->handler);
  auto ports = impl->server->getListeningPorts();
  uint16_t port = ports.empty() ? endpoint.port : static_cast<uint16_t>(ports.front());
  impl->port = port;
  std::string address = v6 ? "[" + std::string(numeric) + "]:" + std::to_string(port)
                           : std::string(numeric) + ":" + std::to_string(port);
  log::info("metrics: serving http://{}/metrics", address);
  return std::unique_ptr<Exporter>(new Exporter(std::move(impl), std::move(address)));
}

Exporter::Exporter(std::unique_ptr<Impl> impl, std::string address)
    : impl_(std::move(impl)), address_(std::move(address)) {}

Exporter::~Exporter() = default;

uint16_t Exporter::port() const { return impl_->port; }

}  // namespace pmirror::metrics

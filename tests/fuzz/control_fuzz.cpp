// Fuzz harness: the control socket (lib/control, docs/control.md) on
// arbitrary lines, from both ends (docs/testing.md):
//  - the server: control::answer_request, what a Server replies to one
//    request line, with a handler that reads the request's fields the way
//    pmirrord's and libpmirror's handlers do (daemon/pmirrord.cpp,
//    lib/initiator/status_registry.cpp and volume.cpp). The reply must be
//    one line of JSON that parses back, {"ok":true,...} or {"ok":false,
//    "error":{"code":C,"message":M}} with C an error name;
//  - the client: the same bytes as a reply pmirrorctl received, through
//    its presentation (merge_status, format_*_human, ...). pmirrorctl, run
//    as root, reads every libpmirror process's socket, and such a process
//    may belong to any user: what it sends is untrusted.
// Besides memory safety and undefined behaviour, nothing may throw.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/rfc3339.h"
#include "control/control.h"

namespace {

using namespace pmirror;
using json = nlohmann::json;

void require(bool condition) {
  if (!condition) std::abort();
}

// Reads fields as the real handlers do; json's value() and get() throw on
// a mistyped field, which answer_request turns into an internal error.
Result<json> handle(const json& request) {
  const std::string command = request.value("command", "");
  if (command == "status") {
    json status = {{"schema_version", control::kSchemaVersion},
                   {"process", {{"kind", "pmirrord"}, {"pid", 1}, {"node", "node2"}}},
                   {"volumes", json::array()}};
    if (request.contains("volume")) status["asked"] = request["volume"];
    return status;
  }
  if (command == "promote" || command == "demote") {
    auto volume = request.find("volume");
    if (volume == request.end() || !volume->is_string() || volume->get<std::string>().empty()) {
      return Status(Errc::kInvalidArgument, command + " needs \"volume\": the volume's name");
    }
    auto force = request.find("force");
    if (force != request.end() && !force->is_boolean()) {
      return Status(Errc::kInvalidArgument, "promote: \"force\" must be true or false");
    }
    return json{{"volume", *volume}, {"promoted", command == "promote"}};
  }
  if (command == "resync" || command == "verify") {
    if (!request.contains("volume") || !request["volume"].is_string()) {
      return Status(Errc::kInvalidArgument, "'" + command + "' needs a \"volume\" string");
    }
    const std::string volume = request["volume"].get<std::string>();
    std::string peer = request.contains("peer") && request["peer"].is_string()
                           ? request["peer"].get<std::string>()
                           : std::string();
    bool flag = request.value(command == "resync" ? "full" : "mark_dirty", false);
    if (volume != "db0") return Status(Errc::kNotFound, "no volume '" + volume + "'");
    return json{{"volume", volume}, {"peer", peer}, {"flag", flag}};
  }
  return control::unknown_command(request);
}

void server_side(const std::string& line) {
  std::string reply = control::answer_request(line, handle);
  require(!reply.empty() && reply.back() == '\n');
  require(reply.find('\n') == reply.size() - 1);
  json parsed = json::parse(reply, nullptr, false);
  require(!parsed.is_discarded() && parsed.is_object());
  require(parsed.contains("ok") && parsed["ok"].is_boolean());
  if (parsed["ok"].get<bool>()) {
    require(parsed.contains("result"));
  } else {
    const json& error = parsed["error"];
    require(error.is_object() && error["code"].is_string() && error["message"].is_string());
    std::string code = error["code"].get<std::string>();
    require(errc_name(control::errc_from_name(code)) == code);
  }
}

void client_side(const json& reply) {
  control::HumanFormat format;
  format.now = std::chrono::system_clock::time_point(std::chrono::seconds(1800000000));
  format.utc = true;
  for (const std::optional<std::string>& volume : {std::optional<std::string>(), {"db0"}}) {
    json merged = control::merge_status({reply, reply}, volume);
    control::volume_names(merged);
    control::format_status_human(merged, volume, format);
  }
  control::has_primary_volume(reply, "db0");
  control::format_event_human(reply, format);
  control::format_resync_human(reply);
  control::format_verify_human(reply, 3);
  control::verify_mismatches(reply);
  control::verify_failures(reply);
  control::format_promote_human(reply);
  control::format_generation(reply);
  if (reply.is_string()) parse_rfc3339(reply.get<std::string>());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The server reads up to kMaxRequestBytes per line and splits at '\n'.
  if (size > control::kMaxRequestBytes) return 0;
  std::string line(reinterpret_cast<const char*>(data), size);
  line = line.substr(0, line.find('\n'));
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line.find_first_not_of(" \t") == std::string::npos) return 0;
  json request = json::parse(line, nullptr, false);
  bool events = request.is_object() && request.value("command", json()) == "events";
  if (!events) server_side(line);
  if (!request.is_discarded()) client_side(request);
  return 0;
}

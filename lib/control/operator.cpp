// pmirrorctl's lines for an operator's switches: disconnect / connect (a
// primary's replicas) and down / up (a volume pmirrord serves).
#include <string>

#include "control/control.h"

namespace pmirror::control {
namespace {

using nlohmann::json;

std::string text(const json& object, const char* key) {
  if (!object.is_object()) return {};
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool truth(const json& object, const char* key) {
  if (!object.is_object()) return false;
  auto it = object.find(key);
  return it != object.end() && it->is_boolean() && it->get<bool>();
}

}  // namespace

std::string format_connect_human(const json& result) {
  const std::string volume = text(result, "volume");
  const bool connected = truth(result, "connected");
  std::string out;
  const json& peers = result.is_object() && result.contains("peers") ? result["peers"] : json();
  if (!peers.is_array()) return out;
  for (const json& peer : peers) {
    const std::string name = text(peer, "name");
    const bool changed = truth(peer, "changed");
    out += volume + ": " + name;
    if (connected) {
      out += changed ? " reconnecting; a resync brings it up to date (follow it with "
                       "`pmirrorctl status " +
                           volume + "`)"
                     : " was not disconnected by an operator; nothing changed";
    } else {
      out += std::string(changed ? " disconnected by an operator"
                                 : " was disconnected by an operator already") +
             "; its writes are recorded dirty until `pmirrorctl connect " + volume + " --peer " +
             name + "`";
    }
    out += "\n";
  }
  return out;
}

std::string format_down_human(const json& result) {
  const std::string volume = text(result, "volume");
  const std::string node = text(result, "node");
  const std::string on = node.empty() ? "" : " on " + node;
  const bool changed = truth(result, "changed");
  if (!truth(result, "down")) {
    return volume + (changed ? ": served again" + on + "; writers may connect"
                             : ": was not down" + on + "; nothing changed");
  }
  std::string line = volume + (changed ? ": down by an operator" : ": was down already") + on;
  if (changed && result.contains("sessions_ended") &&
      result["sessions_ended"].is_number_integer()) {
    line += ": " + std::to_string(result["sessions_ended"].get<int64_t>()) + " session(s) ended";
  }
  return line + "; new sessions are refused until `pmirrorctl up " + volume + "`";
}

}  // namespace pmirror::control

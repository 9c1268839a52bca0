// Internal to lib/config: loading the cluster file's YAML without
// yaml-cpp 0.7's YAML::LoadAll, which never returns on some malformed
// streams. Given a stray ',' where a document's node should start (",",
// "a: 1\n---\n,"), its parser reports the same empty document forever
// without consuming the ',', and LoadAll collects them until the process
// runs out of memory (found by tests/fuzz/config_fuzz; fixed upstream
// after yaml-cpp 0.8.0, jbeder/yaml-cpp#1319; Debian 12 ships 0.7.0).
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <string>

namespace pmirror::config {

struct YamlDocuments {
  YAML::Node first;   // the first document's root; Null if there is none
  size_t count = 0;   // documents in the stream
  YAML::Mark second;  // the second document's root node (count > 1)
};

// Walks every document's events (no tree is built), stopping with a
// YAML::ParserException at the point where the parser stops advancing, then
// loads the first document. Throws what YAML::Load throws on bad YAML.
YamlDocuments load_yaml_documents(const std::string& text);

}  // namespace pmirror::config

#include "config/yaml_documents.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>

#include <sstream>

namespace pmirror::config {
namespace {

// Records where each document and its root node start; ignores the rest.
class DocumentStarts final : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    start = mark;
    root = mark;
    root_seen = false;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    node(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    node(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    node(mark);
  }
  void OnMapEnd() override {}

  YAML::Mark start;  // of the document
  YAML::Mark root;   // of its root node, as YAML::Node::Mark() gives it
  bool root_seen = false;

 private:
  void node(const YAML::Mark& mark) {
    if (root_seen) return;
    root = mark;
    root_seen = true;
  }
};

}  // namespace

YamlDocuments load_yaml_documents(const std::string& text) {
  YamlDocuments documents;
  try {
    std::istringstream stream(text);
    YAML::Parser parser(stream);
    DocumentStarts starts;
    int previous = -1;
    while (parser.HandleNextDocument(starts)) {
      // Each document starts past the previous one; a parser that does not
      // advance would report this one forever.
      if (starts.start.pos <= previous) {
        throw YAML::ParserException(starts.start,
                                    "unexpected character where a value should start (a ',' "
                                    "outside [...] or {...}?)");
      }
      previous = starts.start.pos;
      if (++documents.count == 2) documents.second = starts.root;
    }
    if (documents.count > 0) documents.first = YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {
    // yaml-cpp's own message for it is "bad file".
    throw YAML::ParserException(e.mark, "nested more than " + std::to_string(e.depth()) +
                                            " levels deep; a cluster file needs a few");
  }
  return documents;
}

}  // namespace pmirror::config

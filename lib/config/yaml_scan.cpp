// A second look at the configuration, as YAML events rather than nodes:
// yaml-cpp's nodes do not say where an alias was written (an alias IS its
// anchor's node, Mark() and all), nor where an empty sequence item is (its
// Mark() is the next token's), and walking nodes cannot tell an alias bomb
// from a big file without expanding it. The event stream has all of that,
// in document order and without expansion.
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <vector>

#include "config/config_internal.h"

namespace pmirror::config {
namespace {

// Thrown by the handler to stop the parser once the document is refused.
struct Refused {};

uint64_t saturating_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

// The '-' of an empty block sequence item, searched backwards from `next`,
// the token after it (which yaml-cpp gives as the item's mark): skipping
// blanks, line ends and comments, the first thing found must be a '-'.
std::optional<YAML::Mark> dash_before(const std::string& text, const YAML::Mark& next) {
  if (next.pos < 0 || static_cast<size_t>(next.pos) > text.size()) return std::nullopt;
  size_t end = static_cast<size_t>(next.pos);  // the part of the line before `next`
  int line = next.line;
  bool first = true;
  while (line >= 0) {
    size_t start = end == 0 ? 0 : text.rfind('\n', end - 1);
    start = start == std::string::npos || end == 0 ? 0 : start + 1;
    std::string_view part(text.data() + start, end - start);
    if (!first) {
      // A comment: '#' at the start or after a blank (an empty item has no
      // quoted text that could hold one).
      for (size_t i = 0; i < part.size(); ++i) {
        if (part[i] == '#' && (i == 0 || is_blank(part[i - 1]))) {
          part = part.substr(0, i);
          break;
        }
      }
    }
    while (!part.empty() && is_blank(part.back())) part.remove_suffix(1);
    if (!part.empty()) {
      if (part.back() != '-') return std::nullopt;
      size_t column = part.size() - 1;
      YAML::Mark dash;
      dash.pos = static_cast<int>(start + column);
      dash.line = line;
      dash.column = static_cast<int>(column);
      return dash;
    }
    if (start == 0) return std::nullopt;
    end = start - 1;  // before that line's '\n'
    --line;
    first = false;
  }
  return std::nullopt;
}

// `null`, `~` and friends written out: the mark is right.
bool explicit_null_at(const std::string& text, const YAML::Mark& mark) {
  if (mark.pos < 0 || static_cast<size_t>(mark.pos) >= text.size()) return false;
  std::string_view rest(text.data() + mark.pos, text.size() - static_cast<size_t>(mark.pos));
  for (std::string_view word : {"~", "null", "Null", "NULL"}) {
    if (rest.substr(0, word.size()) == word) return true;
  }
  return false;
}

class Scanner : public YAML::EventHandler {
 public:
  explicit Scanner(const std::string& text) : text_(text) {}

  DocumentScan& result() { return result_; }

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}

  void OnAnchor(const YAML::Mark&, const std::string& name) override { pending_name_ = name; }

  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    std::optional<std::string> path = begin(mark, anchor);
    if (path && !stack_.empty() && !stack_.back().map && stack_.back().block &&
        !explicit_null_at(text_, mark)) {
      if (auto dash = dash_before(text_, mark)) result_.fixes[*path] = {mark, *dash};
    }
    if (anchor != YAML::NullAnchor) anchors_[anchor].size = 1;
    finish(1);
  }

  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                const std::string& value) override {
    bool is_key = !stack_.empty() && stack_.back().map && stack_.back().at_key;
    begin(mark, anchor);
    if (is_key) {
      stack_.back().key = value;
      stack_.back().key_is_scalar = true;
    }
    if (anchor != YAML::NullAnchor) anchors_[anchor].size = 1;
    finish(1);
  }

  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    std::optional<std::string> path = child_path();
    const Anchor& target = anchor < anchors_.size() ? anchors_[anchor] : Anchor{};
    std::string name = target.name.empty() ? "" : " *" + target.name;
    if (target.open) {
      refuse(mark, "alias" + name +
                       " refers to a node that contains it (a cycle); a configuration cannot "
                       "use one");
    }
    total_ = saturating_add(total_, target.size);
    if (total_ > kMaxDocumentNodes) {
      refuse(mark, "with this alias" + name + " (" + std::to_string(target.size) +
                       " nodes), the document has more than " + std::to_string(kMaxDocumentNodes) +
                       " YAML nodes once its aliases are expanded; a cluster file needs far "
                       "fewer, so it is not read any further");
    }
    if (path) result_.fixes[*path] = {target.mark, mark};
    finish(target.size);
  }

  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value style) override {
    open(mark, anchor, /*map=*/false, style != YAML::EmitterStyle::Flow);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    open(mark, anchor, /*map=*/true, false);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Frame {
    bool map = false;
    bool block = false;  // a block sequence: items start with '-'
    std::string path;
    size_t index = 0;    // sequence: the next item's index
    bool at_key = true;  // map: the next node is a key
    std::string key;     // map: the current key
    bool key_is_scalar = false;
    uint64_t size = 1;  // nodes so far, itself included, aliases expanded
    YAML::anchor_t anchor = YAML::NullAnchor;
  };
  struct Anchor {
    std::string name;
    YAML::Mark mark;
    uint64_t size = 1;  // nodes, aliases expanded
    bool open = false;  // a map or sequence not ended yet
  };

  [[noreturn]] void refuse(const YAML::Mark& mark, std::string why) {
    result_.refused_at = mark;
    result_.refused = std::move(why);
    throw Refused{};
  }

  // The key path of the node that comes next; none for a map key.
  std::optional<std::string> child_path() const {
    if (stack_.empty()) return std::string();
    const Frame& parent = stack_.back();
    if (!parent.map) return parent.path + "[" + std::to_string(parent.index) + "]";
    if (parent.at_key) return std::nullopt;
    std::string key = parent.key_is_scalar ? parent.key : "?";
    return parent.path.empty() ? key : parent.path + "." + key;
  }

  // A node (not an alias) starts: count it, remember its anchor.
  std::optional<std::string> begin(const YAML::Mark& mark, YAML::anchor_t anchor) {
    if (++total_ > kMaxDocumentNodes) {
      refuse(mark, "the document has more than " + std::to_string(kMaxDocumentNodes) +
                       " YAML nodes; a cluster file needs far fewer, so it is not read any "
                       "further");
    }
    if (anchor != YAML::NullAnchor) {
      if (anchors_.size() <= anchor) anchors_.resize(anchor + 1);
      anchors_[anchor].name = std::move(pending_name_);
      anchors_[anchor].mark = mark;
    }
    pending_name_.clear();
    return child_path();
  }

  void open(const YAML::Mark& mark, YAML::anchor_t anchor, bool map, bool block) {
    std::optional<std::string> path = begin(mark, anchor);
    if (anchor != YAML::NullAnchor) anchors_[anchor].open = true;
    Frame frame;
    frame.map = map;
    frame.block = block;
    frame.path = path.value_or("?");
    frame.anchor = anchor;
    stack_.push_back(std::move(frame));
  }

  void close() {
    Frame frame = std::move(stack_.back());
    stack_.pop_back();
    if (frame.anchor != YAML::NullAnchor) {
      anchors_[frame.anchor].size = frame.size;
      anchors_[frame.anchor].open = false;
    }
    finish(frame.size);
  }

  // A child of `size` nodes is complete: count it into its parent.
  void finish(uint64_t size) {
    if (stack_.empty()) return;
    Frame& parent = stack_.back();
    parent.size = saturating_add(parent.size, size);
    if (!parent.map) {
      ++parent.index;
    } else if (parent.at_key) {
      parent.at_key = false;
    } else {
      parent.at_key = true;
      parent.key_is_scalar = false;
      ++parent.index;
    }
  }

  const std::string& text_;
  DocumentScan result_;
  std::vector<Frame> stack_;
  std::vector<Anchor> anchors_;
  std::string pending_name_;
  uint64_t total_ = 0;  // nodes so far, aliases expanded
};

}  // namespace

DocumentScan scan_document(const std::string& text) {
  std::istringstream in(text);
  Scanner scanner(text);
  try {
    YAML::Parser parser(in);
    parser.HandleNextDocument(scanner);
  } catch (const Refused&) {
    // result() says why
  } catch (const YAML::Exception&) {
    // yaml-cpp loaded this text already; nothing new to learn here
  }
  return std::move(scanner.result());
}

YAML::Mark clamp_mark(const std::string& text, YAML::Mark mark) {
  if (mark.is_null() || mark.pos < 0) return mark;
  size_t last = text.size();
  while (last > 0 && (is_blank(text[last - 1]) || text[last - 1] == '\n')) --last;
  if (last == 0 || static_cast<size_t>(mark.pos) < last) return mark;
  // Past the last character that is not blank: onto that character's line,
  // at its first non-blank character.
  size_t line_start = text.rfind('\n', last - 1);
  line_start = line_start == std::string::npos ? 0 : line_start + 1;
  size_t column = 0;
  while (line_start + column < last && is_blank(text[line_start + column])) ++column;
  YAML::Mark clamped;
  clamped.pos = static_cast<int>(line_start + column);
  clamped.line = static_cast<int>(std::count(text.begin(), text.begin() + line_start, '\n'));
  clamped.column = static_cast<int>(column);
  return clamped;
}

}  // namespace pmirror::config

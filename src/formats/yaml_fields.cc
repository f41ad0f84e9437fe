#include "formats/yaml_fields.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>

#include <sstream>
#include <vector>

#include "core/quantity.h"
#include "core/strings.h"

namespace tessera::formats {

namespace {

int LineOf(const YAML::Mark& mark) {
  return mark.line >= 0 ? mark.line + 1 : 0;
}

// Sums the nodes and scalar bytes of a document as if every alias were written out, from the parser's events
// (nothing is built), and throws FileError as soon as a limit is passed. An anchor's size is known when its
// node ends; an alias to an anchor still open is a cycle, which yaml-cpp would load as a node containing
// itself.
class ExpansionCounter : public YAML::EventHandler {
 public:
  ExpansionCounter(const YamlLimits& limits, int64_t max_bytes) : limits_(limits), max_bytes_(max_bytes) {}

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override { Leaf(mark, anchor, 0); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                const std::string& value) override {
    Leaf(mark, anchor, static_cast<int64_t>(value.size()));
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    if (anchor >= sizes_.size() || sizes_[anchor].nodes < 0) {
      throw FileError{LineOf(mark),
                      "an alias refers to a node that contains it (a cycle); write the value out"};
    }
    Add(mark, sizes_[anchor].nodes, sizes_[anchor].bytes);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    Open(mark, anchor);
  }
  void OnSequenceEnd() override { Close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    Open(mark, anchor);
  }
  void OnMapEnd() override { Close(); }

 private:
  struct Size {
    int64_t nodes = -1;  // -1: the anchored node has not ended yet
    int64_t bytes = 0;
  };
  struct Frame {
    YAML::anchor_t anchor;
    int64_t nodes_before;
    int64_t bytes_before;
  };

  Size& Slot(YAML::anchor_t anchor) {
    if (anchor >= sizes_.size()) sizes_.resize(anchor + 1);
    return sizes_[anchor];
  }
  void Add(const YAML::Mark& mark, int64_t nodes, int64_t bytes) {
    nodes_ = core::SaturatingAdd(nodes_, nodes);
    bytes_ = core::SaturatingAdd(bytes_, bytes);
    if (nodes_ > limits_.max_nodes) {
      throw FileError{
          LineOf(mark),
          StrCat("the document has more than ", limits_.max_nodes,
                 " values (lists, maps and scalars, an alias counting as what it names ",
                 "each time it is used); split the file, or write repeated nodes once ", "with replicas")};
    }
    if (bytes_ > max_bytes_) {
      throw FileError{LineOf(mark),
                      StrCat("the document's aliases expand it to more than ", max_bytes_,
                             " bytes of values (the limit for this file: ", limits_.min_expanded_bytes >> 20,
                             " MiB plus ", limits_.expanded_bytes_per_byte,
                             " times its size); write repeated values once instead of aliasing "
                             "them many times, or use replicas")};
    }
  }
  void Leaf(const YAML::Mark& mark, YAML::anchor_t anchor, int64_t bytes) {
    Add(mark, 1, bytes);
    if (anchor != YAML::NullAnchor) Slot(anchor) = Size{1, bytes};
  }
  void Open(const YAML::Mark& mark, YAML::anchor_t anchor) {
    if (static_cast<int>(stack_.size()) >= limits_.max_depth) {
      throw FileError{LineOf(mark), StrCat("lists and maps are nested more than ", limits_.max_depth,
                                           " levels deep here; Tessera's files need a few: check the ",
                                           "indentation and the brackets")};
    }
    if (anchor != YAML::NullAnchor)
      Slot(anchor);  // known to exist, size not yet known: an alias now is a cycle
    stack_.push_back({anchor, nodes_, bytes_});
    Add(mark, 1, 0);
  }
  void Close() {
    if (stack_.empty()) return;
    const Frame f = stack_.back();
    stack_.pop_back();
    if (f.anchor != YAML::NullAnchor) Slot(f.anchor) = Size{nodes_ - f.nodes_before, bytes_ - f.bytes_before};
  }

  const YamlLimits& limits_;
  const int64_t max_bytes_;
  int64_t nodes_ = 0;
  int64_t bytes_ = 0;
  std::vector<Frame> stack_;
  std::vector<Size> sizes_;  // by anchor id (yaml-cpp numbers a document's anchors from 1)
};

}  // namespace

YAML::Node LoadBounded(std::string_view text, const YamlLimits& limits) {
  if (text.size() > limits.max_text_bytes) {
    throw FileError{0, StrCat("the file is ", text.size(), " bytes; the limit for a YAML or JSON file is ",
                              limits.max_text_bytes >> 20,
                              " MiB: split it, or write repeated nodes once with ", "replicas")};
  }
  const int64_t max_bytes = core::SaturatingAdd(
      limits.min_expanded_bytes,
      core::SaturatingMul(limits.expanded_bytes_per_byte, static_cast<int64_t>(text.size())));
  {
    std::istringstream in{std::string(text)};
    YAML::Parser parser(in);
    ExpansionCounter counter(limits, max_bytes);
    try {
      parser.HandleNextDocument(counter);
    } catch (const YAML::DeepRecursion& e) {
      throw FileError{LineOf(e.mark), StrCat("lists and maps are nested more than ", e.depth(),
                                             " levels deep here; check the indentation and the brackets")};
    }
  }
  return YAML::Load(std::string(text));
}

[[noreturn]] void Fail(const YAML::Node& at, std::string message) {
  throw FileError{at.Mark().line >= 0 ? at.Mark().line + 1 : 0, std::move(message)};
}

void CheckKeys(const YAML::Node& map, std::initializer_list<const char*> allowed, std::string_view what) {
  if (!map.IsMap()) Fail(map, StrCat(what, " must be a mapping (key: value)"));
  for (const auto& kv : map) {
    const std::string key = kv.first.as<std::string>();
    bool ok = false;
    for (const char* a : allowed) ok = ok || key == a;
    if (!ok) {
      std::vector<std::string> names(allowed.begin(), allowed.end());
      Fail(kv.first,
           StrCat("unknown field \"", key, "\" in ", what, "; expected one of: ", StrJoin(names, ", ")));
    }
  }
}

std::string Str(const YAML::Node& n, std::string_view field) {
  if (!n.IsScalar()) Fail(n, StrCat(field, " must be a single value"));
  return n.as<std::string>();
}

int64_t Int(const YAML::Node& n, std::string_view field, int64_t min, int64_t max) {
  if (!n.IsScalar()) Fail(n, StrCat(field, " must be a number"));
  int64_t v = 0;
  try {
    v = n.as<int64_t>();
  } catch (const YAML::Exception&) {
    Fail(n, StrCat(field, " must be a whole number, not \"", n.as<std::string>(), "\""));
  }
  if (v < min || v > max) Fail(n, StrCat(field, " is ", v, "; expected ", min, " to ", max));
  return v;
}

bool Bool(const YAML::Node& n, std::string_view field) {
  try {
    return n.as<bool>();
  } catch (const YAML::Exception&) {
    Fail(n, StrCat(field, " must be true or false"));
  }
}

}  // namespace tessera::formats

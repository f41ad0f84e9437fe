#include "scheduler/extender_args.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <optional>
#include <set>
#include <utility>

#include "core/strings.h"
#include "formats/bounded_json.h"

namespace tessera::scheduler {

namespace {

using nlohmann::json;

// The general path: nlohmann's SAX parser over the whole text, collecting the top-level NodeNames (thousands
// of strings) straight into a vector instead of a JSON tree, everything else into nlohmann's own DOM builder.
// Keys are matched as Go's decoder matches them (any case); a NodeNames that is not a list of strings is
// reported.
class ArgsSax {
 public:
  ArgsSax(json& root, size_t max_bytes, size_t max_names)
      : dom_(root, /*allow_exceptions=*/false), budget_(max_bytes), max_names_(max_names) {}

  bool null() {
    return InNames() ? Bad() : Value([&] { return Charge(formats::DomCost::kScalar) && dom_.null(); }, true);
  }
  bool boolean(bool v) {
    return InNames() ? Bad() : Value([&] { return Charge(formats::DomCost::kScalar) && dom_.boolean(v); });
  }
  bool number_integer(json::number_integer_t v) {
    return InNames() ? Bad()
                     : Value([&] { return Charge(formats::DomCost::kScalar) && dom_.number_integer(v); });
  }
  bool number_unsigned(json::number_unsigned_t v) {
    return InNames() ? Bad()
                     : Value([&] { return Charge(formats::DomCost::kScalar) && dom_.number_unsigned(v); });
  }
  bool number_float(json::number_float_t v, const std::string& text) {
    return InNames() ? Bad()
                     : Value([&] { return Charge(formats::DomCost::kScalar) && dom_.number_float(v, text); });
  }
  bool string(std::string& v) {
    if (InNames()) {
      // Past the cap the names are counted, not kept: the answer is a refusal (ReadExtenderArgs).
      if (++names_seen_ <= max_names_) names_.push_back(std::move(v));
      return true;
    }
    return Value([&] {
      return Charge(formats::DomCost::kString + formats::DomCost::Text(v.size())) && dom_.string(v);
    });
  }
  bool binary(json::binary_t& v) {
    return InNames() ? Bad()
                     : Value([&] { return Charge(formats::DomCost::kString + v.size()) && dom_.binary(v); });
  }
  bool start_object(std::size_t n) {
    if (InNames()) return Bad();
    if (names_next_) return Bad();
    if (++depth_ > formats::kMaxJsonDepth) return TooDeep();
    return Charge(formats::DomCost::kObject) && dom_.start_object(n);
  }
  bool end_object() {
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    if (InNames()) return Bad();
    if (names_next_) {
      names_next_ = false;
      in_names_ = true;
      has_names_ = true;
      return true;
    }
    if (++depth_ > formats::kMaxJsonDepth) return TooDeep();
    return Charge(formats::DomCost::kArray) && dom_.start_array(n);
  }
  bool end_array() {
    if (in_names_) {
      in_names_ = false;
      return true;
    }
    --depth_;
    return dom_.end_array();
  }
  bool key(std::string& k) {
    if (depth_ == 1 && EqualsIgnoreCase(k, "NodeNames")) {
      names_next_ = true;
      return true;
    }
    // A top-level field given twice, in any case ("Pod" and "pod"): Go's decoder, which kube-scheduler uses,
    // matches keys in any case and keeps the last, where the DOM kept both and the extender read the exact
    // name. kube-scheduler never sends a field twice, so such a body is refused rather than read one way or
    // the other. (NodeNames lists add up, as they always have: each name is judged on its own.)
    if (depth_ == 1 && !top_keys_.insert(AsciiLower(k)).second) {
      duplicate_ = k;
      return false;
    }
    return Charge(formats::DomCost::kMember + formats::DomCost::Text(k.size())) && dom_.key(k);
  }
  bool parse_error(std::size_t position, const std::string& token, const nlohmann::detail::exception& e) {
    return dom_.parse_error(position, token, e);
  }

  bool bad_names() const { return bad_names_; }
  bool too_deep() const { return too_deep_; }
  bool too_big() const { return budget_.exceeded(); }
  bool has_names() const { return has_names_; }
  const std::optional<std::string>& duplicate() const { return duplicate_; }
  size_t names_seen() const { return names_seen_; }
  std::vector<std::string>& names() { return names_; }

 private:
  bool InNames() const { return in_names_; }
  bool Bad() {
    bad_names_ = true;
    return false;
  }
  // Objects and arrays nested deeper than any Kubernetes object: refused before anything walks them
  // recursively (copying a fitting node to echo it back, dumping the answer).
  bool TooDeep() {
    too_deep_ = true;
    return false;
  }
  bool Charge(size_t bytes) { return budget_.Charge(bytes); }
  // A scalar value: NodeNames' own value when it is not a list (null means absent), else the DOM's.
  template <typename F>
  bool Value(F forward, bool null = false) {
    if (names_next_) {
      names_next_ = false;
      return null ? true : Bad();
    }
    return forward();
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  formats::DomBudget budget_;  // the tree's memory, charged as formats::BoundedDomBuilder charges it
  const size_t max_names_;
  size_t names_seen_ = 0;
  int depth_ = 0;
  bool names_next_ = false;
  bool in_names_ = false;
  bool has_names_ = false;
  bool bad_names_ = false;
  bool too_deep_ = false;
  std::vector<std::string> names_;
  std::set<std::string> top_keys_;  // lower case
  std::optional<std::string> duplicate_;
};

// The refusal of a body naming more nodes than are read.
absl::Status TooManyNames(size_t names, size_t max_names) {
  return absl::InvalidArgumentError(StrCat("NodeNames names ", names, " nodes; at most ", max_names,
                                           " are read in one request (ten times the largest cluster ",
                                           "Kubernetes supports)"));
}

// Parses `text` through ArgsSax into `out`: the document, and NodeNames into out.owned_names. The tree may
// cost `max_bytes` (formats::DomCost).
absl::Status ParseGeneral(std::string_view text, ExtenderArgsDoc& out, size_t max_bytes, size_t max_names) {
  ArgsSax sax(out.doc, max_bytes, max_names);
  const bool parsed_ok = json::sax_parse(text.begin(), text.end(), &sax);
  if (sax.bad_names()) return absl::InvalidArgumentError("NodeNames must be a list of node names");
  if (sax.too_deep()) {
    return absl::InvalidArgumentError(StrCat("the request body is nested deeper than ",
                                             formats::kMaxJsonDepth,
                                             " levels of objects and arrays; no ExtenderArgs is"));
  }
  if (sax.duplicate()) {
    return absl::InvalidArgumentError(StrCat("the request body gives the field \"", *sax.duplicate(),
                                             "\" twice (field names match in any case, as in Go); ",
                                             "kube-scheduler sends each field once"));
  }
  if (sax.too_big()) {
    return absl::InvalidArgumentError(
        StrCat("the request body would take more than ", max_bytes >> 20,
               " MiB parsed: too many values for its size (at most about 6 ",
               "bytes of memory per byte sent); kube-scheduler sends no such body"));
  }
  if (!parsed_ok || out.doc.is_discarded()) {
    return absl::InvalidArgumentError(
        "the request body is not valid JSON; kube-scheduler sends JSON objects");
  }
  if (!out.doc.is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  if (sax.names_seen() > max_names) return TooManyNames(sax.names_seen(), max_names);
  out.has_names = out.has_names || sax.has_names();
  out.owned_names = std::move(sax.names());
  return absl::OkStatus();
}

bool IsJsonSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// Bytes a name may hold on the fast path: printable ASCII but the quote and the backslash. JSON takes them
// as they are (no escape, no UTF-8 to check), so the name is its own bytes. Node names are DNS subdomains.
constexpr std::array<bool, 256> kPlainNameByte = [] {
  std::array<bool, 256> t{};
  for (int c = 0x20; c < 0x80; ++c) t[static_cast<size_t>(c)] = c != '"' && c != '\\';
  return t;
}();

// The fast path's reading of the top level. It follows the grammar of the top-level object itself; values
// other than NodeNames are skipped by matching brackets outside strings, without judging them: the JSON
// parser reads them afterwards, in `rest`. Every method returns false for "take the general path".
class TopLevelScan {
 public:
  TopLevelScan(std::string_view s, size_t max_names) : s_(s), max_names_(max_names) {}

  bool Run(NodeNamesScan& out) {
    SkipSpace();
    if (!Take('{')) return false;
    SkipSpace();
    if (!Take('}')) {
      while (true) {
        std::string_view key;
        if (!Key(key)) return false;
        SkipSpace();
        if (!Take(':')) return false;
        SkipSpace();
        if (EqualsIgnoreCase(key, "NodeNames")) {
          if (!NodeNamesValue(out)) return false;
        } else if (!SkipValue()) {
          return false;
        }
        SkipSpace();
        if (Take(',')) {
          SkipSpace();
          continue;
        }
        if (Take('}')) break;
        return false;
      }
    }
    SkipSpace();
    if (i_ != s_.size()) return false;
    // The body without the lists: what the JSON parser still has to read.
    out.rest.reserve(s_.size() - cut_bytes_ + 4 * cuts_.size());
    size_t from = 0;
    for (const auto& [begin, end] : cuts_) {
      out.rest.append(s_.substr(from, begin - from));
      out.rest.append("null");
      from = end;
    }
    out.rest.append(s_.substr(from));
    return true;
  }

 private:
  void SkipSpace() {
    while (i_ < s_.size() && IsJsonSpace(s_[i_])) ++i_;
  }
  bool Take(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  // A string at s_[i_] == '"', up to its closing quote (a backslash escapes the next byte); `escaped` says
  // whether it held a backslash. What else it holds is the JSON parser's to judge.
  bool SkipString(bool& escaped) {
    ++i_;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '"') {
        ++i_;
        return true;
      }
      if (c == '\\') {
        escaped = true;
        ++i_;
      }
      ++i_;
    }
    return false;
  }
  // A top-level key. One written with escapes could spell NodeNames: the general path decodes it.
  bool Key(std::string_view& key) {
    if (i_ >= s_.size() || s_[i_] != '"') return false;
    const size_t start = i_ + 1;
    bool escaped = false;
    if (!SkipString(escaped) || escaped) return false;
    key = s_.substr(start, i_ - 1 - start);
    return true;
  }
  // Any other value: a string, an object or array to its matching bracket, or a scalar to the next delimiter.
  bool SkipValue() {
    if (i_ >= s_.size()) return false;
    bool escaped = false;
    if (s_[i_] == '"') return SkipString(escaped);
    if (s_[i_] == '{' || s_[i_] == '[') {
      size_t depth = 0;  // a counter, not recursion: any nesting costs nothing here (the parser limits it)
      while (i_ < s_.size()) {
        const char c = s_[i_];
        if (c == '"') {
          if (!SkipString(escaped)) return false;
          continue;
        }
        ++i_;
        if (c == '{' || c == '[') {
          ++depth;
        } else if ((c == '}' || c == ']') && --depth == 0) {
          return true;
        }
      }
      return false;
    }
    const size_t start = i_;
    while (i_ < s_.size() && !IsJsonSpace(s_[i_]) && s_[i_] != ',' && s_[i_] != '}' && s_[i_] != ']') ++i_;
    return i_ > start;
  }
  // NodeNames' value: null (no list: left in place for the parser, which reads it as absent), or a list of
  // plain names, read here and cut out. Anything else, even a valid list of other strings: general path.
  bool NodeNamesValue(NodeNamesScan& out) {
    if (s_.substr(i_).starts_with("null")) {
      i_ += 4;
      return true;
    }
    const size_t begin = i_;
    if (!Take('[')) return false;
    SkipSpace();
    if (!Take(']')) {
      while (true) {
        if (!Take('"')) return false;
        const size_t start = i_;
        while (i_ < s_.size() && kPlainNameByte[static_cast<unsigned char>(s_[i_])]) ++i_;
        if (!Take('"'))
          return false;  // the end, or a byte that needs the JSON parser: escape, control, UTF-8
        // Past the cap the names are counted, not kept: the answer is a refusal (ReadExtenderArgs).
        if (++out.names_seen <= max_names_) out.names.push_back(s_.substr(start, i_ - 1 - start));
        SkipSpace();
        if (Take(',')) {
          SkipSpace();
          continue;
        }
        if (Take(']')) break;
        return false;
      }
    }
    out.has_names = true;
    cuts_.emplace_back(begin, i_);
    cut_bytes_ += i_ - begin;
    return true;
  }

  std::string_view s_;
  const size_t max_names_;
  size_t i_ = 0;
  std::vector<std::pair<size_t, size_t>> cuts_;  // [begin, end) of each NodeNames list
  size_t cut_bytes_ = 0;
};

}  // namespace

std::optional<NodeNamesScan> ScanNodeNames(std::string_view body, size_t max_names) {
  NodeNamesScan out;
  if (!TopLevelScan(body, max_names).Run(out)) return std::nullopt;
  return out;
}

absl::StatusOr<ExtenderArgsDoc> ReadExtenderArgs(std::string_view body, ArgsPath path, size_t max_names) {
  ExtenderArgsDoc out;
  // The tree's budget follows the whole body on both paths, so that they accept the same bodies.
  const size_t max_bytes = formats::DomBudgetFor(body.size());
  if (path == ArgsPath::kFast) {
    if (std::optional<NodeNamesScan> scan = ScanNodeNames(body, max_names)) {
      out.fast = true;
      out.has_names = scan->has_names;
      out.names = std::move(scan->names);
      if (absl::Status st = ParseGeneral(scan->rest, out, max_bytes, max_names); !st.ok()) return st;
      // Every top-level NodeNames left in `rest` is null: the general path found no names there.
      if (scan->names_seen > max_names) return TooManyNames(scan->names_seen, max_names);
      return out;
    }
  }
  if (absl::Status st = ParseGeneral(body, out, max_bytes, max_names); !st.ok()) return st;
  out.names.assign(out.owned_names.begin(), out.owned_names.end());
  return out;
}

}  // namespace tessera::scheduler

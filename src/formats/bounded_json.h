// JSON parsing for documents that come from outside the process: depth-limited, never throwing, with
// out-of-range numbers reported instead of thrown.
//
// nlohmann's parser is iterative, but copying a parsed document, dumping it and comparing it recurse once per
// level: a request nested 100,000 levels deep overflows the stack of whoever touches it next. Every document
// that crosses a trust boundary (HTTP bodies, annotations, files) is parsed here, with a depth limit far
// above what any Kubernetes object needs (a Pod nests about 15 levels) and far below what the stack can take.
//
//   absl::StatusOr<nlohmann::json> doc = formats::ParseBoundedJson(body, "the AdmissionReview");
//   if (!doc.ok()) return BadRequest(doc.status());   // "the AdmissionReview is nested deeper than 128 ..."
//
// Thread-safety: pure functions.
#ifndef TESSERA_FORMATS_BOUNDED_JSON_H_
#define TESSERA_FORMATS_BOUNDED_JSON_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tessera::formats {

// Objects and arrays nested deeper than this are refused. Kubernetes objects nest about 15 levels; 128 leaves
// room for any extension while keeping every recursive walk (copy, dump, compare) to a few hundred frames.
inline constexpr int kMaxJsonDepth = 128;

// What a parsed value costs in memory, about (nlohmann's 16-byte value plus what glibc allocates for it): a
// small document's tree is many times its text (`{}` is 2 bytes of text and about 100 of tree; 30 MB of them
// took 1 GB). A builder charges each value against a budget and refuses the document past it.
struct DomCost {
  // A value in an array: 16 bytes, three times over while the vector moves to a larger buffer.
  static constexpr size_t kScalar = 48;   // null, bool, number
  static constexpr size_t kString = 88;   // and its std::string (with malloc's header)
  static constexpr size_t kObject = 104;  // and its std::map
  static constexpr size_t kMember = 88;   // a map node with its key (its value is charged apart)
  static constexpr size_t kArray = 72;    // and its std::vector
  static size_t Text(size_t bytes) { return bytes > 15 ? bytes + 1 : 0; }  // beyond the string's own buffer
};

// The tree budget for a document of `text_bytes` from outside: a small multiple of its text, so that memory
// stays in proportion to what the sender sent.
inline size_t DomBudgetFor(size_t text_bytes) {
  return 6 * text_bytes + (size_t{1} << 20);
}

// Bytes a tree may still take (DomCost): charged as it is built; once a charge does not fit, `exceeded` stays set.
class DomBudget {
 public:
  explicit DomBudget(size_t max_bytes) : max_bytes_(max_bytes) {}
  bool Charge(size_t bytes) {
    if (bytes > max_bytes_ - used_) {
      exceeded_ = true;
      return false;
    }
    used_ += bytes;
    return true;
  }
  bool exceeded() const { return exceeded_; }
  size_t max_bytes() const { return max_bytes_; }

 private:
  size_t max_bytes_;
  size_t used_ = 0;
  bool exceeded_ = false;
};

// Counts the nesting of objects and arrays while nlohmann's DOM builder builds the tree; refuses a document
// deeper than `max_depth`, or whose tree would cost more than `max_bytes` (DomCost), and remembers the
// parser's own error (syntax, or a number out of double range such as 1e999) as text instead of throwing it.
// Usable on its own as the inner builder of a custom SAX handler.
class BoundedDomBuilder {
 public:
  using json = nlohmann::json;
  BoundedDomBuilder(json& root, int max_depth, size_t max_bytes = SIZE_MAX)
      : dom_(root, /*allow_exceptions=*/false), max_depth_(max_depth), budget_(max_bytes) {}

  bool null() { return Charge(DomCost::kScalar) && dom_.null(); }
  bool boolean(bool v) { return Charge(DomCost::kScalar) && dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return Charge(DomCost::kScalar) && dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) {
    return Charge(DomCost::kScalar) && dom_.number_unsigned(v);
  }
  bool number_float(json::number_float_t v, const std::string& s) {
    return Charge(DomCost::kScalar) && dom_.number_float(v, s);
  }
  bool string(std::string& v) { return Charge(DomCost::kString + DomCost::Text(v.size())) && dom_.string(v); }
  bool binary(json::binary_t& v) { return Charge(DomCost::kString + v.size()) && dom_.binary(v); }
  bool start_object(std::size_t n) { return Enter() && Charge(DomCost::kObject) && dom_.start_object(n); }
  bool end_object() {
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return Enter() && Charge(DomCost::kArray) && dom_.start_array(n); }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  bool key(std::string& k) { return Charge(DomCost::kMember + DomCost::Text(k.size())) && dom_.key(k); }
  bool parse_error(std::size_t position, const std::string& token, const nlohmann::detail::exception& e);

  bool too_deep() const { return too_deep_; }
  bool too_big() const { return budget_.exceeded(); }
  size_t max_bytes() const { return budget_.max_bytes(); }
  // The parser's message ("syntax error ...", "number overflow parsing '1e999'"); empty when none.
  const std::string& error() const { return error_; }
  int max_depth() const { return max_depth_; }

 private:
  bool Enter() {
    if (++depth_ > max_depth_) {
      too_deep_ = true;
      return false;
    }
    return true;
  }

  bool Charge(size_t bytes) { return budget_.Charge(bytes); }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  int depth_ = 0;
  int max_depth_;
  DomBudget budget_;
  bool too_deep_ = false;
  std::string error_;
};

// Parses `text` as one JSON document. `what` names it in errors ("the request body", "the fake API file x").
// Errors are InvalidArgument and say what is wrong: not JSON (with the parser's position), nested too deep,
// a tree above `max_bytes` (DomCost; DomBudgetFor(text.size()) for documents from outside), or a number
// outside the range of a double.
absl::StatusOr<nlohmann::json> ParseBoundedJson(std::string_view text, std::string_view what,
                                                int max_depth = kMaxJsonDepth, size_t max_bytes = SIZE_MAX);

// The value of `v` when it is a whole JSON number within [min, max]; nullopt otherwise. Unlike get<int>() it
// never truncates: 4294967297 is not 1, and 18446744073709551615 is not -1.
std::optional<int64_t> JsonIntIn(const nlohmann::json& v, int64_t min, int64_t max);

// `v` as compact JSON (or indented, indent >= 0), with invalid UTF-8 in strings replaced by U+FFFD instead of
// throwing. Every document that carries text from outside (messages quoting input, names from files) is
// written with it: nlohmann's dump() throws type_error 316 on a stray byte, which ended a server thread.
std::string DumpJson(const nlohmann::json& v, int indent = -1);

// The error ParseBoundedJson gives for `builder` after a failed parse; for custom SAX handlers built on it.
absl::Status BoundedJsonError(const BoundedDomBuilder& builder, std::string_view what);

}  // namespace tessera::formats

#endif  // TESSERA_FORMATS_BOUNDED_JSON_H_

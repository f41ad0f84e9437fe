// Label and field selectors as the Kubernetes API parses them, for the fake API server.
//
//   absl::StatusOr<LabelSelector> l = LabelSelector::Parse("app=web,tier!=db,env in (a,b),!canary");
//   bool m = l->Matches(pod["metadata"]["labels"]);
//   absl::StatusOr<FieldSelector> f = FieldSelector::Parse("spec.nodeName=gpu-1,status.phase!=Failed");
//   bool n = f->Matches(pod);
//
// Label selectors: key=value, key==value, key!=value, key in (a,b), key notin (a,b), key, !key.
// Field selectors: field=value, field==value, field!=value; which fields a resource supports is checked by
// the caller (the API server answers 400 for others).
//
// Thread-safety: immutable values after parsing.
#ifndef TESSERA_TOOLS_FAKE_APISERVER_SELECTORS_H_
#define TESSERA_TOOLS_FAKE_APISERVER_SELECTORS_H_

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::fake {

class LabelSelector {
 public:
  static absl::StatusOr<LabelSelector> Parse(std::string_view text);
  // `labels`: the metadata.labels map (null or absent: no labels).
  bool Matches(const nlohmann::json& labels) const;
  bool empty() const { return requirements_.empty(); }

 private:
  enum class Op { kEquals, kNotEquals, kIn, kNotIn, kExists, kNotExists };
  struct Requirement {
    std::string key;
    Op op;
    std::vector<std::string> values;
  };
  std::vector<Requirement> requirements_;
};

class FieldSelector {
 public:
  static absl::StatusOr<FieldSelector> Parse(std::string_view text);
  bool Matches(const nlohmann::json& object) const;
  bool empty() const { return requirements_.empty(); }
  // The fields named (to check that the resource supports them).
  std::vector<std::string> Fields() const;
  // The value required by a `field=value` requirement on `field`, if there is one.
  std::optional<std::string> EqualityValue(std::string_view field) const;

  // A field's value as field selectors see it: strings as they are, booleans and numbers as text, absent "".
  static std::string FieldValue(const nlohmann::json& object, std::string_view field);

 private:
  struct Requirement {
    std::string field;
    bool equals;
    std::string value;
  };
  std::vector<Requirement> requirements_;
};

}  // namespace tessera::fake

#endif  // TESSERA_TOOLS_FAKE_APISERVER_SELECTORS_H_

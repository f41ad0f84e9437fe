#include "formats/yaml_fields.h"

#include <vector>

#include "core/strings.h"

namespace tessera::formats {

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

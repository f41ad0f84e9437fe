// Reading typed fields out of a YAML document with errors that name the line, for the project's own files
// (cluster files, fake-GPU files). A walk throws FileError at the first problem; the file's parser catches it
// at the top and turns it into a Status with the file name.
//
//   try {
//     CheckKeys(node, {"name", "gpus"}, "a node");
//     int64_t n = Int(node["count"], "count", 1, 64);
//   } catch (const FileError& e) { return InvalidArgumentError(StrCat(path, ":", e.line, ": ", e.message)); }
//
// Thread-safety: pure functions.
#ifndef TESSERA_FORMATS_YAML_FIELDS_H_
#define TESSERA_FORMATS_YAML_FIELDS_H_

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace tessera::formats {

struct FileError {
  int line;  // 1-based; 0 when unknown
  std::string message;
};

[[noreturn]] void Fail(const YAML::Node& at, std::string message);
// `map` must be a mapping whose keys are all in `allowed`; `what` names it in the error ("a GPU").
void CheckKeys(const YAML::Node& map, std::initializer_list<const char*> allowed, std::string_view what);
std::string Str(const YAML::Node& n, std::string_view field);
int64_t Int(const YAML::Node& n, std::string_view field, int64_t min, int64_t max);
bool Bool(const YAML::Node& n, std::string_view field);

}  // namespace tessera::formats

#endif  // TESSERA_FORMATS_YAML_FIELDS_H_

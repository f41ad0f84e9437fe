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

// The limits on a YAML document, checked before it is loaded. yaml-cpp loads an alias as a second reference
// to its anchor's node, so a document's tree is small, but every walk over it (and every copy made from it)
// visits an aliased node once per alias: a 4 KB workload file of aliases expanded to gigabytes and ended in
// bad_alloc. The document is first read as events, summing what it would be with every alias written out.
struct YamlLimits {
  // Nodes (scalars, lists, maps) of the document with every alias written out.
  int64_t max_nodes = 2'000'000;
  // Scalar bytes with every alias written out: a fixed allowance plus a multiple of the text's own size (a
  // document without aliases is within its own size; aliases may repeat what they name a few times over).
  int64_t min_expanded_bytes = int64_t{1} << 20;
  int64_t expanded_bytes_per_byte = 4;
  // Nesting of lists and maps. Tessera's files need about six levels; yaml-cpp's own guard, deeper, said only
  // "bad file".
  int max_depth = 64;
  // The text itself.
  size_t max_text_bytes = size_t{32} << 20;
};

// Loads the first document of `text` after checking it against `limits`; throws FileError (with the line) for
// a document past them, and yaml-cpp's exceptions for a malformed one.
YAML::Node LoadBounded(std::string_view text, const YamlLimits& limits = {});
// `map` must be a mapping whose keys are all in `allowed`; `what` names it in the error ("a GPU").
void CheckKeys(const YAML::Node& map, std::initializer_list<const char*> allowed, std::string_view what);
std::string Str(const YAML::Node& n, std::string_view field);
int64_t Int(const YAML::Node& n, std::string_view field, int64_t min, int64_t max);
bool Bool(const YAML::Node& n, std::string_view field);

}  // namespace tessera::formats

#endif  // TESSERA_FORMATS_YAML_FIELDS_H_

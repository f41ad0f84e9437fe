// Reading whole files for the apps, with errors that name the file and what went wrong.
#ifndef TESSERA_COMMON_FILES_H_
#define TESSERA_COMMON_FILES_H_

#include <string>

#include "absl/status/statusor.h"

namespace tessera {

// Reads a file, or standard input when `path` is "-".
absl::StatusOr<std::string> ReadTextFile(const std::string& path);

}  // namespace tessera

#endif  // TESSERA_COMMON_FILES_H_

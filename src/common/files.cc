#include "common/files.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/status/status.h"
#include "core/strings.h"

namespace tessera {

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ostringstream out;
  if (path == "-") {
    out << std::cin.rdbuf();
    return out.str();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(StrCat(path, ": no such file"));
    return absl::PermissionDeniedError(StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  out << in.rdbuf();
  if (in.bad()) return absl::DataLossError(StrCat(path, ": read error"));
  return out.str();
}

}  // namespace tessera

#include "common/files.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include "absl/status/status.h"
#include "core/strings.h"

namespace tessera {

namespace {

// Reads `in` to its end or one byte past `max_bytes`, whichever comes first.
bool ReadCapped(std::istream& in, size_t max_bytes, std::string* out) {
  char buf[64 * 1024];
  while (in) {
    in.read(buf, sizeof(buf));
    const auto n = static_cast<size_t>(in.gcount());
    if (out->size() + n > max_bytes) return false;
    out->append(buf, n);
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> ReadTextFile(const std::string& path, size_t max_bytes) {
  std::string out;
  auto too_big = [&] {
    return absl::ResourceExhaustedError(StrCat(path == "-" ? "standard input" : path, " is larger than ",
                                               max_bytes, " bytes, more than any file this program reads; ",
                                               "check that the path names the right file"));
  };
  if (path == "-") {
    if (!ReadCapped(std::cin, max_bytes, &out)) return too_big();
    return out;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(StrCat(path, ": no such file"));
    return absl::PermissionDeniedError(StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  if (!ReadCapped(in, max_bytes, &out)) return too_big();
  if (in.bad()) return absl::DataLossError(StrCat(path, ": read error"));
  return out;
}

absl::Status WriteTextFileAtomically(const std::string& path, std::string_view text) {
  static std::atomic<uint64_t> writes{0};
  const std::string tmp = StrCat(path, ".tmp.", getpid(), ".", writes.fetch_add(1));
  {
    std::ofstream out(tmp, std::ios::trunc | std::ios::binary);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out) {
      const int e = errno;
      std::remove(tmp.c_str());
      return absl::InternalError(StrCat("cannot write ", tmp, ": ", std::strerror(e)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    return absl::InternalError(StrCat("cannot rename ", tmp, " to ", path, ": ", std::strerror(e)));
  }
  return absl::OkStatus();
}

}  // namespace tessera

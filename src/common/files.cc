#include "common/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
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

namespace {

struct RemoveBudget {
  size_t entries_left;
  std::string problem;  // the first thing that stopped the removal
};

// Empties the directory open as `dirfd` (which this call closes), entry by entry, relative to it.
void EmptyDirectoryAt(int dirfd, int depth_left, RemoveBudget* budget) {
  DIR* d = fdopendir(dirfd);
  if (d == nullptr) {
    close(dirfd);
    if (budget->problem.empty()) budget->problem = StrCat("cannot list a directory: ", std::strerror(errno));
    return;
  }
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (budget->entries_left == 0) {
      if (budget->problem.empty()) budget->problem = "more entries than the removal's cap";
      break;
    }
    --budget->entries_left;
    if (unlinkat(dirfd, name.c_str(), 0) == 0 || errno == ENOENT) continue;
    if (errno != EISDIR && errno != EPERM) {
      if (budget->problem.empty()) budget->problem = StrCat("cannot remove ", name, ": ", std::strerror(errno));
      continue;
    }
    // A directory (unlink says EISDIR on Linux): descend without following a link put in its place meanwhile.
    if (depth_left <= 0) {
      if (budget->problem.empty()) budget->problem = "directories nested deeper than the removal's cap";
      continue;
    }
    const int sub = openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0) {
      if (errno != ENOENT && budget->problem.empty())
        budget->problem = StrCat("cannot open ", name, ": ", std::strerror(errno));
      continue;
    }
    EmptyDirectoryAt(sub, depth_left - 1, budget);
    if (unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT && budget->problem.empty())
      budget->problem = StrCat("cannot remove directory ", name, ": ", std::strerror(errno));
  }
  closedir(d);  // closes dirfd
}

}  // namespace

absl::Status RemoveUntrustedTree(const std::string& path, size_t max_entries, int max_depth) {
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::OkStatus();
    if (errno == ENOTDIR || errno == ELOOP) {  // a file or a link where the directory was: remove the name only
      if (unlink(path.c_str()) == 0 || errno == ENOENT) return absl::OkStatus();
    }
    return absl::InternalError(StrCat("cannot remove ", path, ": ", std::strerror(errno)));
  }
  RemoveBudget budget{max_entries, ""};
  EmptyDirectoryAt(fd, max_depth, &budget);
  if (rmdir(path.c_str()) == 0 || errno == ENOENT) return absl::OkStatus();
  if (budget.problem.empty()) budget.problem = std::strerror(errno);
  return absl::ResourceExhaustedError(StrCat("left ", path, " in place: ", budget.problem));
}

}  // namespace tessera

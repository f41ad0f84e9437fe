// Reading whole files for the apps, with errors that name the file and what went wrong.
//
// Every read is capped: a path that names /dev/zero, a FIFO fed forever or a file grown by mistake ends in a
// clear error instead of bad_alloc. Callers that read small files of known shape pass a tighter cap.
#ifndef TESSERA_COMMON_FILES_H_
#define TESSERA_COMMON_FILES_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace tessera {

// The default cap: larger than any cluster, workload or trace file the project reads (a 5,000-node cluster
// file is about 2 MB).
inline constexpr size_t kMaxTextFileBytes = size_t{256} << 20;

// Reads a file, or standard input when `path` is "-". A file longer than `max_bytes` is an error
// (ResourceExhausted) that says so, without reading past the cap.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, size_t max_bytes = kMaxTextFileBytes);

// Writes `text` to `path` atomically: a temporary file of this write's own beside it (concurrent writers of one
// path never share it), then rename(2), so readers see the old content or the new, never a part. Not fsynced:
// the callers' files need not outlive a crash of the machine.
absl::Status WriteTextFileAtomically(const std::string& path, std::string_view text);

// Removes a directory that someone less trusted could write (a container's region directory), and what it
// holds, without ever following a symbolic link: every step is relative to a directory descriptor opened with
// O_NOFOLLOW, so an entry swapped for a link while the removal runs only removes the link. At most
// `max_entries` entries and `max_depth` levels are removed: the writer cannot make the caller spend unbounded
// time. Returns OK when the directory is gone (or was never there); otherwise what was left and why.
absl::Status RemoveUntrustedTree(const std::string& path, size_t max_entries = 10000, int max_depth = 8);

}  // namespace tessera

#endif  // TESSERA_COMMON_FILES_H_

// What the node agent learns from a container's shared region: a copy, read as untrusted data.
//
// The region file is writable by every process of its container, so to the agent (root) it is a report that a
// tenant may fill with anything, change while it is read, truncate, or replace with something that is not a
// file at all. The agent therefore never maps it, never takes a lock in it and never writes it: it opens the
// name without following links and without blocking, refuses anything but a regular file, copies a bounded
// prefix (the header and the GPU table, kRegionSnapshotBytes) into its own memory with pread(2), and checks
// every field it will use. What the copy says is what the tenant reports about itself: a lying tenant can only
// misreport its own container's use (docs/security.md, "The shared region").
//
//   tessera::hook::RegionSnapshot snap;
//   tessera::hook::Error error;
//   if (tessera::hook::ReadRegionSnapshot(path, &snap, &error) == tessera::hook::RegionRead::kRead) {
//     if (const tessera::hook::RegionDeviceReport* d = snap.Find("GPU-5d3c...")) use(d->used_bytes);
//   }
//
// API-neutral and libc-only like the rest of src/hook/common. Thread-safety: the functions are reentrant; a
// snapshot is a plain value.
#ifndef TESSERA_HOOK_COMMON_REGION_SNAPSHOT_H_
#define TESSERA_HOOK_COMMON_REGION_SNAPSHOT_H_

#include <cstddef>
#include <cstdint>

#include "hook/common/base.h"
#include "hook/common/limits.h"

namespace tessera::hook {

// The bytes a snapshot copies: the header and the GPU table (the process slots are the hooks' own business).
inline constexpr size_t kRegionSnapshotBytes = 16384;

// One GPU entry as the container's processes report it. The UUID has been checked (NUL-terminated, printable
// ASCII without blanks); the numbers are as the tenant wrote them, except that a utilization above the whole
// GPU reads as the whole GPU.
struct RegionDeviceReport {
  char uuid[kUuidSize] = {0};
  uint64_t limit_bytes = 0;  // the limit the container's processes applied (0: none)
  uint64_t used_bytes = 0;   // what they say they hold
  uint64_t peak_bytes = 0;
  uint64_t oom_count = 0;
  uint32_t own_util_ppm = 0;  // compute used over the last controller step, parts per million of the GPU
};

struct RegionSnapshot {
  int device_count = 0;
  RegionDeviceReport devices[kMaxDevices];
  // The entry for a GPU, or nullptr.
  const RegionDeviceReport* Find(const char* uuid) const;
};

// Checks and copies what `size` bytes (a region file's first bytes) say. False, with a message, when they are
// not a region of this layout (magic, version, sizes, offsets), or when the GPU table is malformed (a count
// above kMaxDevices, a UUID that is unterminated, unprintable or repeated). Reads nothing beyond `size`.
bool ParseRegionSnapshot(const void* bytes, size_t size, RegionSnapshot* out, Error* error);

enum class RegionRead {
  kRead,     // `out` holds what the region says
  kMissing,  // no file of that name (no process of the container has run yet)
  kRefused,  // something is there that is not a readable region of this layout: `error` says what
};

// Opens `path` (O_NOFOLLOW | O_NONBLOCK: a symbolic link, a FIFO or a file under a lease never make the caller
// wait), requires a regular file at least as large as the region (a shorter one would kill the container's own
// processes at their next access, and is reported so), copies its first kRegionSnapshotBytes and parses them.
RegionRead ReadRegionSnapshot(const char* path, RegionSnapshot* out, Error* error);

}  // namespace tessera::hook

#endif  // TESSERA_HOOK_COMMON_REGION_SNAPSHOT_H_

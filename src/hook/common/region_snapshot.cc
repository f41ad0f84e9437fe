#include "hook/common/region_snapshot.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>

#include "hook/common/region.h"

namespace tessera::hook {

namespace {

static_assert(kRegionSnapshotBytes == kRegionSlotsOffset, "a snapshot is the header and the GPU table");
static_assert(kRegionDevicesOffset + kMaxDevices * kRegionDeviceBytes <= kRegionSnapshotBytes);

// Fields are read with memcpy at their ABI offsets (region.h's static_asserts hold them there), never through
// the live structs: the bytes are a copy, and the atomics in RegionDevice are not for plain buffers.
template <typename T>
T At(const unsigned char* base, size_t offset) {
  T v;
  memcpy(&v, base + offset, sizeof(v));
  return v;
}

// A UUID as the hooks write it: "GPU-..." or "index-<i>", printable ASCII, no blanks (they would break the
// metrics' label syntax and the logs), NUL-terminated inside its 64 bytes.
bool ValidUuid(const char* u) {
  const void* nul = memchr(u, 0, kUuidSize);
  if (nul == nullptr || nul == u) return false;
  for (const char* p = u; p != nul; ++p) {
    if (*p <= ' ' || *p > '~' || *p == '"' || *p == '\\') return false;
  }
  return true;
}

}  // namespace

const RegionDeviceReport* RegionSnapshot::Find(const char* uuid) const {
  for (int i = 0; i < device_count; ++i) {
    if (strncmp(devices[i].uuid, uuid, kUuidSize) == 0) return &devices[i];
  }
  return nullptr;
}

bool ParseRegionSnapshot(const void* bytes, size_t size, RegionSnapshot* out, Error* error) {
  *out = RegionSnapshot{};
  if (size < kRegionSnapshotBytes) {
    error->Set("the region is %zu bytes, shorter than its header and GPU table (%zu)", size, kRegionSnapshotBytes);
    return false;
  }
  const auto* b = static_cast<const unsigned char*>(bytes);
  if (At<uint64_t>(b, offsetof(RegionHeader, magic)) != kRegionMagic) {
    error->Set("not a Tessera shared region (bad magic)");
    return false;
  }
  const uint32_t version = At<uint32_t>(b, offsetof(RegionHeader, version));
  if (version != kRegionVersion) {
    error->Set("region layout version %u; this agent reads version %u", version, kRegionVersion);
    return false;
  }
  // Every size and offset must be this layout's: a region that says otherwise is not read at all (its lengths
  // are never used to index anything).
  if (At<uint32_t>(b, offsetof(RegionHeader, header_bytes)) != kRegionHeaderBytes ||
      At<uint32_t>(b, offsetof(RegionHeader, device_bytes)) != kRegionDeviceBytes ||
      At<uint32_t>(b, offsetof(RegionHeader, device_count_max)) != static_cast<uint32_t>(kMaxDevices) ||
      At<uint32_t>(b, offsetof(RegionHeader, slot_bytes)) != kRegionSlotBytes ||
      At<uint32_t>(b, offsetof(RegionHeader, slot_count)) != kRegionSlots ||
      At<uint64_t>(b, offsetof(RegionHeader, devices_offset)) != kRegionDevicesOffset ||
      At<uint64_t>(b, offsetof(RegionHeader, slots_offset)) != kRegionSlotsOffset ||
      At<uint64_t>(b, offsetof(RegionHeader, region_bytes)) != kRegionBytes) {
    error->Set("the region's header gives sizes or offsets of another layout");
    return false;
  }
  const uint32_t count = At<uint32_t>(b, offsetof(RegionHeader, device_count));
  if (count > static_cast<uint32_t>(kMaxDevices)) {
    error->Set("the region claims %u GPU entries; at most %d exist", count, kMaxDevices);
    return false;
  }
  for (uint32_t i = 0; i < count; ++i) {
    const size_t at = kRegionDevicesOffset + i * kRegionDeviceBytes;
    RegionDeviceReport& d = out->devices[i];
    memcpy(d.uuid, b + at + offsetof(RegionDevice, uuid), kUuidSize);
    if (!ValidUuid(d.uuid)) {
      error->Set("GPU entry %u of the region has a malformed UUID", i);
      *out = RegionSnapshot{};
      return false;
    }
    for (uint32_t j = 0; j < i; ++j) {
      if (strncmp(out->devices[j].uuid, d.uuid, kUuidSize) == 0) {
        error->Set("GPU entries %u and %u of the region name the same GPU %s", j, i, d.uuid);
        *out = RegionSnapshot{};
        return false;
      }
    }
    d.limit_bytes = At<uint64_t>(b, at + offsetof(RegionDevice, limit_bytes));
    d.used_bytes = At<uint64_t>(b, at + offsetof(RegionDevice, used_bytes));
    d.peak_bytes = At<uint64_t>(b, at + offsetof(RegionDevice, peak_bytes));
    d.oom_count = At<uint64_t>(b, at + offsetof(RegionDevice, oom_count));
    const uint32_t util =
        At<uint32_t>(b, at + offsetof(RegionDevice, controller) + offsetof(ControllerState, own_util_ppm));
    d.own_util_ppm = util > kPpm ? kPpm : util;
  }
  out->device_count = static_cast<int>(count);
  return true;
}

RegionRead ReadRegionSnapshot(const char* path, RegionSnapshot* out, Error* error) {
  *out = RegionSnapshot{};
  const int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return RegionRead::kMissing;
    if (errno == ELOOP) {
      error->Set("%s is a symbolic link, not a region: not followed", path);
    } else if (errno == EWOULDBLOCK) {
      error->Set("%s is under a lease held by a process of the container: not waited for", path);
    } else {
      error->Set("cannot open %s: %s", path, strerror(errno));
    }
    return RegionRead::kRefused;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    error->Set("%s is not a regular file: not a region", path);
    close(fd);
    return RegionRead::kRefused;
  }
  if (static_cast<uint64_t>(st.st_size) < kRegionBytes) {
    error->Set("%s is %lld bytes, shorter than a region (%zu): it was truncated from inside the container", path,
               static_cast<long long>(st.st_size), kRegionBytes);
    close(fd);
    return RegionRead::kRefused;
  }
  static_assert(kRegionSnapshotBytes <= 65536, "the copy lives on the caller's stack");
  unsigned char copy[kRegionSnapshotBytes];
  size_t got = 0;
  while (got < sizeof(copy)) {
    const ssize_t n = pread(fd, copy + got, sizeof(copy) - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // shrunk meanwhile, or an I/O error: whatever was not read is not trusted
    got += static_cast<size_t>(n);
  }
  close(fd);
  return ParseRegionSnapshot(copy, got, out, error) ? RegionRead::kRead : RegionRead::kRefused;
}

}  // namespace tessera::hook

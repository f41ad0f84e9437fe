// A shared region whose header and GPU table a tenant has rewritten (the region file is writable from the
// container): opening it and reading it as the agent does (devices, limits, use) must not crash. The input
// overlays the first 16 KiB (header and device table) of a freshly made region.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "hook/common/region.h"

namespace {

std::string TempPath(const char* name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name + "." + std::to_string(getpid());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::vector<char>* fresh = [] {
    const std::string path = TempPath("tessera-fuzz-region-fresh");
    unlink(path.c_str());
    tessera::hook::SharedRegion r;
    tessera::hook::Error e;
    if (!r.Open(path.c_str(), &e)) abort();
    r.Close();
    auto* image = new std::vector<char>(tessera::hook::kRegionBytes);
    const int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0 || pread(fd, image->data(), image->size(), 0) != static_cast<ssize_t>(image->size())) abort();
    close(fd);
    unlink(path.c_str());
    return image;
  }();
  static const std::string path = TempPath("tessera-fuzz-region");
  std::vector<char> image = *fresh;
  std::memcpy(image.data(), data, std::min(size, tessera::hook::kRegionSlotsOffset));
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || write(fd, image.data(), image.size()) != static_cast<ssize_t>(image.size())) abort();
  close(fd);
  tessera::hook::SharedRegion region;
  tessera::hook::Error error;
  if (region.Open(path.c_str(), &error)) {
    const int n = region.device_count();
    for (int i = 0; i < n; ++i) {
      (void)region.Used(i);
      (void)region.Limit(i);
    }
    (void)region.FindDevice("GPU-0");
    region.Close();
  }
  return 0;
}

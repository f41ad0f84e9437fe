#include "hook/cuda/visible_devices.h"

#include <string.h>

#include "hook/common/base.h"

namespace tessera::cuda_hook {

int CudaOrdinalForGpu(const char* visible, unsigned nvml_index, const char* uuid) {
  if (visible == nullptr) return static_cast<int>(nvml_index);
  int ordinal = 0;
  const char* p = visible;
  while (*p != 0) {
    const char* comma = strchr(p, ',');
    size_t len = comma != nullptr ? static_cast<size_t>(comma - p) : strlen(p);
    const char* entry = p;
    while (len > 0 && *entry == ' ') {
      ++entry;
      --len;
    }
    while (len > 0 && entry[len - 1] == ' ') --len;
    uint64_t index = 0;
    if (len == 0) return -1;
    if (hook::ParseU64(entry, len, &index)) {
      if (index == nvml_index) return ordinal;
    } else if (len >= 4 && strncmp(entry, "GPU-", 4) == 0) {
      if (uuid != nullptr && strncmp(uuid, entry, len) == 0) return ordinal;
    } else {
      return -1;  // MIG-... or junk: the driver stops here
    }
    ++ordinal;
    if (comma == nullptr) break;
    p = comma + 1;
  }
  return -1;
}

}  // namespace tessera::cuda_hook

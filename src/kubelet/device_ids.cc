#include "kubelet/device_ids.h"

#include "absl/status/status.h"
#include "core/strings.h"

namespace tessera::kubelet {

std::string SlotDeviceId(const core::GpuUuid& gpu, int slot) {
  return StrCat(gpu.value(), "::", slot);
}

absl::StatusOr<SlotId> ParseSlotDeviceId(std::string_view id) {
  const size_t sep = id.rfind("::");
  int slot = -1;
  if (sep == std::string_view::npos || sep == 0 || !ParseInt(id.substr(sep + 2), &slot) || slot < 0) {
    return absl::InvalidArgumentError(
        StrCat("device ID \"", id, "\" is not a tessera-node slot (expected <GPU UUID>::<slot>)"));
  }
  return SlotId{core::GpuUuid(id.substr(0, sep)), slot};
}

}  // namespace tessera::kubelet

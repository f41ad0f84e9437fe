// The device IDs tessera-node advertises to the kubelet: each physical GPU is split into a configurable number
// of slots, and each slot is one device "<GPU UUID>::<slot>" (e.g. "GPU-fef8089b-4820-abfc-e83e-94318197576e::3",
// the convention of NVIDIA's device plugin for shared GPUs). The kubelet limits IDs to 63 characters.
//
//   std::string id = SlotDeviceId(core::GpuUuid("GPU-a"), 3);     // "GPU-a::3"
//   absl::StatusOr<SlotId> s = ParseSlotDeviceId(id);              // {GPU-a, 3}
//
// Thread-safety: pure functions.
#ifndef TESSERA_KUBELET_DEVICE_IDS_H_
#define TESSERA_KUBELET_DEVICE_IDS_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/ids.h"

namespace tessera::kubelet {

inline constexpr size_t kMaxDeviceIdLength = 63;

struct SlotId {
  core::GpuUuid gpu;
  int slot = 0;

  bool operator==(const SlotId&) const = default;
};

std::string SlotDeviceId(const core::GpuUuid& gpu, int slot);
absl::StatusOr<SlotId> ParseSlotDeviceId(std::string_view id);

}  // namespace tessera::kubelet

#endif  // TESSERA_KUBELET_DEVICE_IDS_H_

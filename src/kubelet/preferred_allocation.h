// The device plugin's answer to GetPreferredAllocation: which of the available slots a container should get.
//
// Each vGPU of a container is a share of a distinct physical GPU (docs/requests.md), so the preference
// spreads a request's slots across distinct GPUs. Greedily, after the slots the kubelet says must be included,
// each next slot is the best by, in order:
//   1. a GPU the request does not hold yet;
//   2. healthy;
//   3. on the NUMA node of the request's first GPU (when known);
//   4. nearest (lowest Gaia access cost, core/topology.h) to the GPUs already chosen, when links are known;
//   5. on the GPU with the most available slots (the least loaded);
//   6. lowest GPU index, then lowest slot (deterministic).
// The real GPUs come from the pod's assignment anyway; this only makes the kubelet's own choice sensible.
//
//   std::vector<std::string> ids = PreferredSlots(available, must_include, 2, &links);
//
// Thread-safety: a pure function.
#ifndef TESSERA_KUBELET_PREFERRED_ALLOCATION_H_
#define TESSERA_KUBELET_PREFERRED_ALLOCATION_H_

#include <string>
#include <vector>

#include "core/topology.h"
#include "kubelet/allocation_backend.h"

namespace tessera::kubelet {

// `available` are the slots the kubelet offers (each slot once); `must_include` are IDs that come first
// whatever they are; `links` (may be null or empty) is indexed by DeviceSlot::gpu_index. Returns `size` IDs
// (fewer when not enough are available; all of must_include even when it alone is larger).
std::vector<std::string> PreferredSlots(const std::vector<DeviceSlot>& available,
                                        const std::vector<std::string>& must_include, int size,
                                        const core::LinkMatrix* links);

}  // namespace tessera::kubelet

#endif  // TESSERA_KUBELET_PREFERRED_ALLOCATION_H_

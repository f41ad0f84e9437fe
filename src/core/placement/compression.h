// Compression of low-priority tenants for a high-priority pod: the SharedGPU seed's equations (1) and (2)
// (Wang et al., "Kubernetes 平台下国产 GPU 的并发容器共享", section 2.3).
//
// When a high-priority pod asking P fits on no GPU, the GPU with the most free share G_A is chosen and its N
// low-priority tenants give up the difference:
//   Q = (P - G_A) % N      (1)   the part that does not divide evenly
//   R = (P - G_A) / N      (2)   what each tenant gives up
// Tenants sorted by their share, largest first: the first Q give up R + 1, the others R.
//
// Tessera adds one rule the paper leaves open: no tenant drops below a minimum share. A tenant that would is
// cut to the minimum, and what it could not give is shared among the others by the same equations.
//
//   std::optional<std::vector<MilliGpu>> cuts = CompressionCuts({MilliGpu(400)}, MilliGpu(100),
//   MilliGpu(10));
//   // the paper's example: a 40% tenant, 60% free, a high-priority pod asks 70%: cuts == {100} (40% -> 30%)
//
// Thread-safety: pure function.
#ifndef TESSERA_CORE_PLACEMENT_COMPRESSION_H_
#define TESSERA_CORE_PLACEMENT_COMPRESSION_H_

#include <optional>
#include <span>
#include <vector>

#include "core/units.h"

namespace tessera::core {

// The cut of each tenant (in the order given) so that together they free `deficit`, none going below
// `min_share`. Works in whole percent when every number is a whole percent (as requests are), else in
// thousandths. nullopt when the tenants cannot free that much.
std::optional<std::vector<MilliGpu>> CompressionCuts(std::span<const MilliGpu> shares, MilliGpu deficit,
                                                     MilliGpu min_share);

}  // namespace tessera::core

#endif  // TESSERA_CORE_PLACEMENT_COMPRESSION_H_

// One vGPU's share (core::VGpuAssignment, the one representation in code) in the two documented JSON formats
// that carry it, written side by side so that they cannot drift apart: the assignment annotation
// (docs/protocols.md: the scheduler to the node agent) and the node agent's container record
// (docs/node-agent.md, "Records"). The field names are here once; the readers (formats/assignment.cc,
// node/record.cc) read them by these names.
//
//   json v = VGpuJson(vgpu, VGpuFormat::kAssignment);
//   // {"uuid":"GPU-0a..","index":0,"cores":30,"milliCores":300,"memoryMiB":4096}
//
// Thread-safety: pure functions.
#ifndef TESSERA_FORMATS_VGPU_JSON_H_
#define TESSERA_FORMATS_VGPU_JSON_H_

#include "core/request.h"
#include "nlohmann/json.hpp"

namespace tessera::formats {

inline constexpr char kVGpuUuid[] = "uuid";
inline constexpr char kVGpuIndex[] = "index";
inline constexpr char kVGpuCores[] = "cores";            // percent, up to one decimal (annotation only)
inline constexpr char kVGpuMilliCores[] = "milliCores";  // thousandths of one GPU: what counts
inline constexpr char kVGpuMemoryMiB[] = "memoryMiB";
inline constexpr char kVGpuRequestedCores[] = "requestedCores";  // percent (annotation only)
inline constexpr char kVGpuRequestedMilliCores[] = "requestedMilliCores";

enum class VGpuFormat {
  // The annotation: the share in thousandths and, for readers that predate them, in percent; the index when
  // known (a hint); the requested share only when a high-priority pod compressed this one.
  kAssignment,
  // The record: the share in thousandths, the index, and the requested share (0 when not compressed), always.
  kRecord,
};

nlohmann::json VGpuJson(const core::VGpuAssignment& v, VGpuFormat format);

// Thousandths of a GPU as percent with one decimal: 300 -> 30, 333 -> 33.3.
nlohmann::json PercentOf(core::MilliGpu cores);

}  // namespace tessera::formats

#endif  // TESSERA_FORMATS_VGPU_JSON_H_

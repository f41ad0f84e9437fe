#include "formats/vgpu_json.h"

namespace tessera::formats {

using nlohmann::json;

json PercentOf(core::MilliGpu cores) {
  if (cores.value() % 10 == 0) return cores.value() / 10;
  return static_cast<double>(cores.value()) / 10.0;
}

json VGpuJson(const core::VGpuAssignment& v, VGpuFormat format) {
  json out = {
      {kVGpuUuid, v.uuid.value()}, {kVGpuMilliCores, v.cores.value()}, {kVGpuMemoryMiB, v.memory.value()}};
  switch (format) {
    case VGpuFormat::kAssignment:
      // milliCores is the share (the ledger's unit); cores, the same in percent, is for readers of version 1
      // that predate it.
      out[kVGpuCores] = PercentOf(v.cores);
      if (v.gpu_index >= 0) out[kVGpuIndex] = v.gpu_index;  // the UUID is what counts; the index is a hint
      if (v.requested > v.cores) {
        out[kVGpuRequestedCores] = PercentOf(v.requested);
        out[kVGpuRequestedMilliCores] = v.requested.value();
      }
      break;
    case VGpuFormat::kRecord:
      out[kVGpuIndex] = v.gpu_index;
      out[kVGpuRequestedMilliCores] = v.requested.value();
      break;
  }
  return out;
}

}  // namespace tessera::formats

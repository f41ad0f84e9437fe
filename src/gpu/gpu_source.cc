#include "gpu/gpu_source.h"

#include "core/strings.h"
#include "gpu/fake_gpu_file.h"
#include "gpu/nvml_source.h"

namespace tessera::gpu {

const std::set<unsigned long long>& DefaultIgnoredXids() {
  static const std::set<unsigned long long> kIgnored = {13, 31, 43, 45, 68, 109};
  return kIgnored;
}

absl::StatusOr<std::unique_ptr<GpuSource>> OpenGpuSource(const GpuSourceOptions& options) {
  if (!options.fake_gpus_file.empty()) {
    absl::StatusOr<std::unique_ptr<FakeGpuSource>> fake =
        FakeGpuSource::Open(options.fake_gpus_file, options.node_name);
    if (!fake.ok()) return fake.status();
    return std::unique_ptr<GpuSource>(*std::move(fake));
  }
  absl::StatusOr<std::unique_ptr<NvmlGpuSource>> nvml = NvmlGpuSource::Open(options);
  if (!nvml.ok()) return nvml.status();
  return std::unique_ptr<GpuSource>(*std::move(nvml));
}

std::string NormalizeModelName(std::string_view nvml_name) {
  std::string_view name = StripWhitespace(nvml_name);
  for (std::string_view prefix : {"NVIDIA ", "Tesla "}) {
    if (name.starts_with(prefix)) name.remove_prefix(prefix.size());
  }
  std::string out;
  for (char c : StripWhitespace(name)) {
    if (c == ' ') {
      if (!out.empty() && out.back() != '-') out += '-';
    } else {
      out += c;
    }
  }
  return out.empty() ? std::string(StripWhitespace(nvml_name)) : out;
}

std::string NormalizePciBusId(std::string_view bus_id) {
  std::string id = AsciiLower(StripWhitespace(bus_id));
  const size_t colon = id.find(':');
  // "00000000:3b:00.0": an 8-digit domain that fits in 4 digits loses its leading zeros, as sysfs writes it.
  if (colon == 8 && id.compare(0, 4, "0000") == 0) id.erase(0, 4);
  return id;
}

}  // namespace tessera::gpu

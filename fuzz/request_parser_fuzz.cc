// Pod requests from resources and annotations in every system's names (Tessera, HAMi, gpu-manager, gpushare,
// Volcano). Input lines: "C name" starts a container, "L res=qty" a limit, "R res=qty" a request,
// "I name" an init container, "A key=value" a pod annotation.
#include "core/request_parser.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tessera::core::ContainerSpec;
  tessera::core::PodSpec pod;
  pod.name = "p";
  pod.uid = "u";
  ContainerSpec* current = nullptr;
  for (std::string_view line : tessera::fuzz::Lines(tessera::fuzz::Text(data, size))) {
    if (line.size() < 2) continue;
    const char kind = line[0];
    const std::string_view rest = line.substr(2);
    if (kind == 'C' || kind == 'I') {
      auto& list = kind == 'C' ? pod.containers : pod.init_containers;
      if (list.size() >= 16) continue;
      list.push_back(ContainerSpec{std::string(rest), {}, {}, false});
      current = &list.back();
      continue;
    }
    auto [key, value] = tessera::fuzz::KeyValue(rest);
    if (kind == 'A') {
      pod.annotations[key] = value;
    } else if ((kind == 'L' || kind == 'R') && current != nullptr) {
      (kind == 'L' ? current->limits : current->requests)[key] = value;
    }
  }
  (void)tessera::core::ParsePodRequest(pod);
  for (const ContainerSpec& c : pod.containers) {
    (void)tessera::core::TranslateToTessera(c.limits);
    (void)tessera::core::TranslateToTessera(c.requests);
  }
  return 0;
}

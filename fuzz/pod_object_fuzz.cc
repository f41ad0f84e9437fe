// Pod objects (the extender's Pod field, the webhook's object, the API's pods) into the pod spec placement
// reads, and on into a request.
#include "core/request_parser.h"
#include "formats/bounded_json.h"
#include "formats/pod_object.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<nlohmann::json> doc =
      tessera::formats::ParseBoundedJson(tessera::fuzz::Text(data, size), "pod");
  if (!doc.ok()) return 0;
  absl::StatusOr<tessera::formats::PodObject> pod = tessera::formats::ParsePodObject(*doc);
  if (!pod.ok()) return 0;
  (void)tessera::core::ParsePodRequest(pod->spec);
  return 0;
}

// A DRA device selector (CEL) as tessera-scheduler evaluates it (scheduler/dra_selector.h). Selectors are written by
// whoever may create ResourceClaims or DeviceClasses, and read by the scheduler's leader: whatever the text, a
// refusal or a verdict, never a crash and never a deep recursion. The rest of the input, when it is JSON, is read
// as a ResourceSlice and a claim as the allocator reads them, and one claim is placed on that slice.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "scheduler/dra_allocator.h"
#include "scheduler/dra_selector.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::scheduler::dra;
  const std::string_view text = tessera::fuzz::Text(data, size);
  static const std::map<std::string, AttributeValue> attributes = {
      {"gpu.tessera.dev/model", AttributeValue::String("V100")},
      {"gpu.tessera.dev/index", AttributeValue::Int(3)},
      {"gpu.tessera.dev/healthy", AttributeValue::Bool(true)},
      {"gpu.tessera.dev/driverVersion", AttributeValue::String("1.2.3", AttributeValue::Kind::kVersion)}};
  absl::StatusOr<Selector> selector = Selector::Compile(text);
  if (selector.ok()) (void)selector->Evaluate({"gpu.tessera.dev", &attributes});
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return 0;
  absl::StatusOr<Pool> pool = ParseSlice(doc.value("slice", nlohmann::json()));
  DraAllocator allocator(AllocatorOptions{.policy = "binpack", .seed = 1});
  if (pool.ok()) allocator.SetPools({*pool});
  allocator.SetNodes({ParseNode(doc.value("node", nlohmann::json()))});
  allocator.SetClasses({{"gpu.tessera.dev", ParseDeviceClass(doc.value("class", nlohmann::json()))}});
  std::vector<nlohmann::json> allocated;
  if (doc.contains("allocated") && doc["allocated"].is_array()) {
    for (const nlohmann::json& c : doc["allocated"]) allocated.push_back(c);
  }
  allocator.SetAllocatedClaims(allocated);
  (void)allocator.Place({{doc.value("pod", nlohmann::json()), {doc.value("claim", nlohmann::json())}}});
  return 0;
}

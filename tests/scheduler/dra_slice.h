// A ResourceSlice as tessera-node publishes it for one node (node/dra_driver's ResourceSliceFor), for the DRA
// placement's tests: devices gpu-<index> with model, uuid, index, nvlinkDomain and pcieSwitch attributes,
// capacity cores 100 (default 100, range 1..100 step 1) and memory 32Gi (default all, range 1Mi.. step 1Mi),
// allowMultipleAllocations.
#ifndef TESSERA_TESTS_SCHEDULER_DRA_SLICE_H_
#define TESSERA_TESTS_SCHEDULER_DRA_SLICE_H_

#include <string>

#include "nlohmann/json.hpp"

namespace tessera::testing {

inline nlohmann::json TesseraSlice(const std::string& node, int gpus,
                                   const std::string& model = "Tesla V100-SXM2-32GB") {
  nlohmann::json devices = nlohmann::json::array();
  for (int i = 0; i < gpus; ++i) {
    devices.push_back(
        {{"name", "gpu-" + std::to_string(i)},
         {"allowMultipleAllocations", true},
         {"attributes",
          {{"model", {{"string", model}}},
           {"uuid", {{"string", node + "-GPU-" + std::to_string(i)}}},
           {"index", {{"int", i}}},
           {"nvlinkDomain", {{"int", i < 4 ? 0 : 4}}},
           {"pcieSwitch", {{"int", i / 2 * 2}}}}},
         {"capacity",
          {{"cores",
            {{"value", "100"},
             {"requestPolicy",
              {{"default", "100"}, {"validRange", {{"min", "1"}, {"max", "100"}, {"step", "1"}}}}}}},
           {"memory",
            {{"value", "32Gi"},
             {"requestPolicy",
              {{"default", "32Gi"},
               {"validRange", {{"min", "1Mi"}, {"max", "32Gi"}, {"step", "1Mi"}}}}}}}}}});
  }
  return {{"apiVersion", "resource.k8s.io/v1"},
          {"kind", "ResourceSlice"},
          {"metadata", {{"name", node + "-gpu.tessera.dev"}}},
          {"spec",
           {{"driver", "gpu.tessera.dev"},
            {"nodeName", node},
            {"pool", {{"name", node}, {"generation", 1}, {"resourceSliceCount", 1}}},
            {"devices", devices}}}};
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_SCHEDULER_DRA_SLICE_H_

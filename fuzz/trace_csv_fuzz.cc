// The simulator's trace CSVs (nodes and pods), and what the replay makes of their rows.
#include "fuzz_util.h"
#include "sim/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = tessera::fuzz::Text(data, size);
  absl::StatusOr<std::vector<tessera::sim::TraceNode>> nodes = tessera::sim::ParseNodeCsv(text, "nodes.csv");
  if (nodes.ok()) {
    for (const tessera::sim::TraceNode& n : *nodes) (void)tessera::sim::ToNodeInfo(n);
  }
  absl::StatusOr<std::vector<tessera::sim::TracePod>> pods = tessera::sim::ParsePodCsv(text, "pods.csv");
  if (pods.ok()) {
    for (const tessera::sim::TracePod& p : *pods) (void)tessera::sim::ToPodRequest(p, "u");
  }
  return 0;
}

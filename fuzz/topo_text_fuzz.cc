// `nvidia-smi topo -m` output (tessera topo, the agent's topology) and CPU lists, into the cost tree.
#include "core/cost_tree.h"
#include "core/topology.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = tessera::fuzz::Text(data, size);
  (void)tessera::core::ParseCpuList(text);
  absl::StatusOr<tessera::core::TopoReport> report = tessera::core::ParseNvidiaSmiTopo(text);
  if (report.ok()) (void)tessera::core::AccessCostTree::Build(report->links);
  return 0;
}

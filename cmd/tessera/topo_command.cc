#include <iostream>

#include "commands.h"
#include "common/files.h"
#include "core/cost_tree.h"
#include "core/topology.h"

namespace tessera::cli {

int RunTopo(const TopoOptions& options) {
  // `nvidia-smi topo -m` prints a few KiB; a file far larger (or /dev/zero) is not one.
  absl::StatusOr<std::string> text = ReadTextFile(options.file, size_t{16} << 20);
  if (!text.ok()) {
    std::cerr << "tessera topo: " << text.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<core::TopoReport> report = core::ParseNvidiaSmiTopo(*text);
  if (!report.ok()) {
    std::cerr << "tessera topo: " << options.file << ": " << report.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<core::AccessCostTree> tree = core::AccessCostTree::Build(report->links);
  if (!tree.ok()) {
    std::cerr << "tessera topo: " << tree.status().message() << "\n";
    return 2;
  }
  std::cout << report->links.size() << " GPUs. Access-cost tree (link level, cost; lower is nearer):\n"
            << tree->ToString();
  for (int g = 0; g < report->links.size(); ++g) {
    const std::string& cpus = report->cpu_affinity[static_cast<size_t>(g)];
    const int numa = report->numa_node[static_cast<size_t>(g)];
    if (cpus.empty() && numa < 0) continue;
    std::cout << "GPU" << g << ": NUMA " << (numa < 0 ? std::string("?") : std::to_string(numa)) << ", CPUs "
              << (cpus.empty() ? "?" : cpus) << "\n";
  }
  return 0;
}

}  // namespace tessera::cli

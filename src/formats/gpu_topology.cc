#include "formats/gpu_topology.h"

#include "absl/status/statusor.h"
#include "core/strings.h"
#include "formats/yaml_fields.h"

namespace tessera::formats {

std::optional<GpuTopology> ReadGpuTopology(const YAML::Node& map, int gpu_count, std::string_view gpus_are) {
  if (map["topology"] && map["links"])
    Fail(map, "give either topology (nvidia-smi topo -m text) or links, not both");
  GpuTopology out;
  if (map["topology"]) {
    absl::StatusOr<core::TopoReport> topo = core::ParseNvidiaSmiTopo(Str(map["topology"], "topology"));
    if (!topo.ok()) Fail(map["topology"], StrCat("topology: ", topo.status().message()));
    if (topo->links.size() != gpu_count) {
      Fail(map["topology"],
           StrCat("topology describes ", topo->links.size(), " GPUs but ", gpus_are, " ", gpu_count));
    }
    out.links = std::move(topo->links);
    out.numa_node = std::move(topo->numa_node);
    out.cpu_affinity = std::move(topo->cpu_affinity);
    return out;
  }
  if (!map["links"]) return std::nullopt;
  const YAML::Node& links = map["links"];
  if (!links.IsSequence()) Fail(links, "links must be a list of rows, e.g. [[X, PIX], [PIX, X]]");
  std::vector<std::vector<std::string>> rows;
  for (const YAML::Node& row : links) {
    if (!row.IsSequence()) Fail(row, "each row of links must be a list of link levels, e.g. [X, PIX]");
    std::vector<std::string> cells;
    for (const YAML::Node& cell : row) {
      absl::StatusOr<core::Link> link = core::Link::Parse(Str(cell, "a link level"));
      if (!link.ok()) Fail(cell, std::string(link.status().message()));  // at the cell's own line
      cells.push_back(link->ToString());
    }
    rows.push_back(std::move(cells));
  }
  absl::StatusOr<core::LinkMatrix> m = core::LinkMatrix::FromRows(rows);
  if (!m.ok()) Fail(links, std::string(m.status().message()));
  if (m->size() != gpu_count) {
    Fail(links, StrCat("links is ", m->size(), "x", m->size(), " but ", gpus_are, " ", gpu_count, " GPUs"));
  }
  out.links = *std::move(m);
  return out;
}

}  // namespace tessera::formats

// The topology block of a node's GPUs as the project's YAML files give it (a cluster file's nodes, a fake-GPU
// file; docs/file-formats.md): `topology`, the text `nvidia-smi topo -m` prints, or `links`, the matrix of
// link levels, not both. One reader for both files, so that they cannot come to read it differently.
//
//   std::optional<GpuTopology> t = ReadGpuTopology(node, 8, "the node has");   // throws FileError
//   if (t) links = t->links;
//
// Thread-safety: pure functions.
#ifndef TESSERA_FORMATS_GPU_TOPOLOGY_H_
#define TESSERA_FORMATS_GPU_TOPOLOGY_H_

#include <yaml-cpp/yaml.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/topology.h"

namespace tessera::formats {

struct GpuTopology {
  core::LinkMatrix links;
  // Per GPU, from `topology` only (empty with `links`): its NUMA node (-1 when not said) and the CPUs of that
  // NUMA node (empty when not said).
  std::vector<int> numa_node;
  std::vector<std::string> cpu_affinity;
};

// Reads `topology` or `links` of `map` for `gpu_count` GPUs; nullopt when it has neither. Throws FileError
// (yaml_fields.h) for both at once, unreadable text, a link level that is none, or a matrix of another size;
// `gpus_are` says where the count comes from in that message ("the node has", "the file lists").
std::optional<GpuTopology> ReadGpuTopology(const YAML::Node& map, int gpu_count, std::string_view gpus_are);

}  // namespace tessera::formats

#endif  // TESSERA_FORMATS_GPU_TOPOLOGY_H_

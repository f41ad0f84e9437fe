// Cluster and workload files (YAML or JSON): the CLI's and the standalone scheduler's input.
#include "formats/cluster_file.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = tessera::fuzz::Text(data, size);
  absl::StatusOr<tessera::formats::ClusterFile> file = tessera::formats::ParseClusterFile(text);
  if (file.ok()) (void)tessera::formats::BuildCluster(*file);
  (void)tessera::formats::ParseWorkloadFile(text);
  return 0;
}

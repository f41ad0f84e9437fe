// Helpers shared by the tests: building clusters and requests in a line, reading test data.
#ifndef TESSERA_TESTS_TEST_UTIL_H_
#define TESSERA_TESTS_TEST_UTIL_H_

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/request.h"
#include "core/request_parser.h"
#include "core/strings.h"

namespace tessera::testing {

inline std::string ReadTestData(const std::string& relative) {
  std::ifstream in(std::string(TESSERA_SOURCE_DIR) + "/tests/testdata/" + relative);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// A node of `n` GPUs of one model, every pair joined at `link` (SYS by default).
inline core::NodeInfo MakeNode(const std::string& name, int n, core::MiB memory = core::MiB(16384),
                               const std::string& model = "T4",
                               core::Link link = core::Link::Of(core::LinkKind::kSys)) {
  core::NodeInfo info;
  info.name = core::NodeName(name);
  for (int g = 0; g < n; ++g) {
    info.gpus.push_back({core::GpuUuid(StrCat("GPU-", name, "-", g)), g, model, memory, -1});
  }
  info.links = core::LinkMatrix(n, link);
  return info;
}

// A pod whose only container asks for `vgpus`.
inline core::PodRequest MakePod(const std::string& uid, std::vector<core::VGpuDemand> vgpus,
                                const std::string& ns = "default") {
  core::PodRequest r;
  r.ns = core::Namespace(ns);
  r.name = uid;
  r.uid = core::PodUid(uid);
  r.containers.push_back({"main", std::move(vgpus)});
  return r;
}

// One share of `percent` with memory in MiB (0: proportional).
inline core::VGpuDemand Share(int percent, int64_t memory_mib = 0) {
  core::VGpuDemand d;
  d.cores = core::ToMilliGpu(core::Percent(percent));
  if (memory_mib > 0) d.memory = {core::MemorySpec::Kind::kMiB, memory_mib};
  return d;
}

// A placement of one container's vGPUs on a node.
inline core::Placement PlacementOn(const std::string& node, std::vector<core::VGpuAssignment> vgpus,
                                   const std::string& container = "main") {
  core::Placement p;
  p.node = core::NodeName(node);
  core::ContainerAssignment ca;
  ca.name = container;
  ca.vgpus = std::move(vgpus);
  p.containers.push_back(std::move(ca));
  return p;
}

inline core::VGpuDemand Whole() {
  return {core::kWholeGpu, {}};
}

// A demand in thousandths of a GPU (the trace's unit).
inline core::VGpuDemand Milli(int milli) {
  return {core::MilliGpu(milli), {}};
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TEST_UTIL_H_

// The `tessera` CLI's subcommands. Each returns the process exit status: 0 success, 1 the work failed
// (a placement refused is not a failure), 2 bad input.
#ifndef TESSERA_CMD_TESSERA_COMMANDS_H_
#define TESSERA_CMD_TESSERA_COMMANDS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::cli {

struct PlaceOptions {
  std::string cluster_file;  // empty: the bundled example cluster
  std::string pods_file;     // empty: the bundled example pods
  std::string policy = "tessera";  // the scheduler's default too
  uint64_t seed = 42;
};
int RunPlace(const PlaceOptions& options);

struct SimulateOptions {
  std::string nodes_file;  // both empty: the bundled example
  std::string pods_file;
  std::string policies;  // empty: "tessera" (files) or a few side by side (bundled example)
  std::string seeds;     // empty: "42" (files) or "42-46" (bundled example)
  double inflate = 1.3;
  bool json = false;
  std::string plot_file;
  int threads = 0;     // 0: one per core
  bool bound = false;  // also the LP bound and the online floor (sim/bound.h)
  std::string high_priority_qos;  // trace QoS classes placed as high priority ("LS,Guaranteed"); empty: none
  bool no_compression = false;    // SharedGPU's compression off
  std::string share_memory = "proportional";  // or "none": shares account compute only
};
int RunSimulate(const SimulateOptions& options);

struct TopoOptions {
  std::string file = "-";  // `nvidia-smi topo -m` output; "-" reads standard input
};
int RunTopo(const TopoOptions& options);

struct InspectOptions {
  std::string kubeconfig;  // empty: in a pod its service account, else $KUBECONFIG or ~/.kube/config
  std::string context;
  std::string ns;         // pods of this namespace only; empty: all
  std::string scheduler;  // ask a running tessera-scheduler (http://HOST:PORT) instead of the API server
  std::string file;       // or read a saved /inspect JSON
  std::string node;       // one node only
  bool json = false;
  bool summary_only = false;
  bool wide = false;  // full GPU UUIDs
};
int RunInspect(const InspectOptions& options);
struct RunOptions {
  std::string gpu_memory;  // empty: no memory limit
  int gpu_cores = 100;     // percent of one GPU
  std::string policy = "hard";
  int ceiling = 0;  // elastic: the most it may use when the GPU is idle (0: the default, 90)
  std::string priority = "low";
  std::string region;        // empty: a private region in the temporary directory
  std::string hook_library;  // empty: the libraries `api` names, from ../lib next to the binary
  std::string api = "auto";  // auto (every hook library built), cuda or opencl
  std::vector<std::string> command;
};
int RunRun(const RunOptions& options);

}  // namespace tessera::cli

#endif  // TESSERA_CMD_TESSERA_COMMANDS_H_

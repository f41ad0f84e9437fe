// The `tessera` CLI's subcommands. Each returns the process exit status: 0 success, 1 the work failed
// (a placement refused is not a failure), 2 bad input.
#ifndef TESSERA_CMD_TESSERA_COMMANDS_H_
#define TESSERA_CMD_TESSERA_COMMANDS_H_

#include <cstdint>
#include <string>

namespace tessera::cli {

struct PlaceOptions {
  std::string cluster_file;  // empty: the bundled example cluster
  std::string pods_file;     // empty: the bundled example pods
  std::string policy = "gaia";
  uint64_t seed = 42;
};
int RunPlace(const PlaceOptions& options);

struct TopoOptions {
  std::string file = "-";  // `nvidia-smi topo -m` output; "-" reads standard input
};
int RunTopo(const TopoOptions& options);

}  // namespace tessera::cli

#endif  // TESSERA_CMD_TESSERA_COMMANDS_H_

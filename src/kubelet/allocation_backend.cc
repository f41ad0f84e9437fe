#include "kubelet/allocation_backend.h"

#include <unistd.h>

#include "core/strings.h"

namespace tessera::kubelet {

std::vector<DeviceNode> NvidiaDeviceNodes(const std::vector<int>& gpu_indices, std::string_view dev_root) {
  std::vector<DeviceNode> out;
  for (int i : gpu_indices) {
    out.push_back({StrCat("/dev/nvidia", i), StrCat(dev_root, "/nvidia", i), "rw"});
  }
  for (const char* name : {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"}) {
    const std::string host = StrCat(dev_root, "/", name);
    if (access(host.c_str(), F_OK) == 0) out.push_back({StrCat("/dev/", name), host, "rw"});
  }
  return out;
}

}  // namespace tessera::kubelet

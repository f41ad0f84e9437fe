// What the device plugin asks the node agent when the kubelet starts a container: the AllocationBackend
// interface and its plain request/response types (no protobuf in sight).
//
// The kubelet's Allocate carries only device IDs: slots ("<GPU UUID>::<slot>", device_ids.h) that count vGPUs
// towards `tessera.dev/gpu`. Which GPUs a container really gets is decided by the extender and written on the
// pod (tessera.dev/assignment); the backend finds the pod (docs/node-agent.md) and answers with what the
// container needs: environment, mounts, device nodes, annotations.
//
//   class Agent : public kubelet::AllocationBackend {
//     absl::StatusOr<std::vector<ContainerAllocation>> Allocate(const AllocateRequestView& r) override {
//       std::vector<ContainerAllocation> out;
//       for (const AllocateContainerRequest& c : r.containers) {
//         ContainerAllocation a;
//         a.envs["NVIDIA_VISIBLE_DEVICES"] = "GPU-...";
//         a.mounts.push_back({"/etc/tessera", "/var/lib/tessera/containers/<pod>/<ctr>", /*read_only=*/true});
//         out.push_back(std::move(a));
//       }
//       return out;
//     }
//     absl::Status PreStartContainer(const PreStartRequestView&) override { return absl::OkStatus(); }
//   };
//
// Errors: return an absl::Status whose message says what is wrong and what to do; the plugin sends it to the
// kubelet as the gRPC status of the same code (the kubelet shows it in the pod's events).
//
// Thread-safety: the plugin calls the backend from many gRPC threads at once (it holds no lock around the
// call); implementations must be thread-safe.
#ifndef TESSERA_KUBELET_ALLOCATION_BACKEND_H_
#define TESSERA_KUBELET_ALLOCATION_BACKEND_H_

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/ids.h"

namespace tessera::kubelet {

// One device the plugin advertises: a slot of a physical GPU.
struct DeviceSlot {
  std::string id;     // the kubelet's device ID, "<GPU UUID>::<slot>"
  core::GpuUuid gpu;  // the physical GPU
  int gpu_index = 0;  // its NVML index on this node
  int slot = 0;       // 0 .. slots_per_gpu-1
  int numa_node = -1;
  bool healthy = true;

  bool operator==(const DeviceSlot&) const = default;
};

// One container of an Allocate call: the slots the kubelet picked for it.
struct AllocateContainerRequest {
  std::vector<DeviceSlot> devices;
};

// An Allocate call: the kubelet sends one container at a time today, but the API allows several.
struct AllocateRequestView {
  std::vector<AllocateContainerRequest> containers;
};

// A PreStartContainer call (only when the plugin was configured with pre_start_required).
struct PreStartRequestView {
  std::vector<DeviceSlot> devices;
};

// A host path mounted into the container.
struct Mount {
  std::string container_path;
  std::string host_path;
  bool read_only = true;

  bool operator==(const Mount&) const = default;
};

// A host device node made available in the container (for runtimes without the NVIDIA runtime).
struct DeviceNode {
  std::string container_path;
  std::string host_path;
  std::string permissions = "rw";  // any of r, w, m

  bool operator==(const DeviceNode&) const = default;
};

// What one container gets (becomes a v1beta1.ContainerAllocateResponse).
struct ContainerAllocation {
  std::map<std::string, std::string> envs;         // e.g. NVIDIA_VISIBLE_DEVICES, TESSERA_* variables
  std::vector<Mount> mounts;                        // hook library, /etc/ld.so.preload, limits dir, region...
  std::vector<DeviceNode> devices;                  // /dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm...
  std::map<std::string, std::string> annotations;  // passed to the container runtime
  std::vector<std::string> cdi_devices;             // fully qualified CDI names, e.g. "nvidia.com/gpu=0"

  bool operator==(const ContainerAllocation&) const = default;
};

class AllocationBackend {
 public:
  virtual ~AllocationBackend() = default;

  // Returns one ContainerAllocation per request container, in order. Called concurrently.
  virtual absl::StatusOr<std::vector<ContainerAllocation>> Allocate(const AllocateRequestView& request) = 0;

  // Called before each container starts when the plugin registered with pre_start_required. Called
  // concurrently.
  virtual absl::Status PreStartContainer(const PreStartRequestView& request) = 0;
};

// The device nodes a container needs to use the GPUs of the given NVML indices without the NVIDIA container
// runtime: /dev/nvidia<i> for each, then /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools and
// /dev/nvidia-modeset. Control devices that do not exist under `dev_root` on this host are left out (the
// runtime would refuse a missing host path); a missing /dev/nvidia<i> is kept, so the error is visible.
std::vector<DeviceNode> NvidiaDeviceNodes(const std::vector<int>& gpu_indices, std::string_view dev_root = "/dev");

}  // namespace tessera::kubelet

#endif  // TESSERA_KUBELET_ALLOCATION_BACKEND_H_

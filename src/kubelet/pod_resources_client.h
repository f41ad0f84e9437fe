// A client of the kubelet's pod-resources API (v1.PodResourcesLister over
// /var/lib/kubelet/pod-resources/kubelet.sock): which devices the kubelet gave to which pod's containers.
// The node agent reconciles its records against it (docs/node-agent.md, "Swapped allocations"). Results are plain structs.
//
//   absl::StatusOr<std::unique_ptr<PodResourcesClient>> c = PodResourcesClient::Connect();   // default socket
//   absl::StatusOr<std::vector<PodResources>> pods = (*c)->List();
//   for (const PodResources& p : *pods)
//     for (const ContainerResources& ctr : p.containers)
//       std::vector<std::string> ids = ctr.DeviceIds("tessera.dev/gpu");
//
// The kubelet rate-limits this API (qps 100, burst 10); the agent should list, not poll per pod.
// Errors name the socket and say what to do (mount the pod-resources directory, kubelet too old).
//
// Thread-safety: a client may be shared between threads.
#ifndef TESSERA_KUBELET_POD_RESOURCES_CLIENT_H_
#define TESSERA_KUBELET_POD_RESOURCES_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::kubelet {

inline constexpr char kPodResourcesSocket[] = "/var/lib/kubelet/pod-resources/kubelet.sock";

// Devices of one resource held by a container (or allocatable on the node).
struct ContainerDevices {
  std::string resource_name;
  std::vector<std::string> device_ids;
  std::vector<int64_t> numa_nodes;  // the devices' topology

  bool operator==(const ContainerDevices&) const = default;
};

struct ContainerMemory {
  std::string memory_type;  // "memory", "hugepages-1Gi"...
  uint64_t size = 0;
  std::vector<int64_t> numa_nodes;

  bool operator==(const ContainerMemory&) const = default;
};

struct ContainerResources {
  std::string name;
  std::vector<ContainerDevices> devices;
  std::vector<int64_t> cpu_ids;  // exclusive CPUs (static CPU manager policy)
  std::vector<ContainerMemory> memory;

  // Every device ID of `resource` held by this container.
  std::vector<std::string> DeviceIds(const std::string& resource) const;

  bool operator==(const ContainerResources&) const = default;
};

struct PodResources {
  std::string name;
  std::string ns;
  std::vector<ContainerResources> containers;

  bool operator==(const PodResources&) const = default;
};

struct AllocatableResources {
  std::vector<ContainerDevices> devices;
  std::vector<int64_t> cpu_ids;
  std::vector<ContainerMemory> memory;

  bool operator==(const AllocatableResources&) const = default;
};

class PodResourcesClient {
 public:
  // Connects lazily (the first call dials); `timeout` bounds every call.
  static absl::StatusOr<std::unique_ptr<PodResourcesClient>> Connect(
      const std::string& socket_path = kPodResourcesSocket,
      std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));
  ~PodResourcesClient();

  absl::StatusOr<std::vector<PodResources>> List() const;
  // NotFound when the kubelet does not know the pod.
  absl::StatusOr<PodResources> Get(const std::string& ns, const std::string& name) const;
  absl::StatusOr<AllocatableResources> GetAllocatableResources() const;

 private:
  PodResourcesClient(std::string socket_path, std::chrono::milliseconds timeout);

  absl::Status Error(std::string_view call, int code, std::string_view message) const;

  const std::string socket_path_;
  const std::chrono::milliseconds timeout_;
  struct Stub;  // the generated gRPC stub, kept out of this header
  std::unique_ptr<Stub> stub_;
};

}  // namespace tessera::kubelet

#endif  // TESSERA_KUBELET_POD_RESOURCES_CLIENT_H_

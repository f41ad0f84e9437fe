// The kubelet's calls into a device plugin, for tests and demos: FakePluginClient calls
// GetDevicePluginOptions, ListAndWatch (a stream read on a thread into a queue), GetPreferredAllocation,
// Allocate and PreStartContainer over the plugin's socket, with the real v1beta1 protos, as the kubelet's
// device manager does. FakeKubelet::ConnectPlugin makes one.
//
//   absl::StatusOr<std::unique_ptr<FakePluginClient>> client = kubelet->ConnectPlugin("tessera-gpu.sock");
//   absl::StatusOr<std::vector<kubelet::ContainerAllocation>> a = (*client)->Allocate({{"GPU-a::0"}});
//   auto stream = (*client)->ListAndWatch();
//   absl::StatusOr<std::vector<FakeDevice>> devices = (*stream)->Next(std::chrono::seconds(10));
//
// Thread-safety: a FakePluginClient may be used from any thread; a FakeDeviceStream's Next from one at a
// time.
#ifndef TESSERA_TOOLS_FAKE_KUBELET_PLUGIN_CLIENT_H_
#define TESSERA_TOOLS_FAKE_KUBELET_PLUGIN_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "kubelet/allocation_backend.h"

namespace v1beta1 {
class ListAndWatchResponse;
}  // namespace v1beta1

namespace tessera::kubelet {

// A device as the kubelet received it in ListAndWatch.
struct FakeDevice {
  std::string id;
  std::string health;         // "Healthy" or "Unhealthy"
  std::vector<int64_t> numa;  // topology NUMA node IDs

  bool operator==(const FakeDevice&) const = default;
};

// A ListAndWatch answer as FakeDevices (the fake kubelet's followers read the same).
std::vector<FakeDevice> DevicesOf(const ::v1beta1::ListAndWatchResponse& r);

struct PluginOptionsView {
  bool pre_start_required = false;
  bool get_preferred_allocation_available = false;
};

// One container's GetPreferredAllocation question.
struct PreferredRequest {
  std::vector<std::string> available;
  std::vector<std::string> must_include;
  int size = 0;
};

// A ListAndWatch stream: a thread reads it into a queue.
class FakeDeviceStream {
 public:
  ~FakeDeviceStream();
  // The next device list, or DeadlineExceeded after `timeout`, or the stream's end status (OK: ended).
  absl::StatusOr<std::vector<FakeDevice>> Next(std::chrono::milliseconds timeout);
  void Cancel();

 private:
  friend class FakePluginClient;
  struct State;
  std::shared_ptr<State> state_;
  std::thread reader_;
};

// Drives one device plugin over its socket, with the kubelet's calls.
class FakePluginClient {
 public:
  ~FakePluginClient();
  absl::StatusOr<PluginOptionsView> GetDevicePluginOptions(
      std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;
  absl::StatusOr<std::unique_ptr<FakeDeviceStream>> ListAndWatch() const;
  absl::StatusOr<std::vector<std::vector<std::string>>> GetPreferredAllocation(
      const std::vector<PreferredRequest>& containers) const;
  // One list of device IDs per container; errors carry the plugin's gRPC code and message.
  absl::StatusOr<std::vector<ContainerAllocation>> Allocate(
      const std::vector<std::vector<std::string>>& containers,
      std::chrono::milliseconds timeout = std::chrono::seconds(30)) const;
  absl::Status PreStartContainer(const std::vector<std::string>& device_ids) const;

  // A client of the plugin serving the unix socket at `path` (no connection is made until the first call).
  static std::unique_ptr<FakePluginClient> Connect(const std::string& path);

 private:
  FakePluginClient();
  struct Stub;
  std::unique_ptr<Stub> stub_;
};

}  // namespace tessera::kubelet

#endif  // TESSERA_TOOLS_FAKE_KUBELET_PLUGIN_CLIENT_H_

// A fake kubelet for tests and demos: the kubelet's side of the device-plugin and pod-resources protocols,
// over real gRPC on unix sockets, with the real protos. Not linked into tessera-node (target
// tessera_fake_kubelet).
//
// What it does, as the kubelet does it:
//   - serves v1beta1.Registration on <plugin_dir>/kubelet.sock, checks each request (API version v1beta1, an
//     extended resource name, the endpoint's socket exists) and records it;
//   - after a registration, dials the plugin, calls GetDevicePluginOptions and follows ListAndWatch, keeping
//     the resource's device list (what the kubelet would advertise as capacity);
//   - Restart(): stops, deletes kubelet.sock and every other socket in plugin_dir (the real kubelet empties the
//     directory when it starts), and serves again;
//   - serves v1.PodResourcesLister (List, Get, GetAllocatableResources) on its own socket from content the test
//     sets (Get of an unknown pod fails like the kubelet's: code UNKNOWN, "pod <name> in namespace <ns> not
//     found").
// And, to drive a plugin as the kubelet would: FakePluginClient calls GetDevicePluginOptions, ListAndWatch
// (a stream read on a thread), GetPreferredAllocation, Allocate and PreStartContainer.
//
//   FakeKubeletOptions o;
//   o.plugin_dir = tmp + "/device-plugins";
//   o.pod_resources_socket = tmp + "/pod-resources/kubelet.sock";
//   auto kubelet = FakeKubelet::Start(o);
//   ... start the plugin ...
//   (*kubelet)->WaitForRegistrations(1, std::chrono::seconds(10));
//   auto client = (*kubelet)->ConnectPlugin("tessera-gpu.sock");
//   absl::StatusOr<std::vector<kubelet::ContainerAllocation>> a = (*client)->Allocate({{"GPU-a::0"}});
//
// Thread-safety: every method may be called from any thread.
#ifndef TESSERA_KUBELET_FAKE_KUBELET_H_
#define TESSERA_KUBELET_FAKE_KUBELET_H_

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "kubelet/allocation_backend.h"
#include "kubelet/pod_resources_client.h"

namespace grpc {
class Channel;
class ClientContext;
class Server;
}  // namespace grpc

namespace tessera::kubelet {

// A device as the kubelet received it in ListAndWatch.
struct FakeDevice {
  std::string id;
  std::string health;           // "Healthy" or "Unhealthy"
  std::vector<int64_t> numa;    // topology NUMA node IDs

  bool operator==(const FakeDevice&) const = default;
};

// One Register call the fake received.
struct FakeRegistration {
  std::string version;
  std::string endpoint;
  std::string resource_name;
  bool pre_start_required = false;
  bool get_preferred_allocation_available = false;
  std::chrono::steady_clock::time_point at;  // when it arrived
  std::string error;                         // non-empty: the fake refused it, with this message
};

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

 private:
  friend class FakeKubelet;
  struct Stub;
  std::unique_ptr<Stub> stub_;
};

struct FakeKubeletOptions {
  std::string plugin_dir;            // required; created if missing
  std::string kubelet_socket_name = "kubelet.sock";
  std::string pod_resources_socket;  // empty: no pod-resources server
  bool follow_plugins = true;        // after a registration, follow the plugin's ListAndWatch
};

class FakeKubelet {
 public:
  static absl::StatusOr<std::unique_ptr<FakeKubelet>> Start(FakeKubeletOptions options);
  ~FakeKubelet();
  FakeKubelet(const FakeKubelet&) = delete;
  FakeKubelet& operator=(const FakeKubelet&) = delete;

  // Every Register call so far (accepted and refused), oldest first.
  std::vector<FakeRegistration> registrations() const;
  // Waits until at least `n` registrations were accepted; false on timeout.
  bool WaitForRegistrations(size_t n, std::chrono::milliseconds timeout) const;
  // Waits until at least `n` Register calls arrived, accepted or refused; false on timeout.
  bool WaitForRegistrationAttempts(size_t n, std::chrono::milliseconds timeout) const;

  // The devices the fake follows for `resource` (from the plugin's ListAndWatch), and a wait for a condition
  // on them; false on timeout.
  std::vector<FakeDevice> Devices(const std::string& resource) const;
  bool WaitForDevices(const std::string& resource, const std::function<bool(const std::vector<FakeDevice>&)>& pred,
                      std::chrono::milliseconds timeout) const;

  // Like a kubelet restart: Stop(), delete every socket in plugin_dir, then serve kubelet.sock again.
  absl::Status Restart();
  // Stops serving (both sockets) and removes kubelet.sock; Restart() serves again.
  void Stop();
  // When kubelet.sock was last created (taken just before the server bound it).
  std::chrono::steady_clock::time_point last_start() const;

  void SetPodResources(std::vector<PodResources> pods);
  void SetAllocatable(AllocatableResources allocatable);

  // A client for the plugin serving <plugin_dir>/<endpoint>.
  absl::StatusOr<std::unique_ptr<FakePluginClient>> ConnectPlugin(const std::string& endpoint) const;

  std::string kubelet_socket() const { return options_.plugin_dir + "/" + options_.kubelet_socket_name; }
  const FakeKubeletOptions& options() const { return options_; }

 private:
  class RegistrationService;
  class PodResourcesService;
  struct Follower;

  explicit FakeKubelet(FakeKubeletOptions options);
  absl::Status Serve();
  // Called by the Registration service: checks and records a request; starts following the plugin.
  std::string OnRegister(FakeRegistration r);
  void Follow(const FakeRegistration& r);

  const FakeKubeletOptions options_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<FakeRegistration> registrations_;
  std::map<std::string, std::vector<FakeDevice>> devices_;  // resource -> devices
  std::vector<PodResources> pods_;
  AllocatableResources allocatable_;
  std::chrono::steady_clock::time_point last_start_;
  std::vector<std::unique_ptr<Follower>> followers_;
  bool serving_ = false;

  std::mutex server_mu_;  // serializes Serve/Stop
  std::unique_ptr<RegistrationService> registration_service_;
  std::unique_ptr<PodResourcesService> pod_resources_service_;
  std::unique_ptr<grpc::Server> registration_server_;
  std::unique_ptr<grpc::Server> pod_resources_server_;
};

}  // namespace tessera::kubelet

#endif  // TESSERA_KUBELET_FAKE_KUBELET_H_

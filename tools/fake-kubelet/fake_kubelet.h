// A fake kubelet for tests and demos: the kubelet's side of the device-plugin and pod-resources protocols,
// over real gRPC on unix sockets, with the real protos. A test double: nothing under src/ links it (target
// tessera_fake_kubelet, tools/fake-kubelet). Split by the job it fakes:
//   - this file, the device manager's side: serves v1beta1.Registration on <plugin_dir>/kubelet.sock, checks
//     each request (API version v1beta1, an extended resource name, the endpoint's socket exists) and records
//     it; after a registration, dials the plugin, calls GetDevicePluginOptions and follows ListAndWatch,
//     keeping the resource's device list (what the kubelet would advertise as capacity); Restart(): stops,
//     deletes kubelet.sock and every other socket in plugin_dir (the real kubelet empties the directory when
//     it starts), and serves again;
//   - pod_resources_server.h: v1.PodResourcesLister on its own socket, from content the test sets;
//   - plugin_client.h: the kubelet's calls into a plugin (FakePluginClient), to drive one as the kubelet
//   would.
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
#ifndef TESSERA_TOOLS_FAKE_KUBELET_FAKE_KUBELET_H_
#define TESSERA_TOOLS_FAKE_KUBELET_FAKE_KUBELET_H_

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "kubelet/pod_resources_client.h"
#include "plugin_client.h"
#include "pod_resources_server.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace tessera::kubelet {

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

struct FakeKubeletOptions {
  std::string plugin_dir;  // required; created if missing
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
  bool WaitForDevices(const std::string& resource,
                      const std::function<bool(const std::vector<FakeDevice>&)>& pred,
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
  struct Follower;

  explicit FakeKubelet(FakeKubeletOptions options);
  absl::Status Serve();
  // Called by the Registration service: checks and records a request; starts following the plugin.
  std::string OnRegister(FakeRegistration r);
  void Follow(const FakeRegistration& r);

  const FakeKubeletOptions options_;
  // Guards what the Registration service and the followers record, and whether the fake serves; cv_ is
  // signalled at each change.
  mutable Mutex mu_;
  mutable CondVar cv_;
  std::vector<FakeRegistration> registrations_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<FakeDevice>> devices_ ABSL_GUARDED_BY(mu_);  // resource -> devices
  std::chrono::steady_clock::time_point last_start_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Follower>> followers_ ABSL_GUARDED_BY(mu_);
  bool serving_ ABSL_GUARDED_BY(mu_) = false;

  Mutex server_mu_;  // serializes Serve/Stop, and guards the servers they start and stop
  std::unique_ptr<RegistrationService> registration_service_ ABSL_GUARDED_BY(server_mu_);
  std::unique_ptr<grpc::Server> registration_server_ ABSL_GUARDED_BY(server_mu_);
  // Null without FakeKubeletOptions::pod_resources_socket; its content outlives restarts.
  const std::unique_ptr<FakePodResourcesServer> pod_resources_;
};

}  // namespace tessera::kubelet

#endif  // TESSERA_TOOLS_FAKE_KUBELET_FAKE_KUBELET_H_

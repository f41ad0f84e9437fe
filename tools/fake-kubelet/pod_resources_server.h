// The kubelet's pod-resources side, for tests and demos: serves v1.PodResourcesLister (List, Get,
// GetAllocatableResources) on a unix socket from content the test sets, over real gRPC with the real protos.
// Get of an unknown pod fails like the kubelet's: code UNKNOWN, "pod <name> in namespace <ns> not found".
// FakeKubelet runs one when FakeKubeletOptions::pod_resources_socket is set.
//
//   FakePodResourcesServer server(tmp + "/pod-resources/kubelet.sock");
//   server.SetPodResources({pod});
//   absl::Status s = server.Serve();
//
// Thread-safety: every method may be called from any thread; Serve and Stop from one at a time.
#ifndef TESSERA_TOOLS_FAKE_KUBELET_POD_RESOURCES_SERVER_H_
#define TESSERA_TOOLS_FAKE_KUBELET_POD_RESOURCES_SERVER_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/mutex.h"
#include "kubelet/pod_resources_client.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace tessera::kubelet {

class FakePodResourcesServer {
 public:
  explicit FakePodResourcesServer(std::string socket_path);
  ~FakePodResourcesServer();
  FakePodResourcesServer(const FakePodResourcesServer&) = delete;
  FakePodResourcesServer& operator=(const FakePodResourcesServer&) = delete;

  // Creates the socket's directory, replaces a stale socket and serves.
  absl::Status Serve();
  // Stops serving (within `grace`) and removes the socket; Serve() serves again.
  void Stop(std::chrono::milliseconds grace);

  void SetPodResources(std::vector<PodResources> pods);
  void SetAllocatable(AllocatableResources allocatable);

 private:
  class Service;

  const std::string socket_path_;
  mutable Mutex mu_;  // guards the content served
  std::vector<PodResources> pods_ ABSL_GUARDED_BY(mu_);
  AllocatableResources allocatable_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace tessera::kubelet

#endif  // TESSERA_TOOLS_FAKE_KUBELET_POD_RESOURCES_SERVER_H_

// The kubelet plugin of a Dynamic Resource Allocation driver (DRA kubelet API v1, plugin registration v1,
// gRPC over unix sockets). docs/dra.md describes the driver; the protos are in third_party/k8s-api.
//
// It serves two sockets:
//   <registry_dir>/<driver>-reg.sock  pluginregistration.Registration: the kubelet's plugin watcher finds it,
//                                     asks GetInfo (type DRAPlugin, the driver's name, the service socket,
//                                     the services offered: "v1.DRAPlugin") and reports the outcome in
//                                     NotifyRegistrationStatus;
//   <plugins_dir>/<driver>/dra.sock   k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin: NodePrepareResources and
//                                     NodeUnprepareResources, each claim handed to the DraBackend, its error
//                                     (if any) in the claim's own answer so that one bad claim fails only
//                                     its pods.
// A watcher thread re-creates either socket when it disappears (the kubelet's plugin directories wiped);
// a stale socket file of an earlier run is replaced at start.
//
//   kubelet::DraPluginConfig config;                        // /var/lib/kubelet/plugins{,_registry}
//   auto plugin = kubelet::DraPlugin::Create(config, &backend);
//   (*plugin)->Start();                                     // serving; the kubelet registers it when it looks
//   (*plugin)->registered();                                // the kubelet said so
//
// Thread-safety: public methods from any thread; the backend is called concurrently from gRPC threads and
// must outlive the plugin.
#ifndef TESSERA_KUBELET_DRA_PLUGIN_H_
#define TESSERA_KUBELET_DRA_PLUGIN_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"

namespace tessera::kubelet {

inline constexpr char kKubeletPluginsDir[] = "/var/lib/kubelet/plugins";
inline constexpr char kKubeletPluginsRegistryDir[] = "/var/lib/kubelet/plugins_registry";
inline constexpr char kDraDriverName[] = "gpu.tessera.dev";
// The services a DRA plugin names in GetInfo's supported_versions ("<proto package's last part>.<service>").
inline constexpr char kDraPluginServiceV1[] = "v1.DRAPlugin";

struct DraClaim {
  std::string ns;
  std::string uid;
  std::string name;
};

// One allocated device of a prepared claim, as NodePrepareResourceResponse reports it.
struct DraPreparedDevice {
  std::vector<std::string> requests;  // the claim's request names this device serves
  std::string pool;
  std::string device;
  std::vector<std::string> cdi_device_ids;  // "vendor/class=name", resolved by the container runtime
  std::string share_id;                     // for a device with several allocations; empty otherwise
};

class DraBackend {
 public:
  virtual ~DraBackend() = default;
  // Prepares a claim for the containers of this node that use it. Called again for a prepared claim (after
  // a kubelet or plugin restart): must answer the same devices.
  virtual absl::StatusOr<std::vector<DraPreparedDevice>> Prepare(const DraClaim& claim) = 0;
  // Undoes Prepare. A claim that is not prepared is not an error.
  virtual absl::Status Unprepare(const DraClaim& claim) = 0;
};

struct DraPluginConfig {
  std::string driver = kDraDriverName;
  std::string plugins_dir = kKubeletPluginsDir;           // the service socket in <plugins_dir>/<driver>/
  std::string registry_dir = kKubeletPluginsRegistryDir;  // the registration socket
  std::chrono::milliseconds watch_period{1000};           // how often the sockets are checked
};

struct DraPluginStats {
  uint64_t prepared = 0;  // claims prepared (answers without an error)
  uint64_t prepare_errors = 0;
  uint64_t unprepared = 0;
  uint64_t unprepare_errors = 0;
  uint64_t server_starts = 0;
  uint64_t registrations = 0;  // NotifyRegistrationStatus with plugin_registered true
  std::string last_registration_error;
};

class DraPlugin {
 public:
  static absl::StatusOr<std::unique_ptr<DraPlugin>> Create(DraPluginConfig config, DraBackend* backend);
  ~DraPlugin();
  DraPlugin(const DraPlugin&) = delete;
  DraPlugin& operator=(const DraPlugin&) = delete;

  absl::Status Start() ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  bool registered() const ABSL_LOCKS_EXCLUDED(mu_);
  std::string service_socket() const;
  std::string registration_socket() const;
  DraPluginStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // Prometheus text: tessera_dra_registered and the prepare/unprepare counters (docs/metrics.md).
  std::string MetricsText() const;

 private:
  class DraService;
  class RegistrationService;
  struct Server;
  DraPlugin(DraPluginConfig config, DraBackend* backend);
  // The servers start and stop without the lock (gRPC calls in flight take it to count themselves).
  absl::Status StartServer() ABSL_LOCKS_EXCLUDED(mu_);
  void StopServer() ABSL_LOCKS_EXCLUDED(mu_);
  bool SocketsIntact() const ABSL_LOCKS_EXCLUDED(mu_);
  void Watch() ABSL_LOCKS_EXCLUDED(mu_);

  const DraPluginConfig config_;
  DraBackend* const backend_;

  mutable Mutex mu_;  // the servers, their sockets' inodes, the counters and stopping_
  std::unique_ptr<Server> server_ ABSL_GUARDED_BY(mu_);
  unsigned long service_inode_ ABSL_GUARDED_BY(mu_) = 0;
  unsigned long registration_inode_ ABSL_GUARDED_BY(mu_) = 0;
  DraPluginStats stats_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  CondVar cv_;  // signalled when stopping_ is set
  std::thread watcher_;
};

}  // namespace tessera::kubelet

#endif  // TESSERA_KUBELET_DRA_PLUGIN_H_

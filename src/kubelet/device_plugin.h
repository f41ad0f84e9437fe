// The kubelet device plugin for `tessera.dev/gpu` (device plugin API v1beta1, gRPC over unix sockets).
//
// It serves v1beta1.DevicePlugin on <plugin_dir>/<endpoint>, registers with the kubelet's v1beta1.Registration
// on <plugin_dir>/kubelet.sock, and advertises `slots_per_gpu` devices per physical GPU ("<UUID>::<slot>", with
// the GPU's NUMA node as topology). ListAndWatch sends the device list and again at every change (health, GPU
// list); GetPreferredAllocation spreads a container's slots over distinct GPUs (preferred_allocation.h);
// Allocate and PreStartContainer ask the AllocationBackend (the node agent) and hold no lock around that call.
//
// Restarts: a watcher thread follows the plugin directory with inotify. When the kubelet restarts it deletes
// every socket there and re-creates kubelet.sock; the plugin then re-creates its own socket (a new gRPC
// server) and registers again, normally within milliseconds. Registration failures are retried with backoff
// (100 ms doubling to 5 s) as long as kubelet.sock exists. A stale socket file left by an earlier run is removed
// before listening.
//
//   kubelet::DevicePluginConfig config;               // defaults: /var/lib/kubelet/device-plugins/, ...
//   config.slots_per_gpu = 10;
//   auto plugin = kubelet::DevicePlugin::Create(config, kubelet::PluginGpusFrom(inventory), &backend);
//   absl::Status s = (*plugin)->Start();              // serving; registration proceeds in the background
//   (*plugin)->SetGpuHealth(uuid, false);             // that GPU's slots turn Unhealthy in ListAndWatch
//   (*plugin)->Stop();                                // also done by the destructor
//
// Thread-safety: every public method may be called from any thread. The backend must outlive the plugin.
#ifndef TESSERA_KUBELET_DEVICE_PLUGIN_H_
#define TESSERA_KUBELET_DEVICE_PLUGIN_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "core/ids.h"
#include "core/topology.h"
#include "formats/inventory.h"
#include "kubelet/allocation_backend.h"

namespace tessera::kubelet {

inline constexpr char kDevicePluginDir[] = "/var/lib/kubelet/device-plugins";
inline constexpr char kKubeletSocketName[] = "kubelet.sock";
inline constexpr char kDevicePluginApiVersion[] = "v1beta1";
inline constexpr char kGpuResourceName[] = "tessera.dev/gpu";
inline constexpr char kDefaultEndpoint[] = "tessera-gpu.sock";

struct DevicePluginConfig {
  std::string plugin_dir = kDevicePluginDir;            // where both sockets live
  std::string kubelet_socket_name = kKubeletSocketName;  // the kubelet's Registration socket, in plugin_dir
  std::string endpoint = kDefaultEndpoint;               // this plugin's socket file name, in plugin_dir
  std::string resource_name = kGpuResourceName;
  int slots_per_gpu = 10;                                // devices advertised per physical GPU (1..1000)
  bool pre_start_required = false;                       // ask the kubelet to call PreStartContainer
  bool get_preferred_allocation_available = true;
  core::LinkMatrix links;                                // by GPU index, for GetPreferredAllocation; may be empty
  std::chrono::milliseconds register_timeout{5000};      // one Register call
};

// A physical GPU as the plugin sees it.
struct PluginGpu {
  core::GpuUuid uuid;
  int index = 0;
  int numa_node = -1;
  bool healthy = true;

  bool operator==(const PluginGpu&) const = default;
};

// The plugin's GPUs from an inventory (formats/inventory.h), health included.
std::vector<PluginGpu> PluginGpusFrom(const formats::GpuInventory& inventory);

struct DevicePluginStats {
  uint64_t registrations = 0;     // successful Register calls
  uint64_t register_failures = 0;
  uint64_t server_starts = 0;     // gRPC servers started (1 + restarts)
  uint64_t allocations = 0;       // Allocate calls answered OK
  uint64_t allocation_errors = 0;
  std::string last_register_error;
};

class DevicePlugin {
 public:
  // Checks the configuration and the GPUs (slot IDs must fit the kubelet's 63 characters, UUIDs be unique).
  static absl::StatusOr<std::unique_ptr<DevicePlugin>> Create(DevicePluginConfig config,
                                                              std::vector<PluginGpu> gpus,
                                                              AllocationBackend* backend);
  ~DevicePlugin();
  DevicePlugin(const DevicePlugin&) = delete;
  DevicePlugin& operator=(const DevicePlugin&) = delete;

  // Creates plugin_dir if needed, removes a stale socket, starts serving and the watcher (which registers).
  // Returns once the socket accepts connections. Errors: the directory or socket cannot be created.
  absl::Status Start() ABSL_LOCKS_EXCLUDED(server_mu_);
  // Stops the watcher and the server and removes the socket. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(server_mu_);

  // Marks every slot of the GPU Healthy or Unhealthy; ListAndWatch streams get the new list. Unknown UUIDs
  // are ignored (returns false).
  bool SetGpuHealth(const core::GpuUuid& uuid, bool healthy) ABSL_LOCKS_EXCLUDED(mu_);
  // Replaces the GPU list (e.g. after the inventory was read again); streams get the new list.
  absl::Status SetGpus(std::vector<PluginGpu> gpus) ABSL_LOCKS_EXCLUDED(mu_);

  // The devices as ListAndWatch sends them now.
  std::vector<DeviceSlot> Devices() const ABSL_LOCKS_EXCLUDED(mu_);
  // The full path of the plugin's socket.
  std::string socket_path() const;
  // Whether the last registration attempt succeeded (and no kubelet restart was seen since).
  bool registered() const { return registered_.load(); }
  DevicePluginStats stats() const ABSL_LOCKS_EXCLUDED(stats_mu_);

 private:
  class Service;
  struct Server;

  DevicePlugin(DevicePluginConfig config, AllocationBackend* backend);
  absl::Status BuildSlots(std::vector<PluginGpu> gpus) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status StartServer() ABSL_EXCLUSIVE_LOCKS_REQUIRED(server_mu_);
  void StopServer() ABSL_EXCLUSIVE_LOCKS_REQUIRED(server_mu_);
  absl::Status Register() ABSL_LOCKS_EXCLUDED(stats_mu_);
  void WatchLoop() ABSL_LOCKS_EXCLUDED(server_mu_);
  bool OwnSocketIntact() const;
  void CountAllocation(bool ok) ABSL_LOCKS_EXCLUDED(stats_mu_);
  // Resolves kubelet device IDs; unknown IDs are an error naming them.
  absl::StatusOr<std::vector<DeviceSlot>> Resolve(const std::vector<std::string>& ids) const
      ABSL_LOCKS_EXCLUDED(mu_);

  const DevicePluginConfig config_;
  AllocationBackend* const backend_;

  // The gRPC server; taken before mu_ and stats_mu_ (a restart counts itself and wakes the streams).
  Mutex server_mu_ ABSL_ACQUIRED_BEFORE(mu_, stats_mu_);
  std::unique_ptr<Server> server_ ABSL_GUARDED_BY(server_mu_);
  std::atomic<unsigned long> socket_inode_{0};  // of the socket file we bound (0: none)

  // The devices; cv_'s waiters are ListAndWatch streams, signalled at every change of version_.
  mutable Mutex mu_;
  CondVar cv_;
  std::vector<PluginGpu> gpus_ ABSL_GUARDED_BY(mu_);
  std::vector<DeviceSlot> slots_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, size_t> slot_index_ ABSL_GUARDED_BY(mu_);  // device ID -> slots_ position
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 1;

  std::atomic<bool> registered_{false};
  std::atomic<bool> running_{false};
  int inotify_fd_ = -1;
  int stop_fd_ = -1;  // eventfd that wakes the watcher
  std::thread watcher_;

  mutable Mutex stats_mu_;  // the counters
  DevicePluginStats stats_ ABSL_GUARDED_BY(stats_mu_);
};

}  // namespace tessera::kubelet

#endif  // TESSERA_KUBELET_DEVICE_PLUGIN_H_

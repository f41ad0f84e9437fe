#include "kubelet/device_plugin.h"

#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "absl/status/status.h"
#include "common/log.h"
#include "core/strings.h"
#include "deviceplugin-v1beta1-api.grpc.pb.h"
#include "kubelet/device_ids.h"
#include "kubelet/preferred_allocation.h"

namespace tessera::kubelet {

namespace {

constexpr char kHealthy[] = "Healthy";
constexpr char kUnhealthy[] = "Unhealthy";

grpc::Status ToGrpc(const absl::Status& s, std::string_view context) {
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code())),
                      StrCat(context, s.message()));
}

std::string IdList(const google::protobuf::RepeatedPtrField<std::string>& ids) {
  return StrCat("[", StrJoin(ids, ", "), "]");
}

}  // namespace

std::vector<PluginGpu> PluginGpusFrom(const formats::GpuInventory& inventory) {
  std::vector<PluginGpu> out;
  for (const formats::InventoryGpu& g : inventory.gpus) {
    out.push_back({g.info.uuid, g.info.index, g.info.numa_node, g.info.health == core::GpuHealth::kHealthy});
  }
  return out;
}

// The gRPC service of one server instance; a restart makes a new one.
class DevicePlugin::Service final : public ::v1beta1::DevicePlugin::Service {
 public:
  explicit Service(DevicePlugin* plugin) : p_(plugin) {}

  std::atomic<bool> stopping{false};

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const ::v1beta1::Empty*,
                                      ::v1beta1::DevicePluginOptions* out) override {
    out->set_pre_start_required(p_->config_.pre_start_required);
    out->set_get_preferred_allocation_available(p_->config_.get_preferred_allocation_available);
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const ::v1beta1::Empty*,
                            grpc::ServerWriter<::v1beta1::ListAndWatchResponse>* writer) override {
    log::Info("kubelet opened ListAndWatch", {{"peer", ctx->peer()}});
    uint64_t sent = 0;
    while (true) {
      ::v1beta1::ListAndWatchResponse response;
      {
        MutexLock lock(&p_->mu_);
        sent = p_->version_;
        for (const DeviceSlot& s : p_->slots_) {
          ::v1beta1::Device* d = response.add_devices();
          d->set_id(s.id);
          d->set_health(s.healthy ? kHealthy : kUnhealthy);
          if (s.numa_node >= 0) d->mutable_topology()->add_nodes()->set_id(s.numa_node);
        }
      }
      if (!writer->Write(response)) return grpc::Status::OK;  // the kubelet went away
      MutexLock lock(&p_->mu_);
      // Woken by every change; the timeout only notices a cancelled stream (gRPC cannot notify a condition).
      while (p_->version_ == sent && !stopping && !ctx->IsCancelled()) {
        p_->cv_.WaitFor(&p_->mu_, std::chrono::milliseconds(100));
      }
      if (stopping || ctx->IsCancelled()) return grpc::Status::OK;
    }
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*, const ::v1beta1::PreferredAllocationRequest* request,
                                      ::v1beta1::PreferredAllocationResponse* response) override {
    for (const ::v1beta1::ContainerPreferredAllocationRequest& c : request->container_requests()) {
      std::vector<DeviceSlot> available;
      {
        MutexLock lock(&p_->mu_);
        for (const std::string& id : c.available_deviceids()) {
          auto it = p_->slot_index_.find(id);
          if (it != p_->slot_index_.end()) available.push_back(p_->slots_[it->second]);
        }
      }
      std::vector<std::string> must(c.must_include_deviceids().begin(), c.must_include_deviceids().end());
      std::vector<std::string> ids = PreferredSlots(available, must, c.allocation_size(), &p_->config_.links);
      ::v1beta1::ContainerPreferredAllocationResponse* out = response->add_container_responses();
      for (std::string& id : ids) out->add_deviceids(std::move(id));
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const ::v1beta1::AllocateRequest* request,
                        ::v1beta1::AllocateResponse* response) override {
    AllocateRequestView view;
    std::string all_ids;
    for (const ::v1beta1::ContainerAllocateRequest& c : request->container_requests()) {
      std::vector<std::string> ids(c.devices_ids().begin(), c.devices_ids().end());
      StrAppend(&all_ids, all_ids.empty() ? "" : " ", IdList(c.devices_ids()));
      absl::StatusOr<std::vector<DeviceSlot>> slots = p_->Resolve(ids);
      if (!slots.ok()) {
        p_->CountAllocation(false);
        return ToGrpc(slots.status(), "tessera-node cannot allocate: ");
      }
      view.containers.push_back({*std::move(slots)});
    }
    absl::StatusOr<std::vector<ContainerAllocation>> result = p_->backend_->Allocate(view);
    if (!result.ok()) {
      p_->CountAllocation(false);
      log::Warn("Allocate refused", {{"devices", all_ids}, {"error", Message(result.status())}});
      return ToGrpc(result.status(), StrCat("tessera-node cannot allocate ", all_ids, ": "));
    }
    if (result->size() != view.containers.size()) {
      p_->CountAllocation(false);
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          StrCat("tessera-node answered ", result->size(), " containers for ",
                                 view.containers.size(), " requested (a bug in tessera-node; please report it)"));
    }
    for (const ContainerAllocation& a : *result) {
      ::v1beta1::ContainerAllocateResponse* out = response->add_container_responses();
      for (const auto& [k, v] : a.envs) (*out->mutable_envs())[k] = v;
      for (const Mount& m : a.mounts) {
        ::v1beta1::Mount* pm = out->add_mounts();
        pm->set_container_path(m.container_path);
        pm->set_host_path(m.host_path);
        pm->set_read_only(m.read_only);
      }
      for (const DeviceNode& d : a.devices) {
        ::v1beta1::DeviceSpec* pd = out->add_devices();
        pd->set_container_path(d.container_path);
        pd->set_host_path(d.host_path);
        pd->set_permissions(d.permissions);
      }
      for (const auto& [k, v] : a.annotations) (*out->mutable_annotations())[k] = v;
      for (const std::string& name : a.cdi_devices) out->add_cdi_devices()->set_name(name);
    }
    p_->CountAllocation(true);
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const ::v1beta1::PreStartContainerRequest* request,
                                 ::v1beta1::PreStartContainerResponse*) override {
    std::vector<std::string> ids(request->devices_ids().begin(), request->devices_ids().end());
    absl::StatusOr<std::vector<DeviceSlot>> slots = p_->Resolve(ids);
    if (!slots.ok()) return ToGrpc(slots.status(), "tessera-node PreStartContainer: ");
    absl::Status s = p_->backend_->PreStartContainer({*std::move(slots)});
    if (!s.ok()) {
      return ToGrpc(s, StrCat("tessera-node PreStartContainer ", IdList(request->devices_ids()), ": "));
    }
    return grpc::Status::OK;
  }

 private:
  DevicePlugin* const p_;
};

struct DevicePlugin::Server {
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Server> server;
};

DevicePlugin::DevicePlugin(DevicePluginConfig config, AllocationBackend* backend)
    : config_(std::move(config)), backend_(backend) {}

absl::StatusOr<std::unique_ptr<DevicePlugin>> DevicePlugin::Create(DevicePluginConfig config,
                                                                   std::vector<PluginGpu> gpus,
                                                                   AllocationBackend* backend) {
  if (backend == nullptr) return absl::InvalidArgumentError("the device plugin needs an allocation backend");
  if (config.slots_per_gpu < 1 || config.slots_per_gpu > 1000) {
    return absl::InvalidArgumentError(
        StrCat("slots per GPU is ", config.slots_per_gpu, "; choose 1 to 1000 (the most vGPUs one GPU may hold)"));
  }
  if (config.endpoint.empty() || config.endpoint.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(StrCat("the plugin endpoint \"", config.endpoint,
                                             "\" must be a socket file name without '/', e.g. tessera-gpu.sock"));
  }
  if (config.endpoint == config.kubelet_socket_name) {
    return absl::InvalidArgumentError(
        StrCat("the plugin endpoint must differ from the kubelet's socket ", config.kubelet_socket_name));
  }
  const std::string path = config.plugin_dir + "/" + config.endpoint;
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(StrCat("the socket path ", path, " is longer than a unix socket allows (",
                                             sizeof(sockaddr_un::sun_path) - 1, "); use a shorter directory"));
  }
  std::unique_ptr<DevicePlugin> plugin(new DevicePlugin(std::move(config), backend));
  MutexLock lock(&plugin->mu_);
  absl::Status s = plugin->BuildSlots(std::move(gpus));
  if (!s.ok()) return s;
  return plugin;
}

DevicePlugin::~DevicePlugin() {
  Stop();
}

absl::Status DevicePlugin::BuildSlots(std::vector<PluginGpu> gpus) {
  std::set<std::string> uuids;
  std::vector<DeviceSlot> slots;
  std::unordered_map<std::string, size_t> index;
  for (const PluginGpu& g : gpus) {
    if (g.uuid.empty()) return absl::InvalidArgumentError("a GPU has an empty UUID");
    if (!uuids.insert(g.uuid.value()).second) {
      return absl::InvalidArgumentError(StrCat("GPU UUID ", g.uuid.value(), " appears twice"));
    }
    for (int s = 0; s < config_.slots_per_gpu; ++s) {
      DeviceSlot slot{SlotDeviceId(g.uuid, s), g.uuid, g.index, s, g.numa_node, g.healthy};
      if (slot.id.size() > kMaxDeviceIdLength) {
        return absl::InvalidArgumentError(
            StrCat("device ID ", slot.id, " is longer than the kubelet's ", kMaxDeviceIdLength,
                   " characters; GPU UUIDs must be at most ", kMaxDeviceIdLength - 5,
                   " characters (shorten the uuid in the fake-GPU file)"));
      }
      index.emplace(slot.id, slots.size());
      slots.push_back(std::move(slot));
    }
  }
  gpus_ = std::move(gpus);
  slots_ = std::move(slots);
  slot_index_ = std::move(index);
  return absl::OkStatus();
}

std::string DevicePlugin::socket_path() const {
  return config_.plugin_dir + "/" + config_.endpoint;
}

std::vector<DeviceSlot> DevicePlugin::Devices() const {
  MutexLock lock(&mu_);
  return slots_;
}

DevicePluginStats DevicePlugin::stats() const {
  MutexLock lock(&stats_mu_);
  return stats_;
}

void DevicePlugin::CountAllocation(bool ok) {
  MutexLock lock(&stats_mu_);
  ++(ok ? stats_.allocations : stats_.allocation_errors);
}

bool DevicePlugin::SetGpuHealth(const core::GpuUuid& uuid, bool healthy) {
  {
    MutexLock lock(&mu_);
    bool found = false;
    bool changed = false;
    for (PluginGpu& g : gpus_) {
      if (g.uuid != uuid) continue;
      found = true;
      changed = g.healthy != healthy;
      g.healthy = healthy;
    }
    if (!found) return false;
    if (!changed) return true;
    for (DeviceSlot& s : slots_) {
      if (s.gpu == uuid) s.healthy = healthy;
    }
    ++version_;
  }
  cv_.SignalAll();
  log::Info("GPU health changed in the device plugin",
            {{"gpu", uuid.value()}, {"health", healthy ? kHealthy : kUnhealthy}});
  return true;
}

absl::Status DevicePlugin::SetGpus(std::vector<PluginGpu> gpus) {
  {
    MutexLock lock(&mu_);
    absl::Status s = BuildSlots(std::move(gpus));
    if (!s.ok()) return s;
    ++version_;
  }
  cv_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<DeviceSlot>> DevicePlugin::Resolve(const std::vector<std::string>& ids) const {
  std::vector<DeviceSlot> out;
  out.reserve(ids.size());
  std::vector<std::string> unknown;
  {
    MutexLock lock(&mu_);
    for (const std::string& id : ids) {
      auto it = slot_index_.find(id);
      if (it == slot_index_.end()) {
        unknown.push_back(id);
      } else {
        out.push_back(slots_[it->second]);
      }
    }
  }
  if (!unknown.empty()) {
    return absl::InvalidArgumentError(
        StrCat("unknown device IDs [", StrJoin(unknown, ", "),
               "]: this node advertises other devices now (its GPUs changed since the kubelet's checkpoint); "
               "delete the pod so that it is scheduled again"));
  }
  return out;
}

absl::Status DevicePlugin::StartServer() {
  const std::string path = socket_path();
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(StrCat(path, " exists and is not a socket; remove it or choose "
                                                        "another plugin endpoint"));
    }
    unlink(path.c_str());  // stale, from an earlier run or a kubelet that is gone
  }
  auto server = std::make_unique<Server>();
  server->service = std::make_unique<Service>(this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
  builder.RegisterService(server->service.get());
  server->server = builder.BuildAndStart();
  if (server->server == nullptr) {
    return absl::UnavailableError(StrCat("cannot serve the device plugin on ", path,
                                         "; check that tessera-node may write to ", config_.plugin_dir));
  }
  if (stat(path.c_str(), &st) == 0) socket_inode_ = st.st_ino;
  server_ = std::move(server);
  MutexLock lock(&stats_mu_);
  ++stats_.server_starts;
  return absl::OkStatus();
}

void DevicePlugin::StopServer() {
  if (server_ == nullptr) return;
  server_->service->stopping = true;
  {
    MutexLock lock(&mu_);  // no stream may miss the wake-up between its check and its wait
  }
  cv_.SignalAll();
  server_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  server_->server->Wait();
  server_.reset();
  const std::string path = socket_path();
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0 && st.st_ino == socket_inode_) unlink(path.c_str());
  socket_inode_ = 0;
}

bool DevicePlugin::OwnSocketIntact() const {
  struct stat st {};
  return lstat(socket_path().c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == socket_inode_;
}

absl::Status DevicePlugin::Register() {
  const std::string kubelet = config_.plugin_dir + "/" + config_.kubelet_socket_name;
  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel("unix:" + kubelet, grpc::InsecureChannelCredentials());
  std::unique_ptr<::v1beta1::Registration::Stub> stub = ::v1beta1::Registration::NewStub(channel);
  ::v1beta1::RegisterRequest request;
  request.set_version(kDevicePluginApiVersion);
  request.set_endpoint(config_.endpoint);
  request.set_resource_name(config_.resource_name);
  request.mutable_options()->set_pre_start_required(config_.pre_start_required);
  request.mutable_options()->set_get_preferred_allocation_available(config_.get_preferred_allocation_available);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + config_.register_timeout);
  ::v1beta1::Empty response;
  grpc::Status s = stub->Register(&ctx, request, &response);
  MutexLock lock(&stats_mu_);
  if (!s.ok()) {
    ++stats_.register_failures;
    stats_.last_register_error =
        StrCat("registering ", config_.resource_name, " with the kubelet at ", kubelet, " failed: ",
               s.error_message(), " (gRPC code ", static_cast<int>(s.error_code()), ")");
    return absl::UnavailableError(stats_.last_register_error);
  }
  ++stats_.registrations;
  stats_.last_register_error.clear();
  return absl::OkStatus();
}

absl::Status DevicePlugin::Start() {
  if (running_) return absl::FailedPreconditionError("the device plugin is already running");
  std::error_code ec;
  std::filesystem::create_directories(config_.plugin_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(StrCat("cannot create the device-plugin directory ", config_.plugin_dir,
                                                ": ", ec.message(), "; mount /var/lib/kubelet/device-plugins "
                                                "into the tessera-node pod"));
  }
  {
    MutexLock lock(&server_mu_);
    absl::Status s = StartServer();
    if (!s.ok()) return s;
  }
  inotify_fd_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  stop_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (inotify_fd_ < 0 || stop_fd_ < 0 ||
      inotify_add_watch(inotify_fd_, config_.plugin_dir.c_str(),
                        IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE_SELF | IN_MOVE_SELF) < 0) {
    const std::string err = std::strerror(errno);
    if (inotify_fd_ >= 0) close(inotify_fd_);
    if (stop_fd_ >= 0) close(stop_fd_);
    inotify_fd_ = stop_fd_ = -1;
    MutexLock lock(&server_mu_);
    StopServer();
    return absl::UnavailableError(StrCat("cannot watch ", config_.plugin_dir, " for kubelet restarts: ", err,
                                         "; raise fs.inotify.max_user_instances / max_user_watches"));
  }
  running_ = true;
  watcher_ = std::thread([this] { WatchLoop(); });
  log::Info("device plugin serving", {{"socket", socket_path()}, {"resource", config_.resource_name}});
  return absl::OkStatus();
}

void DevicePlugin::Stop() {
  if (!running_.exchange(false)) return;
  const uint64_t one = 1;
  if (write(stop_fd_, &one, sizeof(one)) < 0) {
    // eventfd writes only fail when the counter would overflow; the watcher is woken either way.
  }
  watcher_.join();
  close(inotify_fd_);
  close(stop_fd_);
  inotify_fd_ = stop_fd_ = -1;
  MutexLock lock(&server_mu_);
  StopServer();
  registered_ = false;
}

void DevicePlugin::WatchLoop() {
  using Clock = std::chrono::steady_clock;
  constexpr auto kFirstBackoff = std::chrono::milliseconds(100);
  constexpr auto kMaxBackoff = std::chrono::milliseconds(5000);
  const std::string kubelet_socket = config_.plugin_dir + "/" + config_.kubelet_socket_name;
  bool need_register = true;
  bool server_up = true;
  auto backoff = std::chrono::milliseconds(kFirstBackoff);
  Clock::time_point next_attempt = Clock::now();
  std::string last_error;

  while (true) {
    const bool kubelet_there = access(kubelet_socket.c_str(), F_OK) == 0;
    int timeout_ms = 1000;  // also re-checks our socket now and then, should an event be lost
    if ((need_register && kubelet_there) || !server_up) {
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_attempt - Clock::now());
      timeout_ms = static_cast<int>(std::clamp<int64_t>(wait.count(), 0, 1000));
    }
    pollfd fds[2] = {{stop_fd_, POLLIN, 0}, {inotify_fd_, POLLIN, 0}};
    if (poll(fds, 2, timeout_ms) < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) break;

    bool kubelet_created = false;
    bool own_deleted = false;
    bool dir_gone = false;
    alignas(inotify_event) char buf[8192];
    ssize_t n = 0;
    while ((n = read(inotify_fd_, buf, sizeof(buf))) > 0) {
      for (char* p = buf; p < buf + n;) {
        const auto* ev = reinterpret_cast<const inotify_event*>(p);
        const std::string name = ev->len > 0 ? std::string(ev->name) : std::string();
        if (name == config_.kubelet_socket_name && (ev->mask & (IN_CREATE | IN_MOVED_TO))) kubelet_created = true;
        if (name == config_.kubelet_socket_name && (ev->mask & (IN_DELETE | IN_MOVED_FROM))) registered_ = false;
        if (name == config_.endpoint && (ev->mask & (IN_DELETE | IN_MOVED_FROM))) own_deleted = true;
        if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED)) dir_gone = true;
        p += sizeof(inotify_event) + ev->len;
      }
    }
    if (dir_gone) {
      std::error_code ec;
      std::filesystem::create_directories(config_.plugin_dir, ec);
      inotify_add_watch(inotify_fd_, config_.plugin_dir.c_str(),
                        IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE_SELF | IN_MOVE_SELF);
      own_deleted = true;
    }
    if (own_deleted || !server_up || !OwnSocketIntact()) {
      if (Clock::now() >= next_attempt || own_deleted) {
        MutexLock lock(&server_mu_);
        StopServer();
        absl::Status s = StartServer();
        server_up = s.ok();
        registered_ = false;
        need_register = true;
        if (!server_up) {
          log::Error("device plugin socket lost and cannot be re-created", {{"error", Message(s)}});
          next_attempt = Clock::now() + kMaxBackoff;
        } else {
          log::Info("device plugin socket re-created", {{"socket", socket_path()}});
          next_attempt = Clock::now();
          backoff = kFirstBackoff;
        }
      }
    }
    if (kubelet_created) {
      log::Info("kubelet socket created: registering again", {{"socket", kubelet_socket}});
      registered_ = false;
      need_register = true;
      backoff = kFirstBackoff;
      next_attempt = Clock::now();
    }
    if (need_register && server_up && Clock::now() >= next_attempt &&
        access(kubelet_socket.c_str(), F_OK) == 0) {
      absl::Status s = Register();
      if (s.ok()) {
        need_register = false;
        registered_ = true;
        last_error.clear();
        log::Info("registered with the kubelet",
                  {{"resource", config_.resource_name}, {"endpoint", config_.endpoint}});
      } else {
        if (Message(s) != last_error) {
          last_error = Message(s);
          log::Warn("kubelet registration failed; retrying", {{"error", last_error}});
        }
        next_attempt = Clock::now() + backoff;
        backoff = std::min<std::chrono::milliseconds>(backoff * 2, kMaxBackoff);
      }
    }
  }
}

}  // namespace tessera::kubelet

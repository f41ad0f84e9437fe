#include "kubelet/fake_kubelet.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <filesystem>

#include "absl/status/status.h"
#include "core/strings.h"
#include "deviceplugin-v1beta1-api.grpc.pb.h"
#include "kubelet/pod_resources_convert.h"
#include "podresources-v1-api.grpc.pb.h"

namespace tessera::kubelet {

namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.error_code())), s.error_message());
}

std::vector<FakeDevice> DevicesOf(const ::v1beta1::ListAndWatchResponse& r) {
  std::vector<FakeDevice> out;
  for (const ::v1beta1::Device& d : r.devices()) {
    FakeDevice fd{d.id(), d.health(), {}};
    for (const ::v1beta1::NUMANode& n : d.topology().nodes()) fd.numa.push_back(n.id());
    out.push_back(std::move(fd));
  }
  return out;
}

// The kubelet's v1helper.IsExtendedResourceName: a qualified name with a domain outside kubernetes.io that is
// not a quota "requests." name.
bool IsExtendedResourceName(const std::string& name) {
  const size_t slash = name.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == name.size()) return false;
  if (name.find('/', slash + 1) != std::string::npos) return false;
  const std::string domain = name.substr(0, slash);
  if (domain == "kubernetes.io" || domain.ends_with(".kubernetes.io")) return false;
  if (name.starts_with("requests.")) return false;
  const std::string local = name.substr(slash + 1);
  if (local.size() > 63) return false;
  for (char c : local) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') return false;
  }
  return std::isalnum(static_cast<unsigned char>(local.front())) &&
         std::isalnum(static_cast<unsigned char>(local.back()));
}

void RemoveSocket(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) unlink(path.c_str());
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// FakePluginClient and FakeDeviceStream

struct FakePluginClient::Stub {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<::v1beta1::DevicePlugin::Stub> stub;
};

FakePluginClient::~FakePluginClient() = default;

absl::StatusOr<PluginOptionsView> FakePluginClient::GetDevicePluginOptions(std::chrono::milliseconds timeout) const {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  ::v1beta1::Empty request;
  ::v1beta1::DevicePluginOptions response;
  grpc::Status s = stub_->stub->GetDevicePluginOptions(&ctx, request, &response);
  if (!s.ok()) return FromGrpc(s);
  return PluginOptionsView{response.pre_start_required(), response.get_preferred_allocation_available()};
}

struct FakeDeviceStream::State {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::vector<FakeDevice>> lists;
  bool done = false;
  absl::Status end;
  grpc::ClientContext ctx;
  std::shared_ptr<grpc::Channel> channel;
};

absl::StatusOr<std::unique_ptr<FakeDeviceStream>> FakePluginClient::ListAndWatch() const {
  auto stream = std::unique_ptr<FakeDeviceStream>(new FakeDeviceStream());
  auto state = std::make_shared<FakeDeviceStream::State>();
  state->channel = stub_->channel;
  stream->state_ = state;
  stream->reader_ = std::thread([state] {
    auto stub = ::v1beta1::DevicePlugin::NewStub(state->channel);
    ::v1beta1::Empty request;
    std::unique_ptr<grpc::ClientReader<::v1beta1::ListAndWatchResponse>> reader =
        stub->ListAndWatch(&state->ctx, request);
    ::v1beta1::ListAndWatchResponse response;
    while (reader->Read(&response)) {
      std::lock_guard<std::mutex> lock(state->mu);
      state->lists.push_back(DevicesOf(response));
      state->cv.notify_all();
    }
    grpc::Status s = reader->Finish();
    std::lock_guard<std::mutex> lock(state->mu);
    state->done = true;
    state->end = FromGrpc(s);
    state->cv.notify_all();
  });
  return stream;
}

FakeDeviceStream::~FakeDeviceStream() {
  Cancel();
}

void FakeDeviceStream::Cancel() {
  if (!reader_.joinable()) return;
  state_->ctx.TryCancel();
  reader_.join();
}

absl::StatusOr<std::vector<FakeDevice>> FakeDeviceStream::Next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_for(lock, timeout, [&] { return !state_->lists.empty() || state_->done; })) {
    return absl::DeadlineExceededError(StrCat("no device list within ", timeout.count(), " ms"));
  }
  if (!state_->lists.empty()) {
    std::vector<FakeDevice> out = std::move(state_->lists.front());
    state_->lists.pop_front();
    return out;
  }
  return absl::OutOfRangeError(StrCat("the ListAndWatch stream ended: ",
                                      state_->end.ok() ? "OK" : Message(state_->end)));
}

absl::StatusOr<std::vector<std::vector<std::string>>> FakePluginClient::GetPreferredAllocation(
    const std::vector<PreferredRequest>& containers) const {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ::v1beta1::PreferredAllocationRequest request;
  for (const PreferredRequest& c : containers) {
    ::v1beta1::ContainerPreferredAllocationRequest* r = request.add_container_requests();
    for (const std::string& id : c.available) r->add_available_deviceids(id);
    for (const std::string& id : c.must_include) r->add_must_include_deviceids(id);
    r->set_allocation_size(c.size);
  }
  ::v1beta1::PreferredAllocationResponse response;
  grpc::Status s = stub_->stub->GetPreferredAllocation(&ctx, request, &response);
  if (!s.ok()) return FromGrpc(s);
  std::vector<std::vector<std::string>> out;
  for (const ::v1beta1::ContainerPreferredAllocationResponse& c : response.container_responses()) {
    out.emplace_back(c.deviceids().begin(), c.deviceids().end());
  }
  return out;
}

absl::StatusOr<std::vector<ContainerAllocation>> FakePluginClient::Allocate(
    const std::vector<std::vector<std::string>>& containers, std::chrono::milliseconds timeout) const {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  ::v1beta1::AllocateRequest request;
  for (const std::vector<std::string>& ids : containers) {
    ::v1beta1::ContainerAllocateRequest* r = request.add_container_requests();
    for (const std::string& id : ids) r->add_devices_ids(id);
  }
  ::v1beta1::AllocateResponse response;
  grpc::Status s = stub_->stub->Allocate(&ctx, request, &response);
  if (!s.ok()) return FromGrpc(s);
  std::vector<ContainerAllocation> out;
  for (const ::v1beta1::ContainerAllocateResponse& c : response.container_responses()) {
    ContainerAllocation a;
    for (const auto& [k, v] : c.envs()) a.envs[k] = v;
    for (const ::v1beta1::Mount& m : c.mounts()) a.mounts.push_back({m.container_path(), m.host_path(), m.read_only()});
    for (const ::v1beta1::DeviceSpec& d : c.devices()) {
      a.devices.push_back({d.container_path(), d.host_path(), d.permissions()});
    }
    for (const auto& [k, v] : c.annotations()) a.annotations[k] = v;
    for (const ::v1beta1::CDIDevice& d : c.cdi_devices()) a.cdi_devices.push_back(d.name());
    out.push_back(std::move(a));
  }
  return out;
}

absl::Status FakePluginClient::PreStartContainer(const std::vector<std::string>& device_ids) const {
  grpc::ClientContext ctx;
  // The kubelet's KubeletPreStartContainerRPCTimeoutInSecs.
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  ::v1beta1::PreStartContainerRequest request;
  for (const std::string& id : device_ids) request.add_devices_ids(id);
  ::v1beta1::PreStartContainerResponse response;
  return FromGrpc(stub_->stub->PreStartContainer(&ctx, request, &response));
}

// ---------------------------------------------------------------------------------------------------------------
// FakeKubelet

class FakeKubelet::RegistrationService final : public ::v1beta1::Registration::Service {
 public:
  explicit RegistrationService(FakeKubelet* k) : k_(k) {}
  grpc::Status Register(grpc::ServerContext*, const ::v1beta1::RegisterRequest* request,
                        ::v1beta1::Empty*) override {
    FakeRegistration r;
    r.version = request->version();
    r.endpoint = request->endpoint();
    r.resource_name = request->resource_name();
    r.pre_start_required = request->options().pre_start_required();
    r.get_preferred_allocation_available = request->options().get_preferred_allocation_available();
    r.at = std::chrono::steady_clock::now();
    std::string error = k_->OnRegister(std::move(r));
    // The kubelet answers registration errors as plain Go errors: gRPC code UNKNOWN.
    if (!error.empty()) return grpc::Status(grpc::StatusCode::UNKNOWN, error);
    return grpc::Status::OK;
  }

 private:
  FakeKubelet* const k_;
};

class FakeKubelet::PodResourcesService final : public ::v1::PodResourcesLister::Service {
 public:
  explicit PodResourcesService(FakeKubelet* k) : k_(k) {}
  grpc::Status List(grpc::ServerContext*, const ::v1::ListPodResourcesRequest*,
                    ::v1::ListPodResourcesResponse* response) override {
    std::lock_guard<std::mutex> lock(k_->mu_);
    for (const PodResources& p : k_->pods_) *response->add_pod_resources() = ToProto(p);
    return grpc::Status::OK;
  }
  grpc::Status Get(grpc::ServerContext*, const ::v1::GetPodResourcesRequest* request,
                   ::v1::GetPodResourcesResponse* response) override {
    std::lock_guard<std::mutex> lock(k_->mu_);
    for (const PodResources& p : k_->pods_) {
      if (p.ns == request->pod_namespace() && p.name == request->pod_name()) {
        *response->mutable_pod_resources() = ToProto(p);
        return grpc::Status::OK;
      }
    }
    return grpc::Status(grpc::StatusCode::UNKNOWN, StrCat("pod ", request->pod_name(), " in namespace ",
                                                          request->pod_namespace(), " not found"));
  }
  grpc::Status GetAllocatableResources(grpc::ServerContext*, const ::v1::AllocatableResourcesRequest*,
                                       ::v1::AllocatableResourcesResponse* response) override {
    std::lock_guard<std::mutex> lock(k_->mu_);
    *response = ToProto(k_->allocatable_);
    return grpc::Status::OK;
  }

 private:
  FakeKubelet* const k_;
};

struct FakeKubelet::Follower {
  grpc::ClientContext ctx;
  std::thread thread;
};

FakeKubelet::FakeKubelet(FakeKubeletOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<FakeKubelet>> FakeKubelet::Start(FakeKubeletOptions options) {
  if (options.plugin_dir.empty()) return absl::InvalidArgumentError("the fake kubelet needs a plugin_dir");
  std::unique_ptr<FakeKubelet> k(new FakeKubelet(std::move(options)));
  absl::Status s = k->Serve();
  if (!s.ok()) return s;
  return k;
}

FakeKubelet::~FakeKubelet() {
  Stop();
}

absl::Status FakeKubelet::Serve() {
  std::lock_guard<std::mutex> lock(server_mu_);
  std::error_code ec;
  std::filesystem::create_directories(options_.plugin_dir, ec);
  if (ec) return absl::InternalError(StrCat("cannot create ", options_.plugin_dir, ": ", ec.message()));
  RemoveSocket(kubelet_socket());
  registration_service_ = std::make_unique<RegistrationService>(this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + kubelet_socket(), grpc::InsecureServerCredentials());
  builder.RegisterService(registration_service_.get());
  {
    std::lock_guard<std::mutex> l(mu_);
    last_start_ = std::chrono::steady_clock::now();
  }
  registration_server_ = builder.BuildAndStart();
  if (registration_server_ == nullptr) {
    return absl::UnavailableError(StrCat("the fake kubelet cannot serve ", kubelet_socket()));
  }
  if (!options_.pod_resources_socket.empty()) {
    std::filesystem::create_directories(std::filesystem::path(options_.pod_resources_socket).parent_path(), ec);
    RemoveSocket(options_.pod_resources_socket);
    pod_resources_service_ = std::make_unique<PodResourcesService>(this);
    grpc::ServerBuilder pr;
    pr.AddListeningPort("unix:" + options_.pod_resources_socket, grpc::InsecureServerCredentials());
    pr.RegisterService(pod_resources_service_.get());
    pod_resources_server_ = pr.BuildAndStart();
    if (pod_resources_server_ == nullptr) {
      return absl::UnavailableError(StrCat("the fake kubelet cannot serve ", options_.pod_resources_socket));
    }
  }
  std::lock_guard<std::mutex> l(mu_);
  serving_ = true;
  return absl::OkStatus();
}

void FakeKubelet::Stop() {
  std::lock_guard<std::mutex> lock(server_mu_);
  const auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(200);
  if (registration_server_ != nullptr) {
    registration_server_->Shutdown(deadline);
    registration_server_->Wait();
    registration_server_.reset();
  }
  if (pod_resources_server_ != nullptr) {
    pod_resources_server_->Shutdown(deadline);
    pod_resources_server_->Wait();
    pod_resources_server_.reset();
  }
  std::vector<std::unique_ptr<Follower>> followers;
  {
    std::lock_guard<std::mutex> l(mu_);
    followers.swap(followers_);
    serving_ = false;
  }
  for (auto& f : followers) {
    f->ctx.TryCancel();
    f->thread.join();
  }
  registration_service_.reset();
  pod_resources_service_.reset();
  RemoveSocket(kubelet_socket());
  if (!options_.pod_resources_socket.empty()) RemoveSocket(options_.pod_resources_socket);
}

absl::Status FakeKubelet::Restart() {
  Stop();
  // The kubelet empties its device-plugin directory when it starts; plugins see their socket vanish.
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(options_.plugin_dir, ec)) {
    RemoveSocket(entry.path().string());
  }
  return Serve();
}

std::chrono::steady_clock::time_point FakeKubelet::last_start() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_start_;
}

std::string FakeKubelet::OnRegister(FakeRegistration r) {
  std::string error;
  struct stat st {};
  const std::string endpoint = options_.plugin_dir + "/" + r.endpoint;
  if (r.version != "v1beta1") {
    error = StrCat("requested API version \"", r.version,
                   "\" is not supported by kubelet. Supported versions are [\"v1beta1\"]");
  } else if (!IsExtendedResourceName(r.resource_name)) {
    error = StrCat("the ResourceName \"", r.resource_name, "\" is invalid");
  } else if (r.endpoint.empty() || r.endpoint.find('/') != std::string::npos ||
             lstat(endpoint.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
    error = StrCat("failed to dial device plugin: no socket at ", endpoint);
  }
  r.error = error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    registrations_.push_back(r);
  }
  cv_.notify_all();
  if (error.empty() && options_.follow_plugins) Follow(r);
  return error;
}

void FakeKubelet::Follow(const FakeRegistration& r) {
  auto follower = std::make_unique<Follower>();
  Follower* f = follower.get();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!serving_) return;
    followers_.push_back(std::move(follower));
  }
  const std::string target = "unix:" + options_.plugin_dir + "/" + r.endpoint;
  const std::string resource = r.resource_name;
  f->thread = std::thread([this, f, target, resource] {
    auto stub = ::v1beta1::DevicePlugin::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      ::v1beta1::Empty request;
      ::v1beta1::DevicePluginOptions options;
      if (!stub->GetDevicePluginOptions(&ctx, request, &options).ok()) return;
    }
    ::v1beta1::Empty request;
    auto reader = stub->ListAndWatch(&f->ctx, request);
    ::v1beta1::ListAndWatchResponse response;
    while (reader->Read(&response)) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        devices_[resource] = DevicesOf(response);
      }
      cv_.notify_all();
    }
    reader->Finish();
  });
}

std::vector<FakeRegistration> FakeKubelet::registrations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return registrations_;
}

bool FakeKubelet::WaitForRegistrations(size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] {
    size_t ok = 0;
    for (const FakeRegistration& r : registrations_) ok += r.error.empty() ? 1 : 0;
    return ok >= n;
  });
}

bool FakeKubelet::WaitForRegistrationAttempts(size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return registrations_.size() >= n; });
}

std::vector<FakeDevice> FakeKubelet::Devices(const std::string& resource) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = devices_.find(resource);
  return it == devices_.end() ? std::vector<FakeDevice>{} : it->second;
}

bool FakeKubelet::WaitForDevices(const std::string& resource,
                                 const std::function<bool(const std::vector<FakeDevice>&)>& pred,
                                 std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] {
    auto it = devices_.find(resource);
    return pred(it == devices_.end() ? std::vector<FakeDevice>{} : it->second);
  });
}

void FakeKubelet::SetPodResources(std::vector<PodResources> pods) {
  std::lock_guard<std::mutex> lock(mu_);
  pods_ = std::move(pods);
}

void FakeKubelet::SetAllocatable(AllocatableResources allocatable) {
  std::lock_guard<std::mutex> lock(mu_);
  allocatable_ = std::move(allocatable);
}

absl::StatusOr<std::unique_ptr<FakePluginClient>> FakeKubelet::ConnectPlugin(const std::string& endpoint) const {
  const std::string path = options_.plugin_dir + "/" + endpoint;
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
    return absl::NotFoundError(StrCat("no device plugin socket at ", path));
  }
  auto client = std::unique_ptr<FakePluginClient>(new FakePluginClient());
  client->stub_ = std::make_unique<FakePluginClient::Stub>();
  client->stub_->channel = grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials());
  client->stub_->stub = ::v1beta1::DevicePlugin::NewStub(client->stub_->channel);
  return client;
}

}  // namespace tessera::kubelet

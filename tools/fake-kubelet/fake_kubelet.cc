#include "fake_kubelet.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <cctype>
#include <filesystem>

#include "absl/status/status.h"
#include "common/log.h"
#include "core/strings.h"
#include "deviceplugin-v1beta1-api.grpc.pb.h"
#include "socket_file.h"
#include "wait.h"

namespace tessera::kubelet {

namespace {

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

}  // namespace

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

struct FakeKubelet::Follower {
  grpc::ClientContext options_ctx;  // GetDevicePluginOptions
  grpc::ClientContext ctx;          // ListAndWatch
  std::thread thread;
};

FakeKubelet::FakeKubelet(FakeKubeletOptions options)
    : options_(std::move(options)),
      pod_resources_(options_.pod_resources_socket.empty()
                         ? nullptr
                         : std::make_unique<FakePodResourcesServer>(options_.pod_resources_socket)) {}

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
  MutexLock lock(&server_mu_);
  std::error_code ec;
  std::filesystem::create_directories(options_.plugin_dir, ec);
  if (ec) return absl::InternalError(StrCat("cannot create ", options_.plugin_dir, ": ", ec.message()));
  RemoveSocket(kubelet_socket());
  registration_service_ = std::make_unique<RegistrationService>(this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + kubelet_socket(), grpc::InsecureServerCredentials());
  builder.RegisterService(registration_service_.get());
  {
    // Serving before the servers start: a plugin registers as soon as kubelet.sock appears, and a
    // registration taken before serving_ was set (while the pod-resources server started) was recorded but
    // never followed, its devices never listed. Beside the rest of the suite at load 12-17 on 2 cores,
    // DevicePluginTest.ReRegistersAfterAKubeletRestart failed so in 4 runs of 149, none in 790 since.
    MutexLock l(&mu_);
    last_start_ = std::chrono::steady_clock::now();
    serving_ = true;
  }
  registration_server_ = builder.BuildAndStart();
  absl::Status st = registration_server_ == nullptr
                        ? absl::UnavailableError(StrCat("the fake kubelet cannot serve ", kubelet_socket()))
                        : absl::OkStatus();
  if (st.ok() && pod_resources_ != nullptr) st = pod_resources_->Serve();
  if (!st.ok()) {
    MutexLock l(&mu_);
    serving_ = false;
  }
  return st;
}

void FakeKubelet::Stop() {
  MutexLock lock(&server_mu_);
  const auto grace = std::chrono::milliseconds(200);
  if (registration_server_ != nullptr) {
    registration_server_->Shutdown(std::chrono::system_clock::now() + grace);
    registration_server_->Wait();
    registration_server_.reset();
  }
  if (pod_resources_ != nullptr) pod_resources_->Stop(grace);
  std::vector<std::unique_ptr<Follower>> followers;
  {
    MutexLock l(&mu_);
    followers.swap(followers_);
    serving_ = false;
  }
  for (auto& f : followers) {
    f->options_ctx.TryCancel();
    f->ctx.TryCancel();
    f->thread.join();
  }
  registration_service_.reset();
  RemoveSocket(kubelet_socket());
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
  MutexLock lock(&mu_);
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
    MutexLock lock(&mu_);
    registrations_.push_back(r);
  }
  cv_.SignalAll();
  if (error.empty() && options_.follow_plugins) Follow(r);
  return error;
}

void FakeKubelet::Follow(const FakeRegistration& r) {
  auto follower = std::make_unique<Follower>();
  Follower* f = follower.get();
  {
    MutexLock lock(&mu_);
    if (!serving_) return;
    followers_.push_back(std::move(follower));
  }
  const std::string target = "unix:" + options_.plugin_dir + "/" + r.endpoint;
  const std::string resource = r.resource_name;
  f->thread = std::thread([this, f, target, resource] {
    auto stub =
        ::v1beta1::DevicePlugin::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
    {
      // The kubelet waits for the connection to a plugin that just registered (grpc.WithBlock in its dial,
      // pkg/kubelet/cm/devicemanager/plugin/v1beta1/client.go, v1.37.2) instead of failing at once while the
      // plugin's socket is being re-created. The deadline only guards against a plugin that never answers
      // (generous: a loaded machine is slow, not broken), and Stop() cancels the call.
      f->options_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      f->options_ctx.set_wait_for_ready(true);
      ::v1beta1::Empty request;
      ::v1beta1::DevicePluginOptions options;
      if (const grpc::Status st = stub->GetDevicePluginOptions(&f->options_ctx, request, &options);
          !st.ok()) {
        if (st.error_code() != grpc::StatusCode::CANCELLED) {
          log::Warn("fake kubelet: GetDevicePluginOptions failed; the plugin's devices are not followed",
                    {{"target", target}, {"error", st.error_message()}});
        }
        return;
      }
    }
    ::v1beta1::Empty request;
    auto reader = stub->ListAndWatch(&f->ctx, request);
    ::v1beta1::ListAndWatchResponse response;
    while (reader->Read(&response)) {
      {
        MutexLock lock(&mu_);
        devices_[resource] = DevicesOf(response);
      }
      cv_.SignalAll();
    }
    reader->Finish();
  });
}

std::vector<FakeRegistration> FakeKubelet::registrations() const {
  MutexLock lock(&mu_);
  return registrations_;
}

bool FakeKubelet::WaitForRegistrations(size_t n, std::chrono::milliseconds timeout) const {
  MutexLock lock(&mu_);
  return WaitFor(&mu_, &cv_, timeout, [&] {
    mu_.AssertHeld();
    size_t ok = 0;
    for (const FakeRegistration& r : registrations_) ok += r.error.empty() ? 1 : 0;
    return ok >= n;
  });
}

bool FakeKubelet::WaitForRegistrationAttempts(size_t n, std::chrono::milliseconds timeout) const {
  MutexLock lock(&mu_);
  return WaitFor(&mu_, &cv_, timeout, [&] {
    mu_.AssertHeld();
    return registrations_.size() >= n;
  });
}

std::vector<FakeDevice> FakeKubelet::Devices(const std::string& resource) const {
  MutexLock lock(&mu_);
  auto it = devices_.find(resource);
  return it == devices_.end() ? std::vector<FakeDevice>{} : it->second;
}

bool FakeKubelet::WaitForDevices(const std::string& resource,
                                 const std::function<bool(const std::vector<FakeDevice>&)>& pred,
                                 std::chrono::milliseconds timeout) const {
  MutexLock lock(&mu_);
  return WaitFor(&mu_, &cv_, timeout, [&] {
    mu_.AssertHeld();
    auto it = devices_.find(resource);
    return pred(it == devices_.end() ? std::vector<FakeDevice>{} : it->second);
  });
}

void FakeKubelet::SetPodResources(std::vector<PodResources> pods) {
  if (pod_resources_ != nullptr) pod_resources_->SetPodResources(std::move(pods));
}

void FakeKubelet::SetAllocatable(AllocatableResources allocatable) {
  if (pod_resources_ != nullptr) pod_resources_->SetAllocatable(std::move(allocatable));
}

absl::StatusOr<std::unique_ptr<FakePluginClient>> FakeKubelet::ConnectPlugin(
    const std::string& endpoint) const {
  const std::string path = options_.plugin_dir + "/" + endpoint;
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
    return absl::NotFoundError(StrCat("no device plugin socket at ", path));
  }
  return FakePluginClient::Connect(path);
}

}  // namespace tessera::kubelet

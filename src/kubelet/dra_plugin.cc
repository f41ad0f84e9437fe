#include "kubelet/dra_plugin.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "common/exposition.h"
#include "common/log.h"
#include "core/strings.h"
#include "dra-v1-api.grpc.pb.h"
#include "pluginregistration-v1-api.grpc.pb.h"

namespace tessera::kubelet {

namespace fs = std::filesystem;
namespace drapb = ::k8s::io::kubelet::pkg::apis::dra::v1;

namespace {

// The kubelet's plugin watcher only looks at sockets in the registry directory; the file name is the
// plugin's own choice (the NVIDIA and example drivers use <driver>-reg.sock).
std::string RegistrationPath(const DraPluginConfig& c) {
  return (fs::path(c.registry_dir) / (c.driver + "-reg.sock")).string();
}
std::string ServicePath(const DraPluginConfig& c) {
  return (fs::path(c.plugins_dir) / c.driver / "dra.sock").string();
}

unsigned long InodeOf(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return 0;
  return st.st_ino;
}

absl::Status PrepareSocketPath(const std::string& path) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) return absl::UnavailableError(StrCat("cannot create ", fs::path(path).parent_path().string(), ": ", ec.message()));
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(StrCat(path, " exists and is not a socket; remove it"));
    }
    unlink(path.c_str());  // stale, from an earlier run
  }
  return absl::OkStatus();
}

}  // namespace

class DraPlugin::DraService final : public drapb::DRAPlugin::Service {
 public:
  explicit DraService(DraPlugin* p) : p_(p) {}

  grpc::Status NodePrepareResources(grpc::ServerContext*, const drapb::NodePrepareResourcesRequest* request,
                                    drapb::NodePrepareResourcesResponse* response) override {
    for (const drapb::Claim& c : request->claims()) {
      drapb::NodePrepareResourceResponse& out = (*response->mutable_claims())[c.uid()];
      absl::StatusOr<std::vector<DraPreparedDevice>> devices = p_->backend_->Prepare({c.namespace_(), c.uid(), c.name()});
      MutexLock lock(&p_->mu_);
      if (!devices.ok()) {
        ++p_->stats_.prepare_errors;
        out.set_error(Message(devices.status()));
        log::Warn("cannot prepare a claim", {{"claim", StrCat(c.namespace_(), "/", c.name())},
                                              {"error", Message(devices.status())}});
        continue;
      }
      ++p_->stats_.prepared;
      for (const DraPreparedDevice& d : *devices) {
        drapb::Device* pd = out.add_devices();
        for (const std::string& r : d.requests) pd->add_request_names(r);
        pd->set_pool_name(d.pool);
        pd->set_device_name(d.device);
        for (const std::string& id : d.cdi_device_ids) pd->add_cdi_device_ids(id);
        if (!d.share_id.empty()) pd->set_share_id(d.share_id);
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status NodeUnprepareResources(grpc::ServerContext*, const drapb::NodeUnprepareResourcesRequest* request,
                                      drapb::NodeUnprepareResourcesResponse* response) override {
    for (const drapb::Claim& c : request->claims()) {
      drapb::NodeUnprepareResourceResponse& out = (*response->mutable_claims())[c.uid()];
      absl::Status s = p_->backend_->Unprepare({c.namespace_(), c.uid(), c.name()});
      MutexLock lock(&p_->mu_);
      if (!s.ok()) {
        ++p_->stats_.unprepare_errors;
        out.set_error(Message(s));
        continue;
      }
      ++p_->stats_.unprepared;
    }
    return grpc::Status::OK;
  }

 private:
  DraPlugin* const p_;
};

class DraPlugin::RegistrationService final : public ::pluginregistration::Registration::Service {
 public:
  explicit RegistrationService(DraPlugin* p) : p_(p) {}

  grpc::Status GetInfo(grpc::ServerContext*, const ::pluginregistration::InfoRequest*,
                       ::pluginregistration::PluginInfo* info) override {
    info->set_type("DRAPlugin");  // pluginregistration/v1 constants.go
    info->set_name(p_->config_.driver);
    info->set_endpoint(ServicePath(p_->config_));
    info->add_supported_versions(kDraPluginServiceV1);
    return grpc::Status::OK;
  }

  grpc::Status NotifyRegistrationStatus(grpc::ServerContext*, const ::pluginregistration::RegistrationStatus* status,
                                        ::pluginregistration::RegistrationStatusResponse*) override {
    MutexLock lock(&p_->mu_);
    if (status->plugin_registered()) {
      ++p_->stats_.registrations;
      p_->stats_.last_registration_error.clear();
      log::Info("registered with the kubelet as a DRA driver", {{"driver", p_->config_.driver}});
    } else {
      p_->stats_.last_registration_error = status->error();
      log::Error("the kubelet refused the DRA driver's registration",
                 {{"driver", p_->config_.driver}, {"error", status->error()}});
    }
    return grpc::Status::OK;
  }

 private:
  DraPlugin* const p_;
};

struct DraPlugin::Server {
  std::unique_ptr<DraService> dra;
  std::unique_ptr<RegistrationService> registration;
  std::unique_ptr<grpc::Server> dra_server;
  std::unique_ptr<grpc::Server> registration_server;
};

absl::StatusOr<std::unique_ptr<DraPlugin>> DraPlugin::Create(DraPluginConfig config, DraBackend* backend) {
  if (backend == nullptr) return absl::InvalidArgumentError("the DRA plugin needs a backend");
  if (config.driver.empty() || config.driver.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(StrCat("DRA driver name \"", config.driver, "\" must be a DNS subdomain"));
  }
  return std::unique_ptr<DraPlugin>(new DraPlugin(std::move(config), backend));
}

DraPlugin::DraPlugin(DraPluginConfig config, DraBackend* backend)
    : config_(std::move(config)), backend_(backend) {}

DraPlugin::~DraPlugin() { Stop(); }

std::string DraPlugin::service_socket() const { return ServicePath(config_); }
std::string DraPlugin::registration_socket() const { return RegistrationPath(config_); }

bool DraPlugin::registered() const {
  MutexLock lock(&mu_);
  return stats_.registrations > 0 && stats_.last_registration_error.empty();
}

DraPluginStats DraPlugin::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

std::string DraPlugin::MetricsText() const {
  const DraPluginStats s = stats();
  std::string out;
  exposition::AppendFamily(&out, "tessera_dra_registered",
                           "1 when the kubelet has registered the DRA driver (NotifyRegistrationStatus).", "gauge",
                           StrCat("tessera_dra_registered ", registered() ? 1 : 0, "\n"));
  struct Counter {
    const char* name;
    const char* help;
    uint64_t value;
  };
  const Counter counters[] = {
      {"tessera_dra_claims_prepared_total", "Claims the kubelet asked to prepare, prepared.", s.prepared},
      {"tessera_dra_prepare_errors_total", "Claims the driver could not prepare (the error is in the pod's events).",
       s.prepare_errors},
      {"tessera_dra_claims_unprepared_total", "Claims unprepared.", s.unprepared},
      {"tessera_dra_unprepare_errors_total", "Claims the driver could not unprepare.", s.unprepare_errors}};
  for (const Counter& c : counters) {
    exposition::AppendFamily(&out, c.name, c.help, "counter", StrCat(c.name, " ", c.value, "\n"));
  }
  return out;
}

absl::Status DraPlugin::StartServer() {
  const std::string service = ServicePath(config_);
  const std::string registration = RegistrationPath(config_);
  if (absl::Status s = PrepareSocketPath(service); !s.ok()) return s;
  if (absl::Status s = PrepareSocketPath(registration); !s.ok()) return s;
  auto server = std::make_unique<Server>();
  server->dra = std::make_unique<DraService>(this);
  server->registration = std::make_unique<RegistrationService>(this);
  // The service first: the kubelet connects to it as soon as it has read GetInfo.
  grpc::ServerBuilder dra;
  dra.AddListeningPort("unix:" + service, grpc::InsecureServerCredentials());
  dra.RegisterService(server->dra.get());
  server->dra_server = dra.BuildAndStart();
  if (server->dra_server == nullptr) {
    return absl::UnavailableError(StrCat("cannot serve the DRA plugin on ", service,
                                         "; check that tessera-node may write to ", config_.plugins_dir));
  }
  grpc::ServerBuilder reg;
  reg.AddListeningPort("unix:" + registration, grpc::InsecureServerCredentials());
  reg.RegisterService(server->registration.get());
  server->registration_server = reg.BuildAndStart();
  if (server->registration_server == nullptr) {
    server->dra_server->Shutdown();
    return absl::UnavailableError(StrCat("cannot serve the DRA plugin's registration on ", registration,
                                         "; check that tessera-node may write to ", config_.registry_dir));
  }
  MutexLock lock(&mu_);
  service_inode_ = InodeOf(service);
  registration_inode_ = InodeOf(registration);
  server_ = std::move(server);
  ++stats_.server_starts;
  return absl::OkStatus();
}

void DraPlugin::StopServer() {
  std::unique_ptr<Server> server;
  {
    MutexLock lock(&mu_);
    server = std::move(server_);
  }
  if (!server) return;
  // The registration first, so that the kubelet's watcher sees the plugin go before its service does.
  server->registration_server->Shutdown();
  server->dra_server->Shutdown();
  const std::string registration = RegistrationPath(config_);
  const std::string service = ServicePath(config_);
  MutexLock lock(&mu_);
  if (InodeOf(registration) == registration_inode_) unlink(registration.c_str());
  if (InodeOf(service) == service_inode_) unlink(service.c_str());
}

bool DraPlugin::SocketsIntact() const {
  MutexLock lock(&mu_);
  return InodeOf(RegistrationPath(config_)) == registration_inode_ && registration_inode_ != 0 &&
         InodeOf(ServicePath(config_)) == service_inode_ && service_inode_ != 0;
}

absl::Status DraPlugin::Start() {
  if (absl::Status s = StartServer(); !s.ok()) return s;
  watcher_ = std::thread([this] { Watch(); });
  log::Info("DRA plugin serving", {{"driver", config_.driver},
                                   {"socket", ServicePath(config_)},
                                   {"registration", RegistrationPath(config_)}});
  return absl::OkStatus();
}

void DraPlugin::Watch() {
  while (true) {
    {
      MutexLock lock(&mu_);
      if (!stopping_) cv_.WaitFor(&mu_, config_.watch_period);
      if (stopping_) return;
    }
    if (!SocketsIntact()) {
      log::Warn("a DRA plugin socket disappeared; serving it again", {{"driver", config_.driver}});
      StopServer();
      if (absl::Status s = StartServer(); !s.ok()) {
        log::Error("cannot serve the DRA plugin again; will retry", {{"error", Message(s)}});
      }
    }
  }
}

void DraPlugin::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.SignalAll();
  if (watcher_.joinable()) watcher_.join();
  StopServer();
}

}  // namespace tessera::kubelet

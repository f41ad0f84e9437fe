#include "node/agent.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "common/log.h"
#include "core/strings.h"
#include "formats/assignment.h"

namespace tessera::node {

namespace fs = std::filesystem;

NodeAgent::NodeAgent(NodeAgentConfig config, NodeApi* api, formats::GpuInventory inventory,
                     kubelet::PodResourcesClient* pod_resources)
    : config_(std::move(config)),
      records_((std::filesystem::path(config_.state_dir) / "records").string()),
      api_(api),
      pod_resources_(pod_resources),
      inventory_(std::move(inventory)),
      pods_(std::make_shared<std::vector<NodePod>>()) {
  registration_ = std::make_unique<RegistrationServer>(
      registration_socket(),
      RegistrationServer::Handlers{[this](int pid, const hook::Hello& h) { return OnHello(pid, h); },
                                   [this](int pid, const std::string& tenant) { OnGone(pid, tenant); },
                                   [this](int pid) { return PeerOf(pid); }},
      config_.registration, *config_.clock);
}

std::chrono::system_clock::time_point NodeAgent::WallNow() const {
  return config_.clock->Now();
}

std::chrono::steady_clock::time_point NodeAgent::SteadyNow() const {
  return config_.clock->Steady();
}

NodeAgent::~NodeAgent() {
  Stop();
}

std::string NodeAgent::registration_socket() const {
  return config_.state_dir + "/sock/agent.sock";
}

absl::Status NodeAgent::Start(bool background) {
  std::error_code ec;
  for (const char* sub : {"containers", "regions", "records", "sock", "lib"}) {
    fs::create_directories(fs::path(config_.state_dir) / sub, ec);
    if (ec) {
      return absl::InternalError(StrCat("cannot create ", config_.state_dir, "/", sub, ": ", ec.message(),
                                        "; check --state-dir and that the agent runs as root"));
    }
  }
  // /etc/ld.so.preload for the containers: the hook libraries present in the hook directory.
  const std::string hook_dir = config_.hook_dir.empty() ? config_.state_dir + "/lib" : config_.hook_dir;
  std::string preload;
  for (const char* lib : {"libtessera-cuda.so", "libtessera-opencl.so"}) {
    if (fs::exists(fs::path(hook_dir) / lib)) preload += StrCat(kContainerHookDir, "/", lib, "\n");
  }
  {
    const std::string path = config_.state_dir + "/ld.so.preload";
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp, std::ios::trunc) << preload;
    fs::rename(tmp, path, ec);
  }
  if (preload.empty()) {
    log::Warn("no hook library in the hook directory: containers get limits files but no enforcement",
              {{"dir", hook_dir}});
  }
  LoadRecords();
  if (absl::Status s = registration_->Start(); !s.ok()) return s;
  if (absl::Status s = RefreshPods(); !s.ok()) {
    log::Warn("cannot list this node's pods yet; will retry", {{"error", Message(s)}});
  }
  if (background) {
    MutexLock lock(&loop_mu_);
    stopping_ = false;
    thread_ = std::thread([this] { Loop(); });
  }
  return absl::OkStatus();
}

void NodeAgent::Stop() {
  {
    MutexLock lock(&loop_mu_);
    stopping_ = true;
  }
  loop_cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
  if (registration_) registration_->Stop();
}

void NodeAgent::Nudge() {
  {
    MutexLock lock(&loop_mu_);
    nudged_ = true;
  }
  loop_cv_.SignalAll();
}

void NodeAgent::Loop() {
  auto next_heartbeat = SteadyNow();
  while (true) {
    const auto now = SteadyNow();
    if (now >= next_heartbeat) {
      if (absl::Status s = PublishInventory(); !s.ok()) {
        log::Warn("cannot publish the node's inventory", {{"error", Message(s)}});
      }
      next_heartbeat = now + config_.heartbeat;
    }
    if (absl::Status s = ReconcileOnce(); !s.ok()) log::Warn("reconcile failed", {{"error", Message(s)}});
    const auto wait = std::min<std::chrono::milliseconds>(
        config_.resync, std::chrono::duration_cast<std::chrono::milliseconds>(next_heartbeat - SteadyNow()) +
                            std::chrono::milliseconds(1));
    MutexLock lock(&loop_mu_);
    const auto until = std::chrono::steady_clock::now() + wait;  // a real wait, whatever the clock seam says
    while (!stopping_ && !nudged_) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      loop_cv_.WaitFor(&loop_mu_, left);
    }
    if (stopping_) return;
    nudged_ = false;
  }
}

// --- pods ------------------------------------------------------------------------------------------------

std::shared_ptr<const std::vector<NodePod>> NodeAgent::Pods() const {
  MutexLock lock(&mu_);
  return pods_;
}

absl::Status NodeAgent::RefreshPods() {
  absl::StatusOr<std::vector<NodePod>> pods = api_->ListNodePods();
  if (!pods.ok()) {
    MutexLock lock(&mu_);
    ++stats_.api_errors;
    return pods.status();
  }
  auto snapshot = std::make_shared<const std::vector<NodePod>>(std::move(*pods));
  MutexLock lock(&mu_);
  pods_ = std::move(snapshot);
  return absl::OkStatus();
}

void NodeAgent::Event(const NodePod& pod, const std::string& type, const std::string& reason,
                      const std::string& message) {
  NodeEvent e;
  e.ns = pod.ns;
  e.pod_name = pod.name;
  e.pod_uid = pod.uid;
  e.type = type;
  e.reason = reason;
  e.message = message;
  if (absl::Status s = api_->PostEvent(e); !s.ok()) {
    log::Warn("cannot post an event", {{"pod", pod.key()}, {"reason", reason}, {"error", Message(s)}});
  }
  if (type == "Warning") log::Warn(message, {{"pod", pod.key()}, {"reason", reason}});
}

// --- inventory, health, state --------------------------------------------------------------------------

absl::Status NodeAgent::PublishInventory() {
  std::string inventory;
  {
    MutexLock lock(&mu_);
    inventory = formats::SerializeGpuInventory(inventory_);
  }
  return api_->PatchNodeAnnotations({{formats::kGpuInventoryAnnotation, inventory},
                                     {formats::kHeartbeatAnnotation, formats::FormatHeartbeat(WallNow())}});
}

void NodeAgent::SetGpuHealth(const core::GpuUuid& uuid, bool healthy, const std::string& reason) {
  {
    MutexLock lock(&mu_);
    for (formats::InventoryGpu& g : inventory_.gpus) {
      if (g.info.uuid != uuid) continue;
      g.info.health = healthy ? core::GpuHealth::kHealthy : core::GpuHealth::kUnhealthy;
      g.health_reason = healthy ? "" : reason;
    }
  }
  if (absl::Status s = PublishInventory(); !s.ok())
    log::Warn("cannot publish GPU health", {{"error", Message(s)}});
}

std::vector<ContainerRecord> NodeAgent::Records() const {
  MutexLock lock(&mu_);
  std::vector<ContainerRecord> out;
  for (const auto& [key, t] : tenants_) out.push_back(t.record);
  return out;
}

std::optional<std::set<std::string>> NodeAgent::ListedPodUids() const {
  std::shared_ptr<const std::vector<NodePod>> pods = Pods();
  if (pods == nullptr) return std::nullopt;
  std::set<std::string> uids;
  for (const NodePod& p : *pods) uids.insert(p.uid);
  return uids;
}

std::vector<int> NodeAgent::TenantPids(const std::string& pod_uid, const std::string& container) const {
  return registration_->Pids(pod_uid + "/" + container);
}

AgentStats NodeAgent::stats() const {
  MutexLock lock(&mu_);
  AgentStats out = stats_;
  out.regions_unreadable = regions_unreadable_.load();
  return out;
}

}  // namespace tessera::node

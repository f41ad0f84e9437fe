#include "node/agent.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "common/files.h"
#include "common/log.h"
#include "core/request_parser.h"
#include "core/strings.h"
#include "formats/assignment.h"
#include "formats/bounded_json.h"
#include "node/cgroup.h"

namespace tessera::node {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A record is a few hundred bytes; anything far larger in the records directory is not one.
constexpr size_t kMaxRecordBytes = size_t{1} << 20;

uint64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Opens (or creates) a region; the returned pointer unmaps it when its last holder (the agent or a region
// job) lets go.
std::shared_ptr<hook::SharedRegion> OpenRegion(const std::string& path, hook::Error* error) {
  auto region = std::make_unique<hook::SharedRegion>();
  if (!region->Open(path.c_str(), error)) return nullptr;
  return std::shared_ptr<hook::SharedRegion>(region.release(), [](hook::SharedRegion* r) {
    r->Close();
    delete r;
  });
}

// A region job: gives the region the record's limits (adding GPU entries takes the region's table lock)
// and/or reclaims dead processes' slots (takes GPU locks). Returns the slots freed.
int RegionWork(hook::SharedRegion& region, const std::optional<hook::Limits>& limits, bool reclaim) {
  if (limits) {
    hook::Error error;
    for (int i = 0; i < limits->device_count; ++i) {
      const int dev = region.FindOrAddDevice(limits->devices[i].uuid, &error);
      if (dev >= 0) region.SetDeviceLimits(dev, limits->devices[i], MonotonicNs());
    }
  }
  return reclaim ? region.ReclaimDeadSlots() : 0;
}

// Whether `name` (a pod UID, a container name) can be one component of a path under the state directory:
// 1-253 characters of [A-Za-z0-9._-], not "." or "..". Kubernetes UIDs and container names always are; an
// edited annotation or API file may not be.
bool SafePathName(std::string_view name) {
  if (name.empty() || name.size() > 253 || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_';
  });
}

// Reclaims that freed nothing are retried at the next passes (the process may still be a zombie), this many
// times.
constexpr int kReclaimAttempts = 10;

// A container directory without a record and without a pod is an orphan (a crash cut its allocation short)
// only when it is older than this; a younger one may belong to an Allocate in flight.
constexpr auto kOrphanAge = std::chrono::minutes(2);

std::string Annotation(const NodePod& pod, const std::string& key) {
  auto it = pod.annotations.find(key);
  return it == pod.annotations.end() ? std::string() : it->second;
}

std::string RecordFileName(const ContainerRecord& r) {
  return StrCat(r.pod_uid, "_", r.container, ".json");
}

json ToJson(const ContainerRecord& r) {
  json vgpus = json::array();
  for (const core::VGpuAssignment& v : r.vgpus) {
    vgpus.push_back({{"uuid", v.uuid.value()},
                     {"index", v.gpu_index},
                     {"milliCores", v.cores.value()},
                     {"memoryMiB", v.memory.value()},
                     {"requestedMilliCores", v.requested.value()}});
  }
  return {{"version", 1},
          {"podUID", r.pod_uid},
          {"namespace", r.ns},
          {"pod", r.pod_name},
          {"container", r.container},
          {"vgpus", vgpus},
          {"numaNode", r.numa_node},
          {"cpus", r.cpus},
          {"deviceIDs", r.device_ids},
          {"generation", r.generation},
          {"dir", r.dir},
          {"regionDir", r.region_dir},
          {"computePolicy", r.compute_policy},
          {"priority", r.priority},
          {"allocatedAt", r.allocated_at},
          {"reported", r.reported},
          {"confirmed", r.confirmed}};
}

absl::StatusOr<ContainerRecord> FromJson(const json& j) {
  try {
    if (j.at("version").get<int>() != 1) return absl::InvalidArgumentError("unknown record version");
    ContainerRecord r;
    r.pod_uid = j.at("podUID").get<std::string>();
    r.ns = j.at("namespace").get<std::string>();
    r.pod_name = j.at("pod").get<std::string>();
    r.container = j.at("container").get<std::string>();
    for (const json& v : j.at("vgpus")) {
      core::VGpuAssignment a;
      a.uuid = core::GpuUuid(v.at("uuid").get<std::string>());
      a.gpu_index = v.at("index").get<int>();
      a.cores = core::MilliGpu(v.at("milliCores").get<int32_t>());
      a.memory = core::MiB(v.at("memoryMiB").get<int64_t>());
      a.requested = core::MilliGpu(v.value("requestedMilliCores", 0));
      r.vgpus.push_back(a);
    }
    r.numa_node = j.value("numaNode", -1);
    r.cpus = j.value("cpus", "");
    r.device_ids = j.at("deviceIDs").get<std::vector<std::string>>();
    r.generation = j.at("generation").get<uint64_t>();
    r.dir = j.at("dir").get<std::string>();
    r.region_dir = j.at("regionDir").get<std::string>();
    r.compute_policy = j.value("computePolicy", "hard");
    r.priority = j.value("priority", "low");
    r.allocated_at = j.value("allocatedAt", "");
    r.reported = j.value("reported", false);
    r.confirmed = j.value("confirmed", false);
    return r;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
}

// The request signature of a container's assignment (count, shares, memory) plus the pod's constraints: two
// containers with equal signatures may trade their allocations without breaking any promise.
std::string Signature(const std::vector<core::VGpuAssignment>& vgpus, const std::string& policy,
                      const std::string& priority) {
  std::vector<std::string> parts;
  for (const core::VGpuAssignment& v : vgpus)
    parts.push_back(StrCat(v.requested_or_cores().value(), ":", v.memory.value()));
  std::sort(parts.begin(), parts.end());
  return StrCat(vgpus.size(), "|", StrJoin(parts, ","), "|", policy, "|", priority);
}

bool SameGpus(const std::vector<core::VGpuAssignment>& a, const std::vector<core::VGpuAssignment>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].uuid != b[i].uuid) return false;
  }
  return true;
}

bool SameLimits(const std::vector<core::VGpuAssignment>& a, const std::vector<core::VGpuAssignment>& b) {
  if (!SameGpus(a, b)) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].cores != b[i].cores || a[i].memory != b[i].memory) return false;
  }
  return true;
}

std::string EscapeLabel(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

struct NodeAgent::Candidate {
  std::string sort_key;
  const NodePod* pod = nullptr;
  const core::ContainerAssignment* container = nullptr;
};

hook::Limits LimitsFor(const ContainerRecord& r) {
  hook::Limits l;
  l.generation = r.generation;
  hook::CopyString(l.region_path, sizeof(l.region_path), kContainerRegionFile);
  for (const core::VGpuAssignment& v : r.vgpus) {
    if (l.device_count >= hook::kMaxDevices) break;
    hook::DeviceLimits& d = l.devices[l.device_count++];
    hook::CopyString(d.uuid, sizeof(d.uuid), v.uuid.value().c_str());
    d.index = hook::kByUuid;
    d.memory_bytes = static_cast<uint64_t>(v.memory.value()) << 20;
    const int percent = static_cast<int>(std::lround(v.cores.value() / 10.0));
    d.cores_percent = static_cast<uint32_t>(std::clamp(percent, 1, 100));
    d.policy = r.compute_policy == "elastic" ? hook::ComputePolicy::kElastic : hook::ComputePolicy::kHard;
    d.ceiling_percent = std::max<uint32_t>(hook::kDefaultCeilingPercent, d.cores_percent);
    d.priority = r.priority == "high" ? hook::Priority::kHigh : hook::Priority::kLow;
  }
  return l;
}

NodeAgent::NodeAgent(NodeAgentConfig config, NodeApi* api, formats::GpuInventory inventory,
                     kubelet::PodResourcesClient* pod_resources)
    : config_(std::move(config)),
      api_(api),
      pod_resources_(pod_resources),
      inventory_(std::move(inventory)),
      pods_(std::make_shared<std::vector<NodePod>>()),
      region_jobs_(config_.region_lock_timeout, config_.clock) {
  registration_ = std::make_unique<RegistrationServer>(
      registration_socket(),
      RegistrationServer::Handlers{[this](int pid, const hook::Hello& h) { return OnHello(pid, h); },
                                   [this](int pid, const std::string& tenant) { OnGone(pid, tenant); }},
      config_.registration);
}

std::chrono::system_clock::time_point NodeAgent::WallNow() const {
  return config_.clock != nullptr ? config_.clock->Now() : std::chrono::system_clock::now();
}

std::chrono::steady_clock::time_point NodeAgent::SteadyNow() const {
  return config_.clock != nullptr ? config_.clock->Steady() : std::chrono::steady_clock::now();
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
  MutexLock lock(&mu_);
  for (auto& [key, t] : tenants_) t.region.reset();  // unmapped now, or when a running job ends
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

// --- records ---------------------------------------------------------------------------------------------

absl::Status NodeAgent::SaveRecord(const ContainerRecord& r) const {
  const fs::path path = fs::path(config_.state_dir) / "records" / RecordFileName(r);
  const std::string tmp = StrCat(path.string(), ".tmp.", gettid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << formats::DumpJson(ToJson(r)) << "\n";
    out.flush();
    if (!out) return absl::InternalError(StrCat("cannot write ", tmp, "; is ", config_.state_dir, " full?"));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return absl::InternalError(StrCat("cannot rename ", tmp, ": ", ec.message()));
  return absl::OkStatus();
}

void NodeAgent::LoadRecords() {
  std::error_code ec;
  std::map<std::string, Tenant> loaded;
  for (const auto& entry : fs::directory_iterator(fs::path(config_.state_dir) / "records", ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".json") {
      if (name.find(".tmp.") != std::string::npos) fs::remove(entry.path(), ec);  // a write cut short
      continue;
    }
    absl::StatusOr<std::string> text = ReadTextFile(entry.path().string(), kMaxRecordBytes);
    absl::StatusOr<json> j = text.ok() ? formats::ParseBoundedJson(*text, "the record") : text.status();
    absl::StatusOr<ContainerRecord> r = j.ok() ? FromJson(*j) : j.status();
    if (!r.ok()) {
      log::Error("unreadable record; moved aside",
                 {{"file", entry.path().string()}, {"error", Message(r.status())}});
      fs::rename(entry.path(), entry.path().string() + ".bad", ec);
      continue;
    }
    Tenant t;
    t.record = std::move(*r);
    // The limits file and region stay as they were; make sure they exist (a crash may have cut the first
    // write short).
    if (!fs::exists(fs::path(t.record.dir) / "limits")) {
      if (absl::Status s = WriteLimits(t.record); !s.ok())
        log::Error("cannot rewrite limits", {{"error", Message(s)}});
    }
    hook::Error error;
    t.region = OpenRegion((fs::path(t.record.region_dir) / "region").string(), &error);
    if (!t.region) {
      log::Error("cannot open a tenant's region", {{"tenant", t.record.key()}, {"error", error.text}});
    }
    loaded[t.record.key()] = std::move(t);
  }
  MutexLock lock(&mu_);
  for (auto& [key, t] : loaded) tenants_[key] = std::move(t);
  if (!loaded.empty()) log::Info("records loaded", {{"containers", StrCat(loaded.size())}});
}

absl::Status NodeAgent::WriteLimits(const ContainerRecord& r) const {
  hook::Limits limits = LimitsFor(r);
  hook::Error error;
  if (!hook::ValidateLimits(limits, &error)) {
    return absl::InvalidArgumentError(StrCat("limits of ", r.key(), " are invalid: ", error.text));
  }
  const std::string path = (fs::path(r.dir) / "limits").string();
  // Not fsynced: atomic rename is what readers need. The page cache outlives a crash of the agent; a crash of
  // the machine takes the containers with it, and the kubelet allocates again. Waiting for the disk was most
  // of Allocate's time.
  if (!hook::WriteLimitsFile(path.c_str(), limits, &error, /*durable=*/false)) {
    return absl::InternalError(StrCat("cannot write ", path, ": ", error.text));
  }
  return absl::OkStatus();
}

void NodeAgent::RunFileOps(const std::vector<FileOp>& ops) {
  int failed = 0;
  for (const FileOp& op : ops) {
    if (!op.remove.empty()) {
      std::error_code ec;
      fs::remove(op.remove, ec);
      if (ec) {
        ++failed;
        log::Error("cannot remove a record", {{"file", op.remove}, {"error", ec.message()}});
      }
      continue;
    }
    if (absl::Status s = SaveRecord(op.save); !s.ok()) {
      ++failed;
      log::Error("cannot save a record; it is lost if the agent restarts now",
                 {{"tenant", op.save.key()}, {"error", Message(s)}});
    }
  }
  if (failed > 0) {
    MutexLock lock(&mu_);
    stats_.record_errors += static_cast<uint64_t>(failed);
  }
}

absl::Status NodeAgent::Materialize(Tenant* t) {
  std::error_code ec;
  // A collected sibling container of the same pod may remove the pod's (empty) directory between the two
  // levels of create_directories: try again then.
  for (const std::string& d : {t->record.dir, t->record.region_dir}) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      fs::create_directories(d, ec);
      if (!ec) break;
    }
    if (ec) return absl::InternalError(StrCat("cannot create ", d, ": ", ec.message()));
  }
  fs::permissions(t->record.region_dir, fs::perms::all,
                  ec);  // container users of any UID create nothing here,
                        // but the hook may re-create a deleted region
  if (absl::Status s = WriteLimits(t->record); !s.ok()) return s;
  // The region itself (half a MiB, initialized and fsynced) is created by the next reconcile pass, off the
  // Allocate path; a hooked process that starts first creates it the same way (SharedRegion::Open publishes
  // a fully initialized file with link(2), so the two cannot clash).
  return SaveRecord(t->record);
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

// --- Allocate --------------------------------------------------------------------------------------------

absl::StatusOr<formats::Assignment> NodeAgent::ParseCached(const std::string& uid, const std::string& text) {
  {
    MutexLock lock(&parse_mu_);
    auto it = parse_cache_.find(uid);
    if (it != parse_cache_.end() && it->second.first == text) return it->second.second;
  }
  absl::StatusOr<formats::Assignment> a = formats::ParseAssignment(text);
  MutexLock lock(&parse_mu_);
  if (parse_cache_.size() > 4096) parse_cache_.clear();
  parse_cache_[uid] = {text, a};
  return a;
}

absl::StatusOr<ContainerRecord> NodeAgent::Claim(const std::vector<std::string>& device_ids,
                                                 const std::vector<NodePod>& pods) {
  const size_t count = device_ids.size();
  // Parse outside the lock; malformed annotations are reported once per pod and value.
  std::vector<std::pair<const NodePod*, formats::Assignment>> parsed;
  for (const NodePod& pod : pods) {
    if (pod.deleting || pod.terminated()) continue;
    const std::string phase = Annotation(pod, formats::kAnnotationPhase);
    if (phase != formats::kPhaseBound && phase != formats::kPhaseAllocated) continue;
    const std::string text = Annotation(pod, formats::kAnnotationAssignment);
    absl::StatusOr<formats::Assignment> a = ParseCached(pod.uid, text);
    std::string problem;
    if (!a.ok()) {
      problem =
          StrCat("cannot read tessera.dev/assignment: ", Message(a.status()),
                 "; the pod gets no GPU until the scheduler rewrites it (delete the pod to reschedule)");
    } else if (a->node.value() != config_.node_name) {
      problem = StrCat("tessera.dev/assignment names node ", a->node.value(), " but the pod is bound to ",
                       config_.node_name, "; delete the pod to reschedule");
    } else if (!SafePathName(pod.uid)) {
      problem = StrCat("the pod's UID \"", pod.uid, "\" cannot name a directory; the pod gets no GPU");
    } else {
      for (const core::ContainerAssignment& c : a->containers) {
        if (!SafePathName(c.name)) {
          problem = StrCat("tessera.dev/assignment names container \"", c.name,
                           "\", which cannot name a directory (a Kubernetes container name is a DNS label); "
                           "delete the pod to reschedule");
        }
      }
    }
    if (!problem.empty()) {
      bool first = false;
      {
        MutexLock lock(&mu_);
        first = reported_problems_.insert(StrCat(pod.uid, "|", text)).second;
      }
      if (first) Event(pod, "Warning", "MalformedAssignment", problem);
      continue;
    }
    parsed.emplace_back(&pod, std::move(*a));
  }
  MutexLock lock(&mu_);
  std::vector<Candidate> candidates;
  for (auto& [pod, a] : parsed) {
    std::string at = Annotation(*pod, formats::kAnnotationAssignedAt);
    if (at.empty()) at = pod->creation_timestamp;
    for (core::ContainerAssignment& c : a.containers) {
      if (c.vgpus.size() != count) continue;
      // The kubelet allocates a container once: an allocated pod's container that it reports holding devices is
      // not what this call is for. (A pod that is still `bound` may be a new pod of the same name as one the
      // kubelet has not forgotten yet, as a StatefulSet's are: pod-resources names pods, not UIDs.)
      if (held_.contains(StrCat(pod->key(), "/", c.name)) &&
          Annotation(*pod, formats::kAnnotationPhase) == formats::kPhaseAllocated) {
        continue;
      }
      // A pod whose allocation went to another container takes that container's part (ReconcilePodResources),
      // unless the scheduler has rewritten its assignment since.
      if (auto ex = exchanges_.find(pod->uid + "/" + c.name); ex != exchanges_.end()) {
        if (ex->second.accepted.contains(Annotation(*pod, formats::kAnnotationAssignment))) {
          if (ex->second.vgpus.size() != count) continue;
          c.vgpus = ex->second.vgpus;
        } else {
          exchanges_.erase(ex);
        }
      }
      candidates.push_back({StrCat(at, "|", pod->creation_timestamp, "|", pod->key()), pod, &c});
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& x, const Candidate& y) { return x.sort_key < y.sort_key; });
  // A device slot is one container's at a time while it is being allocated. Once allocated, the kubelet may
  // name it again for another container (it hands a freed device to the next pod at once, and one slot serves
  // every container of a shared GPU's pods): pod-resources tells their records apart (docs/node-agent.md).
  for (const std::string& id : device_ids) {
    if (devices_in_flight_.count(id) > 0) {
      return absl::AlreadyExistsError(StrCat("device ", id, " is being allocated to another container"));
    }
  }
  for (const Candidate& c : candidates) {
    const std::string key = c.pod->uid + "/" + c.container->name;
    if (tenants_.count(key) > 0 || claims_.count(key) > 0) continue;
    // Every vGPU must be a GPU of this node.
    ContainerRecord r;
    r.pod_uid = c.pod->uid;
    r.ns = c.pod->ns;
    r.pod_name = c.pod->name;
    r.container = c.container->name;
    r.vgpus = c.container->vgpus;
    bool known = true;
    for (core::VGpuAssignment& v : r.vgpus) {
      auto it = std::find_if(inventory_.gpus.begin(), inventory_.gpus.end(),
                             [&](const formats::InventoryGpu& g) { return g.info.uuid == v.uuid; });
      if (it == inventory_.gpus.end()) {
        known = false;
        break;
      }
      v.gpu_index = it->info.index;
    }
    if (!known) continue;
    r.numa_node = c.container->numa_node;
    r.cpus = c.container->cpus;
    r.compute_policy = Annotation(*c.pod, core::kAnnotationComputePolicy) == "elastic" ? "elastic" : "hard";
    r.priority = Annotation(*c.pod, core::kAnnotationPriority) == "high" ? "high" : "low";
    claims_.insert(key);
    devices_in_flight_.insert(device_ids.begin(), device_ids.end());
    return r;
  }
  return absl::NotFoundError("none");
}

absl::StatusOr<kubelet::ContainerAllocation> NodeAgent::AllocateOne(
    const kubelet::AllocateContainerRequest& req) {
  const size_t count = req.devices.size();
  std::vector<std::string> device_ids;
  for (const kubelet::DeviceSlot& d : req.devices) device_ids.push_back(d.id);
  absl::StatusOr<ContainerRecord> claimed = Claim(device_ids, *Pods());
  if (absl::IsAlreadyExists(claimed.status()))
    return absl::FailedPreconditionError(Message(claimed.status()));
  if (!claimed.ok()) {
    // The pod may have been bound a moment ago: look again with a fresh list.
    if (absl::Status s = RefreshPods(); !s.ok()) {
      return absl::UnavailableError(StrCat("cannot list this node's pods from the API server: ", Message(s),
                                           "; the kubelet will retry"));
    }
    claimed = Claim(device_ids, *Pods());
    if (absl::IsAlreadyExists(claimed.status()))
      return absl::FailedPreconditionError(Message(claimed.status()));
  }
  if (!claimed.ok()) {
    return absl::FailedPreconditionError(
        StrCat("no pod bound to node ", config_.node_name,
               " by tessera-scheduler waits for a container with ", count,
               " vGPU(s) (tessera.dev/phase: bound, a readable tessera.dev/assignment); schedule GPU pods "
               "with schedulerName tessera-scheduler or check the pod's events"));
  }
  Tenant t;
  t.record = std::move(*claimed);
  for (const kubelet::DeviceSlot& d : req.devices) t.record.device_ids.push_back(d.id);
  t.record.dir =
      (fs::path(config_.state_dir) / "containers" / t.record.pod_uid / t.record.container).string();
  t.record.region_dir =
      (fs::path(config_.state_dir) / "regions" / t.record.pod_uid / t.record.container).string();
  t.record.allocated_at = formats::FormatHeartbeat(WallNow());
  const std::string key = t.record.key();
  if (absl::Status s = Materialize(&t); !s.ok()) {
    MutexLock lock(&mu_);
    claims_.erase(key);
    for (const std::string& id : device_ids) devices_in_flight_.erase(id);
    return s;
  }
  kubelet::ContainerAllocation response = Response(t.record);
  {
    MutexLock lock(&mu_);
    claims_.erase(key);
    exchanges_.erase(key);
    for (const std::string& id : device_ids) devices_in_flight_.erase(id);
    t.allocation = ++allocations_;
    tenants_[key] = std::move(t);
  }
  return response;
}

kubelet::ContainerAllocation NodeAgent::Response(const ContainerRecord& r) const {
  kubelet::ContainerAllocation a;
  std::vector<std::string> uuids;
  std::vector<int> indices;
  for (const core::VGpuAssignment& v : r.vgpus) {
    uuids.push_back(v.uuid.value());
    indices.push_back(v.gpu_index);
  }
  a.envs["NVIDIA_VISIBLE_DEVICES"] = StrJoin(uuids, ",");
  a.envs["TESSERA_LIMITS_FILE"] = kContainerLimitsFile;
  a.envs["TESSERA_AGENT_SOCKET"] = kContainerSocket;
  a.envs["TESSERA_REGION"] = kContainerRegionFile;
  if (r.numa_node >= 0) {
    a.envs["TESSERA_NUMA_NODE"] = StrCat(r.numa_node);
    a.envs["TESSERA_CPUS"] = r.cpus;
    a.annotations["tessera.dev/cpus"] = r.cpus;
  }
  a.annotations["tessera.dev/pod"] = StrCat(r.ns, "/", r.pod_name);
  a.annotations["tessera.dev/container"] = r.container;
  a.mounts.push_back({kContainerLimitsDir, r.dir, true});
  a.mounts.push_back({kContainerRegionDir, r.region_dir, false});
  a.mounts.push_back({kContainerSocketDir, config_.state_dir + "/sock", true});
  const std::string hook_dir = config_.hook_dir.empty() ? config_.state_dir + "/lib" : config_.hook_dir;
  const std::string preload = config_.state_dir + "/ld.so.preload";
  std::error_code ec;
  if (fs::file_size(preload, ec) > 0 && !ec) {
    a.mounts.push_back({kContainerHookDir, hook_dir, true});
    a.mounts.push_back({"/etc/ld.so.preload", preload, true});
  }
  if (config_.device_nodes) a.devices = kubelet::NvidiaDeviceNodes(indices, config_.dev_root);
  return a;
}

absl::StatusOr<std::vector<kubelet::ContainerAllocation>> NodeAgent::Allocate(
    const kubelet::AllocateRequestView& request) {
  std::vector<kubelet::ContainerAllocation> out;
  for (const kubelet::AllocateContainerRequest& c : request.containers) {
    absl::StatusOr<kubelet::ContainerAllocation> a = AllocateOne(c);
    MutexLock lock(&mu_);
    if (!a.ok()) {
      ++stats_.allocation_errors;
      return a.status();
    }
    ++stats_.allocations;
    out.push_back(std::move(*a));
  }
  Nudge();  // report the phase soon
  return out;
}

absl::Status NodeAgent::PreStartContainer(const kubelet::PreStartRequestView& request) {
  // Every device must belong to a record: the container starts with limits in place.
  MutexLock lock(&mu_);
  for (const kubelet::DeviceSlot& d : request.devices) {
    bool found = false;
    for (const auto& [key, t] : tenants_) {
      if (std::find(t.record.device_ids.begin(), t.record.device_ids.end(), d.id) !=
          t.record.device_ids.end()) {
        found = true;
        break;
      }
    }
    if (!found) {
      return absl::FailedPreconditionError(
          StrCat("device ", d.id, " was not allocated by tessera-node; restart the pod"));
    }
  }
  return absl::OkStatus();
}

// --- reconcile -------------------------------------------------------------------------------------------

absl::Status NodeAgent::ReconcileOnce() {
  MutexLock pass(&reconcile_mu_);
  uint64_t seen = 0;  // tenants allocated after this are not judged against the pod list below
  {
    MutexLock lock(&mu_);
    ++stats_.reconciles;
    seen = allocations_;
  }
  if (absl::Status s = RefreshPods(); !s.ok()) return s;
  std::shared_ptr<const std::vector<NodePod>> pods = Pods();
  SweepRegionJobs();  // jobs started since the last pass (a process exited)
  OpenRegions();
  ReconcilePodResources(*pods);
  ReportPhases(*pods);
  ApplyAssignmentChanges(*pods);
  std::set<std::string> kubelet_pods;
  bool pr_ok = pod_resources_ == nullptr;
  if (pod_resources_ != nullptr) {
    absl::StatusOr<std::vector<kubelet::PodResources>> list = pod_resources_->List();
    if (list.ok()) {
      pr_ok = true;
      for (const kubelet::PodResources& p : *list) kubelet_pods.insert(p.ns + "/" + p.name);
    }
  }
  Collect(*pods, pr_ok, kubelet_pods, seen);
  KickRegionJobs();
  region_jobs_.WaitIdle(config_.region_wait);  // waits on no lock: Allocate and metrics go on meanwhile
  SweepRegionJobs();
  return absl::OkStatus();
}

void NodeAgent::ReportPhases(const std::vector<NodePod>& pods) {
  // Pods with records not yet reported: write the truth (the containers' assignment as applied) and
  // tessera.dev/phase: allocated once every GPU container of the pod is allocated.
  std::map<std::string, std::vector<ContainerRecord>> by_uid;
  {
    MutexLock lock(&mu_);
    for (const auto& [key, t] : tenants_) by_uid[t.record.pod_uid].push_back(t.record);
  }
  for (const NodePod& pod : pods) {
    auto it = by_uid.find(pod.uid);
    if (it == by_uid.end()) continue;
    const std::vector<ContainerRecord>& recs = it->second;
    if (std::all_of(recs.begin(), recs.end(), [](const ContainerRecord& r) { return r.reported; })) continue;
    absl::StatusOr<formats::Assignment> a =
        formats::ParseAssignment(Annotation(pod, formats::kAnnotationAssignment));
    if (!a.ok()) continue;
    bool all = true;
    bool changed = false;
    for (core::ContainerAssignment& c : a->containers) {
      auto r = std::find_if(recs.begin(), recs.end(),
                            [&](const ContainerRecord& x) { return x.container == c.name; });
      if (r == recs.end()) {
        all = false;
        continue;
      }
      if (!SameLimits(c.vgpus, r->vgpus)) {
        c.vgpus = r->vgpus;
        changed = true;
      }
    }
    AnnotationPatch patch;
    if (changed) {
      core::Placement p = formats::ToPlacement(*a);
      patch[formats::kAnnotationAssignment] = formats::FormatAssignment(p);
    }
    if (all) patch[formats::kAnnotationPhase] = std::string(formats::kPhaseAllocated);
    if (patch.empty()) continue;
    absl::Status s = api_->PatchPodAnnotations(pod.ns, pod.name, patch);
    if (!s.ok()) {
      MutexLock lock(&mu_);
      ++stats_.api_errors;
      log::Warn("cannot write the pod's phase; will retry", {{"pod", pod.key()}, {"error", Message(s)}});
      continue;
    }
    if (!all) continue;
    std::vector<FileOp> saves;
    {
      MutexLock lock(&mu_);
      for (const ContainerRecord& r : recs) {
        auto t = tenants_.find(r.key());
        if (t == tenants_.end()) continue;
        t->second.record.reported = true;
        saves.push_back({t->second.record, ""});
      }
    }
    RunFileOps(saves);
  }
}

void NodeAgent::ApplyAssignmentChanges(const std::vector<NodePod>& pods) {
  std::map<std::string, const NodePod*> by_uid;
  for (const NodePod& p : pods) by_uid[p.uid] = &p;
  std::vector<ContainerRecord> changed;  // the records as they become
  std::vector<std::pair<NodeEvent, std::string>> events;
  {
    // Decide under the lock; write, post and tell after it.
    MutexLock lock(&mu_);
    for (auto& [key, t] : tenants_) {
      if (!t.record.reported) continue;  // our own write has not landed yet
      auto p = by_uid.find(t.record.pod_uid);
      if (p == by_uid.end()) continue;
      const std::string text = Annotation(*p->second, formats::kAnnotationAssignment);
      absl::StatusOr<formats::Assignment> a = formats::ParseAssignment(text);
      if (!a.ok()) {
        if (reported_problems_.insert(StrCat(t.record.pod_uid, "|", text)).second) {
          events.push_back(
              {NodeEvent{p->second->ns, p->second->name, p->second->uid, "Warning", "MalformedAssignment",
                         StrCat("cannot read the rewritten tessera.dev/assignment: ", Message(a.status()),
                                "; the container keeps its current limits")},
               p->second->key()});
        }
        continue;
      }
      auto c =
          std::find_if(a->containers.begin(), a->containers.end(),
                       [&t = t](const core::ContainerAssignment& x) { return x.name == t.record.container; });
      if (c == a->containers.end() || SameLimits(c->vgpus, t.record.vgpus)) continue;
      if (!SameGpus(c->vgpus, t.record.vgpus)) {
        log::Warn("assignment names other GPUs than the running container has; ignored",
                  {{"pod", p->second->key()}, {"container", t.record.container}});
        continue;
      }
      ContainerRecord r = t.record;
      for (size_t i = 0; i < c->vgpus.size(); ++i) {
        r.vgpus[i].cores = c->vgpus[i].cores;
        r.vgpus[i].memory = c->vgpus[i].memory;
        r.vgpus[i].requested = c->vgpus[i].requested;
      }
      r.generation += 1;
      changed.push_back(std::move(r));
    }
  }
  for (const auto& [e, pod] : events) {
    if (!api_->PostEvent(e).ok()) {
      MutexLock lock(&mu_);
      ++stats_.api_errors;
    }
    log::Warn(e.message, {{"pod", pod}});
  }
  std::vector<std::pair<std::string, uint64_t>> reloads;
  for (const ContainerRecord& r : changed) {
    if (absl::Status s = WriteLimits(r); !s.ok()) {
      log::Error("cannot rewrite a limits file", {{"tenant", r.key()}, {"error", Message(s)}});
      continue;
    }
    RunFileOps({{r, ""}});
    MutexLock lock(&mu_);
    auto t = tenants_.find(r.key());
    if (t == tenants_.end()) continue;  // collected meanwhile
    t->second.record = r;
    t->second.limits_pending = true;
    ++stats_.limit_updates;
    reloads.emplace_back(r.key(), r.generation);
    log::Info("limits changed", {{"tenant", r.key()}, {"generation", StrCat(r.generation)}});
  }
  if (reloads.empty()) return;
  // The regions get the new limits before the processes are told to reload (a tenant holding its region's
  // lock delays only this pass, and only up to region_wait).
  KickRegionJobs();
  region_jobs_.WaitIdle(config_.region_wait);
  SweepRegionJobs();
  for (const auto& [key, gen] : reloads) registration_->PushReload(key, gen);
}

void NodeAgent::ReconcilePodResources(const std::vector<NodePod>& pods) {
  if (pod_resources_ == nullptr) return;
  absl::StatusOr<std::vector<kubelet::PodResources>> list = pod_resources_->List();
  if (!list.ok()) {
    log::Debug("pod-resources unavailable", {{"error", Message(list.status())}});
    return;
  }
  std::map<std::string, const NodePod*> pod_of;  // ns/name -> pod
  for (const NodePod& p : pods) pod_of[p.key()] = &p;
  std::set<std::string> uids_here;  // the pods on this node now
  for (const NodePod& p : pods) uids_here.insert(p.uid);
  std::vector<NodeEvent> events;
  std::vector<std::pair<const NodePod*, std::string>> ledger_patches;  // pod, its new tessera.dev/assignment
  std::vector<FileOp> ops;  // done after the lock, in order
  MutexLock lock(&mu_);
  std::erase_if(exchanges_, [&](const auto& e) { return !uids_here.contains(e.first.substr(0, e.first.find('/'))); });
  held_.clear();
  for (const kubelet::PodResources& p : *list) {
    for (const kubelet::ContainerResources& c : p.containers) {
      if (!c.DeviceIds(config_.resource_name).empty()) held_.insert(StrCat(p.ns, "/", p.name, "/", c.name));
    }
  }
  for (const kubelet::PodResources& p : *list) {
    for (const kubelet::ContainerResources& c : p.containers) {
      std::vector<std::string> ids = c.DeviceIds(config_.resource_name);
      if (ids.empty()) continue;
      std::sort(ids.begin(), ids.end());
      // The record that handed out these devices. The kubelet hands a freed device to the next pod at once, so a
      // record of a pod that has just left may still name the same devices as the new pod's own record: the
      // record of this very container wins, and a record whose pod is no longer on the node is stale, never a swap.
      Tenant* holder = nullptr;
      for (auto& [key, t] : tenants_) {
        std::vector<std::string> mine = t.record.device_ids;
        std::sort(mine.begin(), mine.end());
        if (mine != ids) continue;
        const ContainerRecord& r = t.record;
        if (r.ns == p.ns && r.pod_name == p.name && r.container == c.name) {
          holder = &t;
          break;
        }
        if (holder == nullptr && uids_here.contains(r.pod_uid)) holder = &t;
      }
      if (holder == nullptr) continue;
      ContainerRecord& r = holder->record;
      if (r.ns == p.ns && r.pod_name == p.name && r.container == c.name) {
        if (!r.confirmed) {
          r.confirmed = true;
          ops.push_back({r, ""});
        }
        continue;
      }
      // The kubelet started pod X's container with the allocation the agent had made for pod Y (an Allocate
      // call does not name its pod, and same-shaped pods are interchangeable to it). X and Y exchange their
      // parts of the ledger, so that every GPU keeps exactly the shares the scheduler committed on it: the
      // record moves to X (its mounts name that directory already) and X's annotation will say what X runs
      // with; Y takes what X had: X's own record if X was allocated one (it went to another container or is
      // still to start), else X's assignment, which Y's container is then allocated from.
      auto x_pod = pod_of.find(p.ns + "/" + p.name);
      if (x_pod == pod_of.end()) continue;
      const NodePod& x = *x_pod->second;
      const std::string x_key = x.uid + "/" + c.name;
      auto other = tenants_.find(x_key);
      Tenant moved = std::move(*holder);
      const std::string old_key = moved.record.key();
      const std::string old_sig =
          Signature(moved.record.vgpus, moved.record.compute_policy, moved.record.priority);
      const ContainerRecord y = moved.record;  // Y's identity
      tenants_.erase(old_key);
      // Both records change names: their old files go first, then each is saved under its new name (removing
      // after saving would delete the record just written when the two swap names outright).
      const fs::path records = fs::path(config_.state_dir) / "records";
      ops.push_back({{}, (records / RecordFileName(y)).string()});
      if (other != tenants_.end()) ops.push_back({{}, (records / RecordFileName(other->second.record)).string()});
      std::string new_sig;
      if (other != tenants_.end()) {
        Tenant second = std::move(other->second);
        tenants_.erase(other);
        new_sig = Signature(second.record.vgpus, second.record.compute_policy, second.record.priority);
        second.record.pod_uid = y.pod_uid;
        second.record.ns = y.ns;
        second.record.pod_name = y.pod_name;
        second.record.container = y.container;
        second.record.reported = false;  // Y's annotation follows on the next report
        second.record.confirmed = false;
        ops.push_back({second.record, ""});
        tenants_[second.record.key()] = std::move(second);
      } else if (absl::StatusOr<std::pair<const NodePod*, std::string>> after = ExchangeLedger(x, c.name, y, pods);
                 after.ok()) {
        // Y's share was never allocated: Y is allocated X's part when its container comes.
        ledger_patches.push_back(*after);
        new_sig = Signature(exchanges_[y.key()].vgpus, y.compute_policy, y.priority);
      } else {
        log::Warn("allocation swapped, and the other pod's part of the ledger cannot be read",
                  {{"from", old_key}, {"to", x_key}, {"error", Message(after.status())}});
      }
      if (!new_sig.empty() && new_sig != old_sig) {
        events.push_back({y.ns, y.pod_name, y.pod_uid, "Warning", "AllocationSwapped",
                          "the kubelet gave this pod's GPUs to a pod of a different shape and this pod takes "
                          "that pod's instead; delete the pod so that it is placed again"});
      }
      exchanges_.erase(x_key);  // X runs with Y's part now; what X was to take went to Y above
      moved.record.pod_uid = x.uid;
      moved.record.ns = p.ns;
      moved.record.pod_name = p.name;
      moved.record.container = c.name;
      moved.record.reported = false;
      moved.record.confirmed = true;
      ops.push_back({moved.record, ""});
      log::Warn("allocation swapped between pods; records corrected",
                {{"from", old_key}, {"to", moved.record.key()}});
      tenants_[moved.record.key()] = std::move(moved);
      ++stats_.swaps;
    }
  }
  lock.Release();
  RunFileOps(ops);
  for (const NodeEvent& e : events) {
    if (!api_->PostEvent(e).ok()) {
      MutexLock relock(&mu_);
      ++stats_.api_errors;
    }
  }
  for (const auto& [pod, text] : ledger_patches) {
    if (absl::Status st = api_->PatchPodAnnotations(pod->ns, pod->name, {{formats::kAnnotationAssignment, text}});
        !st.ok()) {
      {
        MutexLock relock(&mu_);
        ++stats_.api_errors;
      }
      log::Warn("cannot write an exchanged assignment; the next Allocate uses it anyway",
                {{"pod", pod->key()}, {"error", Message(st)}});
    }
  }
}

absl::StatusOr<formats::Assignment> NodeAgent::LedgerOf(const NodePod& pod) const {
  const std::string text = Annotation(pod, formats::kAnnotationAssignment);
  absl::StatusOr<formats::Assignment> a = formats::ParseAssignment(text);
  if (!a.ok()) return a.status();
  for (core::ContainerAssignment& c : a->containers) {
    auto ex = exchanges_.find(pod.uid + "/" + c.name);
    if (ex != exchanges_.end() && ex->second.accepted.contains(text)) c.vgpus = ex->second.vgpus;
  }
  return a;
}

absl::StatusOr<std::pair<const NodePod*, std::string>> NodeAgent::ExchangeLedger(
    const NodePod& x, const std::string& container, const ContainerRecord& y, const std::vector<NodePod>& pods) {
  absl::StatusOr<formats::Assignment> xa = LedgerOf(x);
  if (!xa.ok()) return xa.status();
  auto xc = std::find_if(xa->containers.begin(), xa->containers.end(),
                         [&](const core::ContainerAssignment& a) { return a.name == container; });
  if (xc == xa->containers.end()) return absl::NotFoundError(StrCat("no container ", container, " in ", x.key()));
  auto y_pod = std::find_if(pods.begin(), pods.end(), [&](const NodePod& q) { return q.uid == y.pod_uid; });
  if (y_pod == pods.end()) return absl::NotFoundError(StrCat("pod ", y.ns, "/", y.pod_name, " is gone"));
  absl::StatusOr<formats::Assignment> ya = LedgerOf(*y_pod);
  if (!ya.ok()) return ya.status();
  auto yc = std::find_if(ya->containers.begin(), ya->containers.end(),
                         [&](const core::ContainerAssignment& a) { return a.name == y.container; });
  if (yc == ya->containers.end())
    return absl::NotFoundError(StrCat("no container ", y.container, " in ", y.ns, "/", y.pod_name));
  yc->vgpus = xc->vgpus;
  const std::string after = formats::FormatAssignment(formats::ToPlacement(*ya));
  // Y's annotation may read as it does now, as any exchange of Y's written before, or as this one: each of
  // them still holds (`after` is built on them).
  std::set<std::string> accepted = {Annotation(*y_pod, formats::kAnnotationAssignment), after};
  for (auto& [key, ex] : exchanges_) {
    if (!key.starts_with(y.pod_uid + "/")) continue;
    accepted.insert(ex.accepted.begin(), ex.accepted.end());
    ex.accepted.insert(after);
  }
  exchanges_[y.key()] = Exchange{std::move(accepted), xc->vgpus};
  return std::pair<const NodePod*, std::string>{&*y_pod, after};
}

void NodeAgent::RemoveTenantFiles(const ContainerRecord& r) {
  std::error_code ec;
  fs::remove_all(r.dir, ec);
  fs::remove_all(r.region_dir, ec);
  fs::remove(fs::path(config_.state_dir) / "records" / RecordFileName(r), ec);
  for (const char* top : {"containers", "regions"}) {
    const fs::path pod_dir = fs::path(config_.state_dir) / top / r.pod_uid;
    if (fs::is_empty(pod_dir, ec)) fs::remove(pod_dir, ec);
  }
}

void NodeAgent::Collect(const std::vector<NodePod>& pods, bool pod_resources_ok,
                        const std::set<std::string>& kubelet_pods, uint64_t seen) {
  std::map<std::string, const NodePod*> by_uid;
  for (const NodePod& p : pods) by_uid[p.uid] = &p;
  const std::map<int, std::string> live = registration_->All();
  std::vector<std::pair<ContainerRecord, std::shared_ptr<hook::SharedRegion>>> gone;
  std::set<std::string> known_dirs;
  {
    MutexLock lock(&mu_);
    for (auto it = tenants_.begin(); it != tenants_.end();) {
      const ContainerRecord& r = it->second.record;
      if (it->second.allocation > seen) {
        // Allocated after this pass listed the pods: its pod may be missing from that list only because the
        // list is older. It used to be collected right after its Allocate (records, limits file and region
        // removed under a starting container).
        known_dirs.insert(r.dir);
        ++it;
        continue;
      }
      auto p = by_uid.find(r.pod_uid);
      const bool pod_running = p != by_uid.end() && !p->second->terminated();
      const bool pod_finished = p != by_uid.end() && p->second->terminated();
      // The kubelet's view wins over the API's when it has one: a pod force-deleted from the API may still
      // run.
      const bool kubelet_has = pod_resources_ok && pod_resources_ != nullptr &&
                               kubelet_pods.count(r.ns + "/" + r.pod_name) > 0 && !pod_finished;
      bool process_alive = false;
      for (const auto& [pid, tenant] : live) process_alive |= tenant == it->first && kill(pid, 0) == 0;
      if (pod_running || kubelet_has || process_alive) {
        known_dirs.insert(r.dir);
        ++it;
        continue;
      }
      gone.emplace_back(r, std::move(it->second.region));
      it = tenants_.erase(it);
      ++stats_.collected;
    }
    // Directories of claims in flight are not orphans.
    for (const std::string& key : claims_)
      known_dirs.insert((fs::path(config_.state_dir) / "containers" / key).string());
  }
  for (auto& [r, region] : gone) {
    region.reset();  // unmapped now, or when a running region job ends
    RemoveTenantFiles(r);
    log::Info("container gone; its directory and region were removed", {{"tenant", r.key()}});
  }
  // Orphan directories (a crash between creating a directory and writing its record). Only old ones: an
  // Allocate may have created a directory after this pass listed the pods and the claims (it used to be
  // removed under the allocation in flight, leaving the container without its limits file).
  std::error_code ec;
  const auto old_enough = [](const fs::path& p) {
    std::error_code e;
    const auto t = fs::last_write_time(p, e);
    return !e && fs::file_time_type::clock::now() - t > kOrphanAge;
  };
  for (const auto& pod_dir : fs::directory_iterator(fs::path(config_.state_dir) / "containers", ec)) {
    std::error_code ec2;
    for (const auto& ctr : fs::directory_iterator(pod_dir.path(), ec2)) {
      if (known_dirs.count(ctr.path().string()) > 0) continue;
      const fs::path record =
          fs::path(config_.state_dir) / "records" /
          StrCat(pod_dir.path().filename().string(), "_", ctr.path().filename().string(), ".json");
      if (fs::exists(record, ec2)) continue;
      if (by_uid.count(pod_dir.path().filename().string()) > 0) continue;  // its pod lives: leave it
      if (!old_enough(ctr.path())) continue;
      fs::remove_all(ctr.path(), ec2);
      fs::remove_all(
          fs::path(config_.state_dir) / "regions" / pod_dir.path().filename() / ctr.path().filename(), ec2);
    }
    if (fs::is_empty(pod_dir.path(), ec2) && old_enough(pod_dir.path())) fs::remove(pod_dir.path(), ec2);
  }
}

// --- registration ----------------------------------------------------------------------------------------

absl::StatusOr<RegistrationServer::Accepted> NodeAgent::OnHello(int pid, const hook::Hello& hello) {
  absl::StatusOr<CgroupIdentity> id = IdentifyProcess(config_.proc_root, pid);
  auto refuse = [&](absl::Status s) {
    MutexLock lock(&mu_);
    ++stats_.registrations_refused;
    return s;
  };
  if (!id.ok()) {
    return refuse(absl::PermissionDeniedError(
        StrCat("host process ", pid, " is not in a Kubernetes pod (", Message(id.status()), ")")));
  }
  std::shared_ptr<const std::vector<NodePod>> pods = Pods();
  auto container_name_of = [&](const std::string& uid) -> std::string {
    for (const NodePod& p : *pods) {
      if (p.uid != uid) continue;
      for (const auto& [name, cid] : p.container_ids) {
        if (!id->container_id.empty() && cid == id->container_id) return name;
      }
    }
    return "";
  };
  std::string name = container_name_of(id->pod_uid);
  MutexLock lock(&mu_);
  std::vector<const Tenant*> mine;
  for (const auto& [key, t] : tenants_) {
    if (t.record.pod_uid == id->pod_uid) mine.push_back(&t);
  }
  if (mine.empty()) {
    ++stats_.registrations_refused;
    return absl::PermissionDeniedError(
        StrCat("pod ", id->pod_uid, " of host process ", pid, " holds no Tessera GPU on this node"));
  }
  const Tenant* tenant = nullptr;
  if (!name.empty()) {
    for (const Tenant* t : mine) {
      if (t->record.container == name) tenant = t;
    }
  } else if (mine.size() == 1) {
    tenant = mine[0];
  }
  if (tenant == nullptr) {
    ++stats_.registrations_refused;
    return absl::UnavailableError(
        StrCat("cannot tell which container of pod ", id->pod_uid, " host process ", pid,
               " belongs to yet (its container ID is not in the pod's status); retry in a second"));
  }
  // What the process says must agree with what it was given.
  if (hello.gpus[0] != 0) {
    for (std::string_view g : StrSplit(hello.gpus, ',')) {
      if (g.empty()) continue;
      const bool given = std::any_of(tenant->record.vgpus.begin(), tenant->record.vgpus.end(),
                                     [&](const core::VGpuAssignment& v) { return v.uuid.value() == g; });
      if (!given) {
        ++stats_.registrations_refused;
        return absl::PermissionDeniedError(StrCat("host process ", pid, " of ", tenant->record.ns, "/",
                                                  tenant->record.pod_name, " claims GPU ", g,
                                                  ", which was not given to its container"));
      }
    }
  }
  ++stats_.registrations;
  return RegistrationServer::Accepted{tenant->record.key(), tenant->record.generation};
}

void NodeAgent::OnGone(int pid, const std::string& tenant) {
  // The process exited (or was killed): free what it held in the region soon, not at the next charge. The
  // reclaim takes the region's locks, which the tenant's other processes may hold: it runs as a region job.
  // Until its parent reaps it the process is a zombie and still counts as alive; then later passes retry.
  {
    MutexLock lock(&mu_);
    auto it = tenants_.find(tenant);
    if (it == tenants_.end() || !it->second.region) return;
    pending_reclaims_[tenant] = 0;
  }
  KickRegionJobs();
  log::Info("process gone", {{"pid", StrCat(pid)}, {"tenant", tenant}});
}

void NodeAgent::KickRegionJobs() {
  struct Start {
    std::string key;
    std::shared_ptr<hook::SharedRegion> region;
    std::optional<hook::Limits> limits;
    bool reclaim = false;
  };
  std::vector<Start> starts;
  {
    MutexLock lock(&mu_);
    for (auto& [key, t] : tenants_) {
      if (!t.region) continue;
      const bool reclaim = pending_reclaims_.count(key) > 0;
      if (!t.limits_pending && !reclaim) continue;
      if (region_jobs_.Running(key)) continue;
      Start st{key, t.region, std::nullopt, reclaim};
      if (t.limits_pending) st.limits = LimitsFor(t.record);
      t.limits_pending = false;
      if (reclaim) reclaim_jobs_.insert(key);
      starts.push_back(std::move(st));
    }
  }
  for (Start& st : starts) {
    const bool started = region_jobs_.Start(
        st.key, st.region, [limits = st.limits, reclaim = st.reclaim](hook::SharedRegion& r) {
          return RegionWork(r, limits, reclaim);
        });
    if (started) continue;
    // Another thread started one for this tenant meanwhile: ask again next time.
    MutexLock lock(&mu_);
    auto t = tenants_.find(st.key);
    if (t != tenants_.end() && st.limits) t->second.limits_pending = true;
    if (st.reclaim) reclaim_jobs_.erase(st.key);
  }
}

void NodeAgent::SweepRegionJobs() {
  RegionJobs::Swept swept = region_jobs_.Sweep();
  {
    MutexLock lock(&mu_);
    for (const auto& [key, freed] : swept.finished) {
      if (reclaim_jobs_.erase(key) == 0) continue;
      stats_.slots_reclaimed += static_cast<uint64_t>(std::max(freed, 0));
      auto p = pending_reclaims_.find(key);
      if (p == pending_reclaims_.end()) continue;
      if (freed > 0 || ++p->second >= kReclaimAttempts) pending_reclaims_.erase(p);
    }
  }
  for (const std::string& key : swept.stuck) RebuildRegion(key);
}

void NodeAgent::RebuildRegion(const std::string& key) {
  ContainerRecord record;
  {
    MutexLock lock(&mu_);
    auto it = tenants_.find(key);
    reclaim_jobs_.erase(key);
    pending_reclaims_.erase(key);
    if (it == tenants_.end()) return;
    it->second.region.reset();  // the stuck job keeps the old mapping until the tenant lets go
    it->second.record.generation += 1;
    record = it->second.record;
    ++stats_.regions_rebuilt;
  }
  // A new file under the same name: the tenant's processes keep the old one mapped until they reopen it;
  // nothing of the agent's waits on its lock any more.
  const std::string path = (fs::path(record.region_dir) / "region").string();
  std::error_code ec;
  fs::remove(path, ec);
  hook::Error error;
  std::shared_ptr<hook::SharedRegion> region = OpenRegion(path, &error);
  if (!region)
    log::Error("cannot recreate a tenant's shared region", {{"tenant", key}, {"error", error.text}});
  {
    MutexLock lock(&mu_);
    auto it = tenants_.find(key);
    if (it != tenants_.end() && !it->second.region && region) {
      it->second.region = std::move(region);
      it->second.limits_pending = true;
    }
  }
  if (absl::Status s = WriteLimits(record); !s.ok()) {
    log::Error("cannot rewrite a limits file", {{"tenant", key}, {"error", Message(s)}});
  }
  RunFileOps({{record, ""}});
  KickRegionJobs();
  registration_->PushReload(key, record.generation);
  const std::string message =
      StrCat("a process of container ", record.container, " held its shared region's lock for more than ",
             config_.region_lock_timeout.count(),
             " ms; the region was replaced by a new one and its processes told to reload (memory accounting "
             "restarts from the new region)");
  log::Warn(message, {{"tenant", key}});
  if (absl::Status s =
          api_->PostEvent({record.ns, record.pod_name, record.pod_uid, "Warning", "RegionLockHeld", message});
      !s.ok()) {
    MutexLock lock(&mu_);
    ++stats_.api_errors;
  }
}

void NodeAgent::OpenRegions() {
  // Creating a region writes and fsyncs half a MiB: done without the lock.
  std::vector<std::pair<std::string, std::string>> todo;  // key, path
  {
    MutexLock lock(&mu_);
    for (const auto& [key, t] : tenants_) {
      if (!t.region) todo.emplace_back(key, (fs::path(t.record.region_dir) / "region").string());
    }
  }
  for (const auto& [key, path] : todo) {
    hook::Error error;
    std::shared_ptr<hook::SharedRegion> region = OpenRegion(path, &error);
    if (!region) {
      log::Error("cannot create a tenant's shared region", {{"tenant", key}, {"error", error.text}});
      continue;
    }
    MutexLock lock(&mu_);
    auto it = tenants_.find(key);
    if (it == tenants_.end() || it->second.region) continue;
    it->second.region = std::move(region);
    it->second.limits_pending = true;
  }
}

// --- inventory, health, metrics --------------------------------------------------------------------------

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

std::vector<int> NodeAgent::TenantPids(const std::string& pod_uid, const std::string& container) const {
  return registration_->Pids(pod_uid + "/" + container);
}

AgentStats NodeAgent::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

std::string NodeAgent::MetricsText() const {
  const std::map<int, std::string> procs = registration_->All();
  std::map<std::string, int> procs_of;
  for (const auto& [pid, tenant] : procs) ++procs_of[tenant];
  std::string out;
  MutexLock lock(&mu_);
  struct GpuSum {
    uint64_t mem_used = 0, mem_limit = 0;
    double cores_used = 0, cores_limit = 0;
    int tenants = 0;
  };
  std::map<std::string, GpuSum> per_gpu;
  std::string ctr_lines[5];
  for (const auto& [key, t] : tenants_) {
    const ContainerRecord& r = t.record;
    for (const core::VGpuAssignment& v : r.vgpus) {
      const std::string labels =
          StrCat("namespace=\"", EscapeLabel(r.ns), "\",pod=\"", EscapeLabel(r.pod_name), "\",container=\"",
                 EscapeLabel(r.container), "\",gpu=\"", v.uuid.value(), "\"");
      const uint64_t limit = static_cast<uint64_t>(v.memory.value()) << 20;
      uint64_t used = 0;
      double cores_used = 0;
      if (t.region) {
        const int dev = t.region->FindDevice(v.uuid.value().c_str());
        if (dev >= 0) {
          used = t.region->Used(dev);
          cores_used =
              t.region->device(dev)->controller.own_util_ppm.load(std::memory_order_relaxed) / 10000.0;
        }
      }
      const double cores_limit = v.cores.value() / 10.0;
      StrAppend(&ctr_lines[0], "tessera_container_memory_used_bytes{", labels, "} ", used, "\n");
      StrAppend(&ctr_lines[1], "tessera_container_memory_limit_bytes{", labels, "} ", limit, "\n");
      StrAppend(&ctr_lines[2], "tessera_container_cores_used_percent{", labels, "} ", cores_used, "\n");
      StrAppend(&ctr_lines[3], "tessera_container_cores_limit_percent{", labels, "} ", cores_limit, "\n");
      GpuSum& g = per_gpu[v.uuid.value()];
      g.mem_used += used;
      g.mem_limit += limit;
      g.cores_used += cores_used;
      g.cores_limit += cores_limit;
      g.tenants += 1;
    }
    StrAppend(&ctr_lines[4], "tessera_container_processes{namespace=\"", EscapeLabel(r.ns), "\",pod=\"",
              EscapeLabel(r.pod_name), "\",container=\"", EscapeLabel(r.container), "\"} ", procs_of[key],
              "\n");
  }
  const char* ctr_help[5][2] = {
      {"tessera_container_memory_used_bytes", "GPU memory a container holds on a GPU (its shared region)."},
      {"tessera_container_memory_limit_bytes", "GPU memory limit of a container on a GPU."},
      {"tessera_container_cores_used_percent",
       "Compute a container used on a GPU over the hook's last step, percent of the GPU."},
      {"tessera_container_cores_limit_percent", "Compute share of a container on a GPU, percent of the GPU."},
      {"tessera_container_processes", "Processes of a container registered with the agent."}};
  for (int i = 0; i < 5; ++i) {
    StrAppend(&out, "# HELP ", ctr_help[i][0], " ", ctr_help[i][1], "\n# TYPE ", ctr_help[i][0], " gauge\n",
              ctr_lines[i]);
  }
  const char* gpu_help[6][2] = {
      {"tessera_gpu_health", "1 when the GPU is healthy, 0 when not."},
      {"tessera_gpu_memory_used_bytes", "GPU memory held by all Tessera containers on the GPU."},
      {"tessera_gpu_memory_limit_bytes", "Sum of the memory limits of the containers on the GPU."},
      {"tessera_gpu_cores_used_percent", "Compute used by all Tessera containers on the GPU, percent."},
      {"tessera_gpu_cores_limit_percent", "Sum of the compute shares given on the GPU, percent."},
      {"tessera_gpu_tenants", "Containers sharing the GPU."}};
  for (int i = 0; i < 6; ++i) {
    StrAppend(&out, "# HELP ", gpu_help[i][0], " ", gpu_help[i][1], "\n# TYPE ", gpu_help[i][0], " gauge\n");
    for (const formats::InventoryGpu& g : inventory_.gpus) {
      const GpuSum s = per_gpu.count(g.info.uuid.value()) ? per_gpu.at(g.info.uuid.value()) : GpuSum{};
      const std::string labels = StrCat("{gpu=\"", g.info.uuid.value(), "\",index=\"", g.info.index,
                                        "\",model=\"", EscapeLabel(g.info.model), "\"} ");
      switch (i) {
        case 0:
          StrAppend(&out, gpu_help[i][0], labels, g.info.health == core::GpuHealth::kHealthy ? 1 : 0, "\n");
          break;
        case 1:
          StrAppend(&out, gpu_help[i][0], labels, s.mem_used, "\n");
          break;
        case 2:
          StrAppend(&out, gpu_help[i][0], labels, s.mem_limit, "\n");
          break;
        case 3:
          StrAppend(&out, gpu_help[i][0], labels, s.cores_used, "\n");
          break;
        case 4:
          StrAppend(&out, gpu_help[i][0], labels, s.cores_limit, "\n");
          break;
        default:
          StrAppend(&out, gpu_help[i][0], labels, s.tenants, "\n");
          break;
      }
    }
  }
  StrAppend(&out, "# HELP tessera_node_tenants Containers with a Tessera allocation on this node.\n",
            "# TYPE tessera_node_tenants gauge\ntessera_node_tenants ", tenants_.size(), "\n");
  const std::pair<const char*, uint64_t> counters[] = {
      {"tessera_allocations_total", stats_.allocations},
      {"tessera_allocation_errors_total", stats_.allocation_errors},
      {"tessera_limit_updates_total", stats_.limit_updates},
      {"tessera_containers_collected_total", stats_.collected},
      {"tessera_registrations_total", stats_.registrations},
      {"tessera_registrations_refused_total", stats_.registrations_refused},
      {"tessera_region_slots_reclaimed_total", stats_.slots_reclaimed},
      {"tessera_api_errors_total", stats_.api_errors},
      {"tessera_regions_rebuilt_total", stats_.regions_rebuilt},
      {"tessera_record_errors_total", stats_.record_errors}};
  for (const auto& [name, value] : counters) {
    StrAppend(&out, "# TYPE ", name, " counter\n", name, " ", value, "\n");
  }
  return out;
}

}  // namespace tessera::node

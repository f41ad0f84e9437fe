// NodeAgent: the kubelet's Allocate and PreStartContainer (which container an Allocate is for, its
// directories, limits file and record). docs/node-agent.md, "Allocate".
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "common/log.h"
#include "core/request_parser.h"
#include "core/strings.h"
#include "formats/assignment.h"
#include "node/agent.h"
#include "node/agent_internal.h"

namespace tessera::node {

namespace fs = std::filesystem;

std::string ZeroMemory(const core::ContainerAssignment& container) {
  for (const core::VGpuAssignment& v : container.vgpus) {
    if (v.memory.value() <= 0) {
      return StrCat("tessera.dev/assignment gives container \"", container.name, "\" no memory on GPU ",
                    v.uuid.value(), " (memoryMiB: 0 would mean no memory limit at all)");
    }
  }
  return "";
}

std::string QueueTime(const NodePod& pod) {
  const absl::StatusOr<std::chrono::system_clock::time_point> created =
      formats::ParseHeartbeat(pod.creation_timestamp);
  const absl::StatusOr<std::chrono::system_clock::time_point> assigned =
      formats::ParseHeartbeat(Annotation(pod, formats::kAnnotationAssignedAt));
  if (!created.ok()) return assigned.ok() ? formats::FormatHeartbeat(*assigned) : pod.creation_timestamp;
  if (!assigned.ok()) return formats::FormatHeartbeat(*created);
  return formats::FormatHeartbeat(std::max(*created, *assigned));
}

struct NodeAgent::Candidate {
  std::string sort_key;
  const NodePod* pod = nullptr;
  const core::ContainerAssignment* container = nullptr;
  bool exchanged = false;  // the container takes another pod's part, not what its pod's text says
};

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

std::string NodeAgent::OvercommitLocked(const std::string& key,
                                        const std::vector<core::VGpuAssignment>& vgpus,
                                        const std::set<std::string>& live_uids,
                                        const std::map<std::string, AssignedNow>& assigned) const {
  // The smaller of a record's share on GPU `uuid` and its pod's assignment now.
  const auto held = [&](const Tenant& t, const core::VGpuAssignment& v) -> std::pair<int64_t, int64_t> {
    int64_t cores = v.cores.value();
    int64_t memory = v.memory.value();
    auto a = assigned.find(t.record.pod_uid);
    // The text is another part's (a swap gave this record to the pod, and the list does not show it yet).
    if (a == assigned.end() || (!t.superseded.empty() && a->second.text == t.superseded)) {
      return {cores, memory};
    }
    for (const core::ContainerAssignment& c : a->second.assignment.containers) {
      if (c.name != t.record.container) continue;
      for (const core::VGpuAssignment& now : c.vgpus) {
        if (now.uuid != v.uuid) continue;
        cores = std::min<int64_t>(cores, now.cores.value());
        memory = std::min<int64_t>(memory, now.memory.value());
      }
    }
    return {cores, memory};
  };
  for (const core::VGpuAssignment& v : vgpus) {
    auto gpu = std::find_if(inventory_.gpus.begin(), inventory_.gpus.end(),
                            [&](const formats::InventoryGpu& g) { return g.info.uuid == v.uuid; });
    if (gpu == inventory_.gpus.end()) return StrCat("GPU ", v.uuid.value(), " is not on this node");
    int64_t cores = v.cores.value();
    int64_t memory = v.memory.value();
    for (const auto& [other, t] : tenants_) {
      if (other == key) continue;
      if (!t.record.is_claim() && !live_uids.contains(t.record.pod_uid)) continue;
      for (const core::VGpuAssignment& o : t.record.vgpus) {
        if (o.uuid != v.uuid) continue;
        const auto [c, m] = held(t, o);
        cores += c;
        memory += m;
      }
    }
    for (const auto& [other, claimed] : in_flight_) {
      if (other == key) continue;
      for (const core::VGpuAssignment& o : claimed) {
        if (o.uuid != v.uuid) continue;
        cores += o.cores.value();
        memory += o.memory.value();
      }
    }
    // Each term is at most 1000 or 2^40 MiB (ParseAssignment's bounds) and there are fewer than 2^20 of them:
    // no sum here can overflow.
    if (cores > core::kWholeGpu.value() || memory > gpu->info.memory.value()) {
      return StrCat("tessera.dev/assignment gives this container ", v.cores.value(), "/1000 of GPU ",
                    v.uuid.value(), " and ", v.memory.value(),
                    " MiB; with the containers already on it the GPU "
                    "would carry ",
                    cores, "/1000 and ", memory, " MiB of its ", gpu->info.memory.value(),
                    " MiB, so it is refused");
    }
  }
  return "";
}

absl::StatusOr<NodeAgent::Tenant> NodeAgent::Claim(
    const std::vector<std::string>& device_ids, const std::vector<NodePod>& pods,
    std::vector<std::pair<NodePod, std::string>>* overcommitted) {
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
        if (std::string zero = ZeroMemory(c); !zero.empty()) {
          problem = StrCat(
              zero, "; the pod gets no GPU until the scheduler rewrites it (delete the pod to reschedule)");
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
  // What OvercommitLocked counts: the pods on the node now (a record whose pod is gone holds nothing: the
  // kubelet hands its devices on before the agent collects it) and their assignments as they read now.
  std::set<std::string> live_uids;
  for (const NodePod& pod : pods) {
    if (!pod.terminated()) live_uids.insert(pod.uid);
  }
  std::map<std::string, AssignedNow> assigned;
  for (const auto& [pod, a] : parsed) {
    assigned.emplace(pod->uid, AssignedNow{Annotation(*pod, formats::kAnnotationAssignment), a});
  }
  MutexLock lock(&mu_);
  std::vector<Candidate> candidates;
  for (auto& [pod, a] : parsed) {
    const std::string at = QueueTime(*pod);
    for (core::ContainerAssignment& c : a.containers) {
      if (c.vgpus.size() != count) continue;
      // The kubelet allocates a container once: an allocated pod's container that it reports holding devices
      // is not what this call is for. (A pod that is still `bound` may be a new pod of the same name as one
      // the kubelet has not forgotten yet, as a StatefulSet's are: pod-resources names pods, not UIDs.)
      if (held_.contains(StrCat(pod->key(), "/", c.name)) &&
          Annotation(*pod, formats::kAnnotationPhase) == formats::kPhaseAllocated) {
        continue;
      }
      // A pod whose allocation went to another container takes that container's part (ReconcilePodResources),
      // unless the scheduler has rewritten its assignment since.
      bool exchanged = false;
      if (auto ex = exchanges_.find(pod->uid + "/" + c.name); ex != exchanges_.end()) {
        if (ex->second.accepted.contains(Annotation(*pod, formats::kAnnotationAssignment))) {
          if (ex->second.vgpus.size() != count) continue;
          exchanged = !SameLimits(c.vgpus, ex->second.vgpus);
          c.vgpus = ex->second.vgpus;
        } else {
          exchanges_.erase(ex);
        }
      }
      const char* refused = refused_pods_.contains(pod->uid) ? "1" : "0";  // taken last (refused_pods_)
      candidates.push_back(
          {StrCat(refused, "|", at, "|", pod->creation_timestamp, "|", pod->key()), pod, &c, exchanged});
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
      if (it == inventory_.gpus.end() || config_.dra_gpu_uuids.contains(v.uuid.value())) {
        known = false;
        break;
      }
      v.gpu_index = it->info.index;
    }
    if (!known) continue;
    // The annotation is the scheduler's, but the agent hands out only what its GPUs have: a share that would
    // take a GPU past its compute or memory is refused, whoever wrote it.
    if (std::string over = OvercommitLocked(key, r.vgpus, live_uids, assigned); !over.empty()) {
      overcommitted->push_back(
          {*c.pod, StrCat(over, "; the container gets no GPU (delete the pod to reschedule)")});
      continue;
    }
    r.numa_node = c.container->numa_node;
    r.cpus = c.container->cpus;
    // Read as the scheduler reads them (a pod annotated "Elastic" was placed as elastic and limited as hard).
    r.compute_policy = core::ComputePolicyAnnotation(Annotation(*c.pod, core::kAnnotationComputePolicy))
                           .value_or(core::ComputePolicy::kHard);
    r.priority = core::PriorityAnnotation(Annotation(*c.pod, core::kAnnotationPriority))
                     .value_or(core::Priority::kLow);
    r.gpu_tenants = GpuTenantsLocked(r);
    ChooseDirsLocked(&r);
    claims_.insert(key);
    in_flight_[key] = r.vgpus;
    devices_in_flight_.insert(device_ids.begin(), device_ids.end());
    Tenant t;
    t.record = std::move(r);
    if (c.exchanged) {
      t.untold = true;
      t.superseded = Annotation(*c.pod, formats::kAnnotationAssignment);
    }
    return t;
  }
  return absl::NotFoundError("none");
}

absl::StatusOr<kubelet::ContainerAllocation> NodeAgent::AllocateOne(
    const kubelet::AllocateContainerRequest& req) {
  const size_t count = req.devices.size();
  std::vector<std::string> device_ids;
  for (const kubelet::DeviceSlot& d : req.devices) device_ids.push_back(d.id);
  std::vector<std::pair<NodePod, std::string>> overcommitted;
  absl::StatusOr<Tenant> claimed = Claim(device_ids, *Pods(), &overcommitted);
  if (absl::IsAlreadyExists(claimed.status()))
    return absl::FailedPreconditionError(Message(claimed.status()));
  if (!claimed.ok()) {
    // The pod may have been bound a moment ago (or a co-tenant's pod gone a moment ago): look again with a
    // fresh list.
    if (absl::Status s = RefreshPods(); !s.ok()) {
      return absl::UnavailableError(StrCat("cannot list this node's pods from the API server: ", Message(s),
                                           "; the kubelet will retry"));
    }
    overcommitted.clear();
    claimed = Claim(device_ids, *Pods(), &overcommitted);
    if (absl::IsAlreadyExists(claimed.status()))
      return absl::FailedPreconditionError(Message(claimed.status()));
    // Only candidates that would overcommit: the scheduler may not have written the lowered shares of the
    // pods it compressed for this one yet. Look again for a while (no lock is held meanwhile).
    constexpr auto kStep = std::chrono::milliseconds(250);
    for (auto waited = std::chrono::milliseconds(0);
         !claimed.ok() && !overcommitted.empty() && waited < config_.overcommit_wait; waited += kStep) {
      std::this_thread::sleep_for(kStep);
      if (!RefreshPods().ok()) continue;
      std::vector<std::pair<NodePod, std::string>> again;
      claimed = Claim(device_ids, *Pods(), &again);
      if (absl::IsAlreadyExists(claimed.status()))
        return absl::FailedPreconditionError(Message(claimed.status()));
      overcommitted = std::move(again);
    }
  }
  for (const auto& [pod, why] : overcommitted) {
    bool first = false;
    {
      MutexLock lock(&mu_);
      first = reported_problems_.insert(StrCat(pod.uid, "|", Annotation(pod, formats::kAnnotationAssignment)))
                  .second;
    }
    if (first) Event(pod, "Warning", "OvercommittedAssignment", why);
  }
  if (!claimed.ok()) {
    return absl::FailedPreconditionError(
        StrCat("no pod bound to node ", config_.node_name,
               " by tessera-scheduler waits for a container with ", count,
               " vGPU(s) (tessera.dev/phase: bound, a readable tessera.dev/assignment that fits its GPUs); "
               "schedule GPU "
               "pods with schedulerName tessera-scheduler or check the pod's events",
               overcommitted.empty() ? "" : StrCat(" (", overcommitted.front().second, ")")));
  }
  Tenant t = *std::move(claimed);
  for (const kubelet::DeviceSlot& d : req.devices) t.record.device_ids.push_back(d.id);
  t.record.allocated_at = formats::FormatHeartbeat(WallNow());
  const std::string key = t.record.key();
  if (absl::Status s = Materialize(&t); !s.ok()) {
    MutexLock lock(&mu_);
    refused_pods_.insert(t.record.pod_uid);
    claims_.erase(key);
    in_flight_.erase(key);
    for (const std::string& id : device_ids) devices_in_flight_.erase(id);
    return s;
  }
  kubelet::ContainerAllocation response = Response(t.record);
  {
    MutexLock lock(&mu_);
    claims_.erase(key);
    in_flight_.erase(key);
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

// --- the container's files ----------------------------------------------------------------------------

std::string NodeAgent::ContainerDir(std::string_view pod_uid, std::string_view container) const {
  return (fs::path(config_.state_dir) / "containers" / pod_uid / container).string();
}

std::string NodeAgent::RegionDir(std::string_view pod_uid, std::string_view container) const {
  return (fs::path(config_.state_dir) / "regions" / pod_uid / container).string();
}

void NodeAgent::ChooseDirsLocked(ContainerRecord* record) const {
  // The directories the records hold (a loop, not a lambda: the analysis does not see mu_ held in one).
  std::set<std::string> taken;
  for (const auto& [key, t] : tenants_) {
    taken.insert(t.record.dir);
    taken.insert(t.record.region_dir);
  }
  // A container name is a DNS label (no dot), so "<name>.<n>" is never another container's own name. There
  // are fewer records than the loop's bound, so it always finds a free name.
  std::string name = record->container;
  for (size_t n = 1; n <= tenants_.size() && (taken.contains(ContainerDir(record->pod_uid, name)) ||
                                              taken.contains(RegionDir(record->pod_uid, name)));
       ++n) {
    name = StrCat(record->container, ".", n);
  }
  record->dir = ContainerDir(record->pod_uid, name);
  record->region_dir = RegionDir(record->pod_uid, name);
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

std::vector<uint32_t> NodeAgent::GpuTenantsLocked(const ContainerRecord& r) const {
  std::vector<uint32_t> out;
  const bool counted = tenants_.contains(r.key());
  for (const core::VGpuAssignment& v : r.vgpus) {
    uint32_t n = counted ? 0 : 1;
    for (const auto& [key, t] : tenants_) {
      if (std::any_of(t.record.vgpus.begin(), t.record.vgpus.end(),
                      [&](const core::VGpuAssignment& o) { return o.uuid == v.uuid; })) {
        ++n;
      }
    }
    out.push_back(std::min(n, hook::kMaxTenants));
  }
  return out;
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
  // The region directory is the container's (its processes of any UID create and share the region in it);
  // the agent makes no region there and never opens one (docs/hook-abi.md, "Who touches the region").
  fs::permissions(t->record.region_dir, fs::perms::all, ec);
  if (absl::Status s = WriteLimits(t->record); !s.ok()) return s;
  return records_.Save(t->record);
}

}  // namespace tessera::node

// NodeAgent: the kubelet's Allocate and PreStartContainer (which container an Allocate is for, its
// directories, limits file and record). docs/node-agent.md, "Allocate".
#include <algorithm>
#include <filesystem>

#include "common/log.h"
#include "core/request_parser.h"
#include "core/strings.h"
#include "formats/assignment.h"
#include "node/agent.h"
#include "node/agent_internal.h"

namespace tessera::node {

namespace fs = std::filesystem;

struct NodeAgent::Candidate {
  std::string sort_key;
  const NodePod* pod = nullptr;
  const core::ContainerAssignment* container = nullptr;
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
      // The kubelet allocates a container once: an allocated pod's container that it reports holding devices
      // is not what this call is for. (A pod that is still `bound` may be a new pod of the same name as one
      // the kubelet has not forgotten yet, as a StatefulSet's are: pod-resources names pods, not UIDs.)
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
      if (it == inventory_.gpus.end() || config_.dra_gpu_uuids.contains(v.uuid.value())) {
        known = false;
        break;
      }
      v.gpu_index = it->info.index;
    }
    if (!known) continue;
    r.numa_node = c.container->numa_node;
    r.cpus = c.container->cpus;
    // Read as the scheduler reads them (a pod annotated "Elastic" was placed as elastic and limited as hard).
    r.compute_policy = core::ComputePolicyAnnotation(Annotation(*c.pod, core::kAnnotationComputePolicy))
                           .value_or(core::ComputePolicy::kHard);
    r.priority =
        core::PriorityAnnotation(Annotation(*c.pod, core::kAnnotationPriority)).value_or(core::Priority::kLow);
    r.gpu_tenants = GpuTenantsLocked(r);
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
  t.record.dir = ContainerDir(t.record.pod_uid, t.record.container);
  t.record.region_dir = RegionDir(t.record.pod_uid, t.record.container);
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

// --- the container's files ----------------------------------------------------------------------------

std::string NodeAgent::ContainerDir(std::string_view pod_uid, std::string_view container) const {
  return (fs::path(config_.state_dir) / "containers" / pod_uid / container).string();
}

std::string NodeAgent::RegionDir(std::string_view pod_uid, std::string_view container) const {
  return (fs::path(config_.state_dir) / "regions" / pod_uid / container).string();
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
  fs::permissions(t->record.region_dir, fs::perms::all,
                  ec);  // container users of any UID create nothing here,
                        // but the hook may re-create a deleted region
  if (absl::Status s = WriteLimits(t->record); !s.ok()) return s;
  // The region itself (half a MiB, initialized and fsynced) is created by the next reconcile pass, off the
  // Allocate path; a hooked process that starts first creates it the same way (SharedRegion::Open publishes
  // a fully initialized file with link(2), so the two cannot clash).
  return records_.Save(t->record);
}

}  // namespace tessera::node

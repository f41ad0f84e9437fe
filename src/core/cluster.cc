#include "core/cluster.h"

#include <algorithm>
#include <limits>
#include <set>

#include "core/strings.h"

namespace tessera::core {

const char* ToString(Priority p) {
  return p == Priority::kHigh ? "high" : "low";
}
const char* ToString(ComputePolicy p) {
  return p == ComputePolicy::kElastic ? "elastic" : "hard";
}
std::optional<Priority> PriorityFromString(std::string_view s) {
  if (s == "low") return Priority::kLow;
  if (s == "high") return Priority::kHigh;
  return std::nullopt;
}
std::optional<ComputePolicy> ComputePolicyFromString(std::string_view s) {
  if (s == "hard") return ComputePolicy::kHard;
  if (s == "elastic") return ComputePolicy::kElastic;
  return std::nullopt;
}
const char* ToString(GpuHealth h) {
  return h == GpuHealth::kHealthy ? "healthy" : "unhealthy";
}

GpuMask NodeState::GpusOnNuma(int numa) const {
  for (const auto& [n, mask] : numa_masks_) {
    if (n == numa) return mask;
  }
  return GpuMask();
}

void NodeState::Recompute() {
  max_free_cores_ = MilliGpu(0);
  max_free_memory_ = MiB(0);
  total_free_cores_ = MilliGpu(0);
  total_free_memory_ = MiB(0);
  healthy_cores_ = MilliGpu(0);
  healthy_memory_ = MiB(0);
  whole_free_ = 0;
  tenant_count_ = 0;
  high_tenants_ = 0;
  for (int g = 0; g < gpu_count(); ++g) {
    for (const Tenant& t : tenants(g)) {
      ++tenant_count_;
      if (t.priority == Priority::kHigh) ++high_tenants_;
    }
    if (!healthy_.Has(g)) continue;
    max_free_cores_ = std::max(max_free_cores_, free_cores(g));
    max_free_memory_ = std::max(max_free_memory_, free_memory(g));
    total_free_cores_ += free_cores(g);
    total_free_memory_ += free_memory(g);
    healthy_cores_ += kWholeGpu;
    healthy_memory_ += memory(g);
    if (free_cores(g) >= kWholeGpu) ++whole_free_;
  }
}

bool NodeState::operator==(const NodeState& o) const {
  auto sorted = [](std::vector<std::pair<int, int>> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  return info_ == o.info_ && schedulable_ == o.schedulable_ && free_cores_ == o.free_cores_ &&
         free_memory_ == o.free_memory_ && tenants_ == o.tenants_ && healthy_ == o.healthy_ &&
         cpu_used_ == o.cpu_used_ && memory_used_ == o.memory_used_ &&
         sorted(pod_shapes_) == sorted(o.pod_shapes_);
}

int Cluster::InternModel(const std::string& model) {
  auto [it, inserted] = model_index_.try_emplace(model, static_cast<int>(models_.size()));
  if (inserted) models_.push_back(model);
  return it->second;
}

int Cluster::ModelId(std::string_view model) const {
  auto it = model_index_.find(std::string(model));
  return it == model_index_.end() ? -1 : it->second;
}

std::vector<int> Cluster::ModelIds(std::string_view model, bool substring) const {
  std::vector<int> out;
  if (!substring) {
    if (const int id = ModelId(model); id >= 0) out.push_back(id);
    return out;
  }
  const std::string word = AsciiLower(model);
  for (int id = 0; id < model_count(); ++id) {
    if (!word.empty() && AsciiLower(models_[static_cast<size_t>(id)]).find(word) != std::string::npos) {
      out.push_back(id);
    }
  }
  return out;
}

int Cluster::NodeIndex(const NodeName& name) const {
  auto it = node_index_.find(name.value());
  return it == node_index_.end() ? -1 : it->second;
}

const NodeState* Cluster::FindNode(const NodeName& name) const {
  int i = NodeIndex(name);
  return i < 0 ? nullptr : &nodes_[static_cast<size_t>(i)];
}

const NodeState* Cluster::FindNode(std::string_view name) const {
  // absl's string hash is transparent: no std::string is built (absl::string_view: this absl does not alias
  // std::string_view).
  auto it = node_index_.find(absl::string_view(name.data(), name.size()));
  return it == node_index_.end() ? nullptr : &nodes_[static_cast<size_t>(it->second)];
}

absl::Status Cluster::AddNode(NodeInfo info) {
  if (info.name.empty()) return absl::InvalidArgumentError("a node needs a name");
  if (node_index_.contains(info.name.value())) {
    return absl::AlreadyExistsError(StrCat("node ", info.name.value(), " is already in the cluster"));
  }
  const int n = static_cast<int>(info.gpus.size());
  if (n > kMaxGpusPerNode) {
    return absl::InvalidArgumentError(
        StrCat("node ", info.name.value(), " has ", n, " GPUs; at most ", kMaxGpusPerNode, " are supported"));
  }
  std::set<GpuUuid> uuids;
  for (int g = 0; g < n; ++g) {
    const GpuInfo& gpu = info.gpus[static_cast<size_t>(g)];
    if (gpu.index != g) {
      return absl::InvalidArgumentError(StrCat("node ", info.name.value(), ": GPU at position ", g,
                                               " has index ", gpu.index, "; indices must be 0..", n - 1,
                                               " in order"));
    }
    if (gpu.uuid.empty()) {
      return absl::InvalidArgumentError(StrCat("node ", info.name.value(), ": GPU ", g, " has no UUID"));
    }
    if (!uuids.insert(gpu.uuid).second) {
      return absl::InvalidArgumentError(
          StrCat("node ", info.name.value(), ": UUID ", gpu.uuid.value(), " appears twice"));
    }
    if (gpu.memory.value() <= 0) {
      return absl::InvalidArgumentError(
          StrCat("node ", info.name.value(), ": GPU ", g, " has no memory size (memoryMiB)"));
    }
    // The node's totals sum its GPUs' memory; the cap keeps 64 of them far from wrapping.
    if (gpu.memory > kMaxGpuMemory) {
      return absl::InvalidArgumentError(StrCat("node ", info.name.value(), ": GPU ", g, " has ",
                                               gpu.memory.value(), " MiB; no GPU has more than 2^40 MiB"));
    }
  }
  if (info.cpu.value() < 0 || info.cpu > kMaxNodeCpu || info.memory.value() < 0 ||
      info.memory > kMaxNodeMemory) {
    return absl::InvalidArgumentError(
        StrCat("node ", info.name.value(), ": CPU ", info.cpu.value(), " millicores or memory ",
               info.memory.value(), " MiB is negative or more than 2^40; check the node's capacity"));
  }
  if (info.links.size() == 0 && n > 0) info.links = LinkMatrix(n);
  if (info.links.size() != n) {
    return absl::InvalidArgumentError(StrCat("node ", info.name.value(), ": link matrix is ",
                                             info.links.size(), "x", info.links.size(), " but the node has ",
                                             n, " GPUs"));
  }
  NodeState state;
  if (n > 0) {
    absl::StatusOr<AccessCostTree> tree = AccessCostTree::Build(info.links);
    if (!tree.ok()) return tree.status();
    state.tree_ = *std::move(tree);
  }
  state.gpu_count_ = n;
  state.schedulable_ = info.schedulable;
  state.cpu_capacity_ = info.cpu;
  state.memory_capacity_ = info.memory;
  for (int g = 0; g < n; ++g) {
    const GpuInfo& gpu = info.gpus[static_cast<size_t>(g)];
    state.free_cores_[static_cast<size_t>(g)] = kWholeGpu;
    state.free_memory_[static_cast<size_t>(g)] = gpu.memory;
    state.memory_[static_cast<size_t>(g)] = gpu.memory;
    state.model_ids_[static_cast<size_t>(g)] = InternModel(gpu.model);
    if (gpu.health == GpuHealth::kHealthy) state.healthy_.Add(g);
    auto numa = std::find_if(state.numa_masks_.begin(), state.numa_masks_.end(),
                             [&](const auto& p) { return p.first == gpu.numa_node; });
    if (numa == state.numa_masks_.end()) {
      state.numa_masks_.emplace_back(gpu.numa_node, GpuMask::Of(g));
      state.numa_list_.push_back(gpu.numa_node);
    } else {
      numa->second.Add(g);
    }
  }
  state.distinct_models_.assign(state.model_ids_.begin(), state.model_ids_.begin() + n);
  std::sort(state.distinct_models_.begin(), state.distinct_models_.end());
  state.distinct_models_.erase(std::unique(state.distinct_models_.begin(), state.distinct_models_.end()),
                               state.distinct_models_.end());
  if (state.distinct_models_.size() == 1) state.single_model_ = state.distinct_models_[0];
  state.uniform_memory_ = n > 0 ? state.memory_[0] : MiB(0);
  for (int g = 1; g < n; ++g) {
    if (state.memory_[static_cast<size_t>(g)] != state.uniform_memory_) state.uniform_memory_ = MiB(0);
  }
  state.tenants_.resize(static_cast<size_t>(n));
  state.info_ = std::move(info);
  state.Recompute();
  node_index_[state.info_.name.value()] = static_cast<int>(nodes_.size());
  nodes_.push_back(std::move(state));
  versions_.push_back(0);
  Touch(nodes_.back());
  return absl::OkStatus();
}

absl::Status Cluster::RemoveNode(const NodeName& name) {
  int i = NodeIndex(name);
  if (i < 0) return absl::NotFoundError(StrCat("no node ", name.value()));
  for (const auto& [uid, record] : pods_) {
    if (record.node == i) {
      return absl::FailedPreconditionError(
          StrCat("node ", name.value(), " still holds pod ", uid.value(), "; release its pods first"));
    }
  }
  const int last = static_cast<int>(nodes_.size()) - 1;
  if (i != last) {
    std::swap(nodes_[static_cast<size_t>(i)], nodes_[static_cast<size_t>(last)]);
    node_index_[nodes_[static_cast<size_t>(i)].name().value()] = i;
    for (auto& [uid, record] : pods_) {
      if (record.node == last) record.node = i;
    }
    // What caches remembered for position i was about the removed node.
    Touch(nodes_[static_cast<size_t>(i)]);
  }
  node_index_.erase(name.value());
  nodes_.pop_back();
  versions_.pop_back();
  return absl::OkStatus();
}

absl::Status Cluster::SetGpuHealth(const NodeName& node, const GpuUuid& gpu, GpuHealth health) {
  int i = NodeIndex(node);
  if (i < 0) return absl::NotFoundError(StrCat("no node ", node.value()));
  NodeState& state = nodes_[static_cast<size_t>(i)];
  for (GpuInfo& info : state.info_.gpus) {
    if (info.uuid == gpu) {
      info.health = health;
      if (health == GpuHealth::kHealthy) {
        state.healthy_.Add(info.index);
      } else {
        state.healthy_.Remove(info.index);
      }
      state.Recompute();
      Touch(state);
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(StrCat("node ", node.value(), " has no GPU ", gpu.value()));
}

absl::Status Cluster::SetSchedulable(const NodeName& node, bool schedulable) {
  int i = NodeIndex(node);
  if (i < 0) return absl::NotFoundError(StrCat("no node ", node.value()));
  nodes_[static_cast<size_t>(i)].info_.schedulable = schedulable;
  nodes_[static_cast<size_t>(i)].schedulable_ = schedulable;
  Touch(nodes_[static_cast<size_t>(i)]);
  return absl::OkStatus();
}

const Placement* Cluster::FindPlacement(const PodUid& pod) const {
  auto it = pods_.find(pod);
  return it == pods_.end() ? nullptr : &it->second.placement;
}

namespace {

// Memory a vGPU takes from its GPU's ledger: an exclusive tenant takes all of it.
MiB AccountedMemory(const VGpuAssignment& v, const GpuInfo& gpu) {
  return v.cores == kWholeGpu ? gpu.memory : v.memory;
}

}  // namespace

absl::Status Cluster::Commit(const PodRequest& request, const Placement& placement) {
  if (pods_.contains(request.uid)) {
    return absl::AlreadyExistsError(
        StrCat("pod ", request.FullName(), " (", request.uid.value(), ") is already placed"));
  }
  const int ni = NodeIndex(placement.node);
  if (ni < 0) return absl::NotFoundError(StrCat("no node ", placement.node.value()));
  NodeState& node = nodes_[static_cast<size_t>(ni)];
  const std::string where = StrCat("pod ", request.FullName(), " on node ", node.name().value());
  if (request.cpu.value() < 0 || request.memory.value() < 0) {
    return absl::InvalidArgumentError(StrCat(where, ": negative CPU or host memory"));
  }

  // Validate on copies, then apply.
  std::array<MilliGpu, kMaxGpusPerNode> free_cores = node.free_cores_;
  std::array<MiB, kMaxGpusPerNode> free_memory = node.free_memory_;
  std::vector<Tenant*> compressed;  // the tenant of each compression, found while validating
  for (const Compression& c : placement.compressions) {
    if (c.gpu_index < 0 || c.gpu_index >= node.gpu_count()) {
      return absl::InvalidArgumentError(StrCat(where, ": compression names GPU ", c.gpu_index));
    }
    Tenant* t = nullptr;
    for (Tenant& x : node.tenants_[static_cast<size_t>(c.gpu_index)]) {
      if (x.id == c.tenant) t = &x;
    }
    if (std::find(compressed.begin(), compressed.end(), t) != compressed.end()) {
      return absl::InvalidArgumentError(StrCat(where, ": ", c.tenant.pod.value(), "/", c.tenant.container,
                                               " is compressed twice on GPU ", c.gpu_index));
    }
    if (t == nullptr || t->cores != c.old_cores || c.new_cores > c.old_cores || c.new_cores.value() < 1 ||
        t->priority != Priority::kLow) {
      return absl::FailedPreconditionError(
          StrCat(where, ": cannot compress ", c.tenant.pod.value(), "/", c.tenant.container, " on GPU ",
                 c.gpu_index, " from ", c.old_cores.value(), " to ", c.new_cores.value(),
                 " (it must be a low-priority tenant holding exactly the old share)"));
    }
    free_cores[static_cast<size_t>(c.gpu_index)] += c.old_cores - c.new_cores;
    compressed.push_back(t);
  }
  for (const ContainerAssignment& ca : placement.containers) {
    GpuMask seen;
    for (const VGpuAssignment& v : ca.vgpus) {
      if (v.gpu_index < 0 || v.gpu_index >= node.gpu_count()) {
        return absl::InvalidArgumentError(StrCat(where, ": container ", ca.name, " names GPU ", v.gpu_index,
                                                 "; the node has ", node.gpu_count()));
      }
      const GpuInfo& gpu = node.gpu(v.gpu_index);
      if (!v.uuid.empty() && v.uuid != gpu.uuid) {
        return absl::FailedPreconditionError(
            StrCat(where, ": GPU ", v.gpu_index, " is ", gpu.uuid.value(), ", not ", v.uuid.value()));
      }
      if (seen.Has(v.gpu_index)) {
        return absl::InvalidArgumentError(
            StrCat(where, ": container ", ca.name, " has two vGPUs on GPU ", v.gpu_index));
      }
      seen.Add(v.gpu_index);
      if (v.cores.value() < 1 || v.cores > kWholeGpu) {
        return absl::InvalidArgumentError(StrCat(where, ": share ", v.cores.value(), " is outside 1..1000"));
      }
      MilliGpu& fc = free_cores[static_cast<size_t>(v.gpu_index)];
      MiB& fm = free_memory[static_cast<size_t>(v.gpu_index)];
      const MiB mem = AccountedMemory(v, gpu);
      if (fc < v.cores || fm < mem) {
        return absl::ResourceExhaustedError(StrCat(where, ": GPU ", v.gpu_index, " has ", fc.value(),
                                                   "/1000 share and ", fm.value(), " MiB free; ",
                                                   v.cores.value(), " and ", mem.value(), " MiB needed"));
      }
      fc -= v.cores;
      fm -= mem;
    }
  }
  if (node.tracks_cpu() && request.cpu > node.free_cpu()) {
    return absl::ResourceExhaustedError(
        StrCat(where, ": ", node.free_cpu().value(), " millicores free, ", request.cpu.value(), " needed"));
  }
  if (node.tracks_host_memory() && request.memory > node.free_host_memory()) {
    return absl::ResourceExhaustedError(StrCat(where, ": ", node.free_host_memory().value(),
                                               " MiB host memory free, ", request.memory.value(), " needed"));
  }

  // Apply.
  for (size_t i = 0; i < placement.compressions.size(); ++i) {
    const Compression& c = placement.compressions[i];
    compressed[i]->cores = c.new_cores;
    auto rec = pods_.find(c.tenant.pod);
    if (rec != pods_.end()) {
      for (ContainerAssignment& ca : rec->second.placement.containers) {
        if (ca.name != c.tenant.container) continue;
        for (VGpuAssignment& v : ca.vgpus) {
          if (v.gpu_index != c.gpu_index) continue;
          v.requested = v.requested_or_cores();
          v.cores = c.new_cores;
        }
      }
    }
  }
  node.free_cores_ = free_cores;
  node.free_memory_ = free_memory;
  for (const ContainerAssignment& ca : placement.containers) {
    for (const VGpuAssignment& v : ca.vgpus) {
      const GpuInfo& gpu = node.gpu(v.gpu_index);
      Tenant t;
      t.id = TenantId{request.uid, ca.name};
      t.ns = request.ns;
      t.priority = request.priority;
      t.requested = v.requested_or_cores();
      t.cores = v.cores;
      t.memory = AccountedMemory(v, gpu);
      t.memory_limit = v.memory;
      quota_used_[{request.ns, node.model_id(v.gpu_index)}] += t.requested.value();
      node.tenants_[static_cast<size_t>(v.gpu_index)].push_back(std::move(t));
    }
  }
  // Counted only where the node has a capacity: there the checks above bound the sum by it. An unbounded node
  // would sum every pod's CPU, and enough of them wrap.
  if (node.tracks_cpu()) node.cpu_used_ += request.cpu;
  if (node.tracks_host_memory()) node.memory_used_ += request.memory;
  const int shape = PodShapeTag(request);
  if (shape != kNoGpuShape) {
    auto it = std::find_if(node.pod_shapes_.begin(), node.pod_shapes_.end(),
                           [&](const auto& p) { return p.first == shape; });
    if (it == node.pod_shapes_.end()) {
      node.pod_shapes_.emplace_back(shape, 1);
    } else {
      ++it->second;
    }
  }
  node.Recompute();
  Touch(node);
  PodRecord record;
  record.node = ni;
  record.shape = shape;
  record.ns = request.ns;
  record.placement = placement;
  record.placement.compressions.clear();  // applied; what stays is the pod's own shares
  record.cpu = request.cpu;
  record.memory = request.memory;
  pods_.emplace(request.uid, std::move(record));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ShareChange>> Cluster::Release(const PodUid& pod) {
  auto it = pods_.find(pod);
  if (it == pods_.end()) return absl::NotFoundError(StrCat("pod ", pod.value(), " is not placed"));
  PodRecord record = std::move(it->second);
  pods_.erase(it);
  NodeState& node = nodes_[static_cast<size_t>(record.node)];
  GpuMask touched;
  for (const ContainerAssignment& ca : record.placement.containers) {
    const TenantId id{pod, ca.name};
    for (const VGpuAssignment& v : ca.vgpus) {
      auto& tenants = node.tenants_[static_cast<size_t>(v.gpu_index)];
      auto t = std::find_if(tenants.begin(), tenants.end(), [&](const Tenant& x) { return x.id == id; });
      if (t == tenants.end()) continue;
      node.free_cores_[static_cast<size_t>(v.gpu_index)] += t->cores;
      node.free_memory_[static_cast<size_t>(v.gpu_index)] += t->memory;
      quota_used_[{record.ns, node.model_id(v.gpu_index)}] -= t->requested.value();
      tenants.erase(t);
      touched.Add(v.gpu_index);
    }
  }
  if (node.tracks_cpu()) node.cpu_used_ -= record.cpu;
  if (node.tracks_host_memory()) node.memory_used_ -= record.memory;
  if (record.shape != kNoGpuShape) {
    auto shape = std::find_if(node.pod_shapes_.begin(), node.pod_shapes_.end(),
                              [&](const auto& p) { return p.first == record.shape; });
    if (shape != node.pod_shapes_.end() && --shape->second == 0) node.pod_shapes_.erase(shape);
  }

  // Give compressed tenants their share back, largest shortfall first.
  std::vector<ShareChange> changes;
  for (int g : touched) {
    auto& tenants = node.tenants_[static_cast<size_t>(g)];
    std::vector<Tenant*> short_of;
    for (Tenant& t : tenants) {
      if (t.cores < t.requested) short_of.push_back(&t);
    }
    std::stable_sort(short_of.begin(), short_of.end(), [](const Tenant* a, const Tenant* b) {
      return (a->requested - a->cores) > (b->requested - b->cores);
    });
    MilliGpu& free = node.free_cores_[static_cast<size_t>(g)];
    for (Tenant* t : short_of) {
      MilliGpu back = std::min(t->requested - t->cores, free);
      if (back.value() <= 0) break;
      changes.push_back({t->id, g, t->cores, t->cores + back});
      t->cores += back;
      free -= back;
      auto rec = pods_.find(t->id.pod);
      if (rec != pods_.end()) {
        for (ContainerAssignment& ca : rec->second.placement.containers) {
          if (ca.name != t->id.container) continue;
          for (VGpuAssignment& v : ca.vgpus) {
            if (v.gpu_index != g) continue;
            v.cores = t->cores;
            v.requested = t->cores < t->requested ? t->requested : MilliGpu(0);
          }
        }
      }
    }
  }
  node.Recompute();
  Touch(node);
  return changes;
}

void Cluster::SetQuota(const Namespace& ns, std::string_view model, MilliGpu limit) {
  quota_[{ns, InternModel(std::string(model))}] = limit;
}

std::optional<MilliGpu> Cluster::Quota(const Namespace& ns, int model_id) const {
  auto it = quota_.find({ns, model_id});
  if (it == quota_.end()) return std::nullopt;
  return it->second;
}

MilliGpu Cluster::QuotaUsed(const Namespace& ns, int model_id) const {
  int64_t used = 0;
  if (auto it = quota_used_.find({ns, model_id}); it != quota_used_.end()) used += it->second;
  if (auto it = quota_elsewhere_.find({ns, model_id}); it != quota_elsewhere_.end()) used += it->second;
  return MilliGpu(static_cast<int32_t>(std::clamp<int64_t>(used, 0, std::numeric_limits<int32_t>::max())));
}

void Cluster::SetQuotaHeldElsewhere(std::span<const QuotaStanding> held) {
  quota_elsewhere_.clear();
  for (const QuotaStanding& h : held) {
    // Clamped per entry: a figure from outside never wraps the sum, nor frees quota by being negative.
    const int64_t milli = std::clamp<int64_t>(h.held_elsewhere, 0, int64_t{1} << 40);
    if (milli > 0) quota_elsewhere_[{h.ns, InternModel(h.model)}] += milli;
  }
}

std::vector<QuotaStanding> Cluster::QuotaStandings() const {
  std::map<std::pair<std::string, std::string>, QuotaStanding> by_key;
  auto at = [&](const Namespace& ns, int model) -> QuotaStanding& {
    QuotaStanding& q = by_key[{ns.value(), models_[static_cast<size_t>(model)]}];
    q.ns = ns;
    q.model = models_[static_cast<size_t>(model)];
    return q;
  };
  for (const auto& [key, limit] : quota_) at(key.first, key.second).limit = limit;
  for (const auto& [key, used] : quota_used_) {
    if (used != 0) at(key.first, key.second).held_here = used;
  }
  for (const auto& [key, used] : quota_elsewhere_) at(key.first, key.second).held_elsewhere = used;
  std::vector<QuotaStanding> out;
  for (auto& [key, q] : by_key) out.push_back(std::move(q));
  return out;
}

}  // namespace tessera::core

#include "scheduler/cluster_cache.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <thread>

#include "core/placement/policy.h"
#include "core/strings.h"
#include "formats/assignment.h"

namespace tessera::scheduler {

using core::NodeName;
using core::PodUid;

struct ClusterCache::State {
  core::Cluster cluster;
  std::string policy_name;
  core::PolicyContext context;  // what `policy` was built from
  std::unique_ptr<core::Policy> policy;
  std::unique_ptr<core::Placer> placer;
  core::EvaluationCache evaluations;  // valid for `policy`; cleared when it is rebuilt
  core::Rng rng{1};
  std::deque<core::PodRequest> workload;
  std::unordered_map<PodUid, size_t> in_workload;  // pods in `workload`, so that a pod counts once
  size_t since_rebuild = 0;
  int models_at_rebuild = -1;
  uint64_t policy_generation = 0;  // counts rebuilds
  // What the policy last observed (Policy::Observe): the policy, and the cluster by its last node version and
  // node count. Filter and prioritize of one pod come in a row with nothing changed between them, and
  // observing 5,000 nodes each time was 5% of the verbs' time.
  uint64_t observed_generation = ~uint64_t{0};
  uint64_t observed_version = 0;
  int observed_nodes = -1;
  // Warming (CacheOptions::warm_shapes): the last distinct pod shapes seen (by CompiledRequest fingerprint),
  // with when each was last seen and how many pods apart its pods come (to warm the shape due soonest first);
  // the policy and state_key the warming thread was last woken for; whether it has work.
  struct Shape {
    uint64_t fingerprint = 0;
    core::PodRequest request;  // its last pod
    uint64_t last_seen = 0;    // shape_clock then
    double gap = 0;            // pods between two of its pods, a moving average; 0: seen once
  };
  std::vector<Shape> shapes;
  uint64_t shape_clock = 0;  // pods seen (filter and prioritize of one pod count once)
  PodUid last_shape_pod;
  uint64_t warm_generation = ~uint64_t{0};
  uint64_t warm_state_key = 0;
  bool warm_due = false;
  bool warming = false;  // the thread is at work on what was due
  bool stop = false;
  uint64_t warmed = 0;    // evaluations made by the thread
  core::Rng warm_rng{1};  // its own: the verbs' Rng sequence stays what it would be without warming
  std::unordered_map<PodUid, PodEntry> pods;
  std::map<std::string, PodEntry> orphans;  // uid -> a pod whose node or GPUs are gone
  std::set<PodUid> changed;  // pods whose shares changed under them (compressed, or given back)
};

namespace {

// The cache's lock, taken by every method but the warming thread's loop: it counts the caller among those
// waiting for the lock while it waits, and the warming thread lets each of them go first.
class ABSL_SCOPED_LOCKABLE CacheLock {
 public:
  CacheLock(Mutex* mu, std::atomic<int>* waiting) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    waiting->fetch_add(1, std::memory_order_relaxed);
    mu_->Lock();
    waiting->fetch_sub(1, std::memory_order_relaxed);
  }
  ~CacheLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  CacheLock(const CacheLock&) = delete;
  CacheLock& operator=(const CacheLock&) = delete;

 private:
  Mutex* mu_;
};

}  // namespace

std::chrono::steady_clock::time_point ClusterCache::SteadyNow() const {
  return options_.clock->Steady();
}

ClusterCache::ClusterCache(CacheOptions options)
    : options_(std::move(options)), state_(std::make_unique<State>()) {
  uint64_t seed = options_.seed;
  if (seed == 0)
    seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) | 1;
  state_->rng = core::Rng(seed);
  {
    CacheLock lock(&mu_, &waiting_);
    RebuildPolicyLocked();
  }
  if (options_.warm_shapes > 0) warm_thread_ = std::thread([this] { WarmLoop(); });
}

ClusterCache::~ClusterCache() {
  if (warm_thread_.joinable()) {
    {
      CacheLock lock(&mu_, &waiting_);
      state_->stop = true;
    }
    warm_cv_.SignalAll();
    warm_idle_cv_.SignalAll();
    warm_thread_.join();
  }
}

void ClusterCache::NoteShapeLocked(const core::PodRequest& request, uint64_t fingerprint) {
  State& s = *state_;
  if (options_.warm_shapes == 0 || !s.policy->deterministic()) return;
  if (request.uid != s.last_shape_pod) {
    s.last_shape_pod = request.uid;
    ++s.shape_clock;
  }
  auto shape = std::find_if(s.shapes.begin(), s.shapes.end(),
                            [&](const State::Shape& k) { return k.fingerprint == fingerprint; });
  if (shape == s.shapes.end()) {
    if (s.shapes.size() >= options_.warm_shapes) {  // forget the one seen longest ago
      s.shapes.erase(std::min_element(s.shapes.begin(), s.shapes.end(), [](const auto& a, const auto& b) {
        return a.last_seen < b.last_seen;
      }));
    }
    s.shapes.push_back({fingerprint, request, s.shape_clock, 0});
  } else if (shape->last_seen != s.shape_clock) {
    const auto gap = static_cast<double>(s.shape_clock - shape->last_seen);
    shape->gap = shape->gap == 0 ? gap : 0.75 * shape->gap + 0.25 * gap;
    shape->last_seen = s.shape_clock;
    shape->request = request;
  }
  if (s.warm_generation != s.policy_generation || s.warm_state_key != s.policy->state_key()) {
    s.warm_generation = s.policy_generation;
    s.warm_state_key = s.policy->state_key();
    s.warm_due = true;
    warm_cv_.Signal();
  }
}

void ClusterCache::WarmLoop() {
  // Nodes evaluated per hold of the lock: about 0.5 ms while the policy's per-node views are cold (tessera:
  // 16 us a node over a full workload window), some 20 us once they are warm.
  constexpr int kNodesPerHold = 32;
  mu_.Lock();
  State& s = *state_;
  while (true) {
    while (!s.stop && !s.warm_due) warm_cv_.Wait(&mu_);
    if (s.stop) break;
    s.warm_due = false;
    s.warming = true;
    // The shape whose next pod is due soonest first: its usual gap less the pods since it was last seen. Pods
    // of a few shapes in turn come in the order they were last seen, pods of one frequent shape come at once;
    // warming in the order of recency came last for the former. Only shapes that come back: seen twice at
    // least, and within the last `rebuild_after` pods (a shape of the past is not worth 5,000 evaluations
    // after every rebuild; under load they took 12% of the pods/s).
    std::vector<std::pair<double, const core::PodRequest*>> order;
    for (const State::Shape& k : s.shapes) {
      const auto age = static_cast<double>(s.shape_clock - k.last_seen);
      if (k.gap == 0 || age > static_cast<double>(std::max<size_t>(options_.rebuild_after, 1))) continue;
      order.emplace_back(k.gap - age, &k.request);
    }
    std::stable_sort(order.begin(), order.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<core::PodRequest> shapes;
    for (const auto& [due, request] : order) shapes.push_back(*request);
    core::NodeFit scratch;
    // Stop as soon as what is warmed would go stale: a verb has marked a newer state due (NoteShapeLocked),
    // or the cluster moved the policy's state_key (then mark it here).
    for (size_t k = 0; k < shapes.size(); ++k) {
      for (int next = 0; !s.stop && !s.warm_due && next < s.cluster.node_count();) {
        ObserveLocked();  // what the verbs would read first; nothing when the cluster did not change
        if (s.policy->state_key() != s.warm_state_key) {
          s.warm_state_key = s.policy->state_key();
          s.warm_due = true;
          break;
        }
        const core::CompiledRequest compiled(s.cluster, shapes[k]);
        const int end = std::min(next + kNodesPerHold, s.cluster.node_count());
        for (; next < end; ++next) {
          s.placer->EvaluateCached(s.cluster, s.cluster.nodes()[static_cast<size_t>(next)], compiled,
                                   s.warm_rng, &s.evaluations, scratch);
          ++s.warmed;
        }
        // Whoever waits for the lock goes first: warming is for them. (Not a yield each time: on a loaded
        // machine each one gave the core away for a whole time slice, and warming never caught up.)
        if (waiting_.load(std::memory_order_relaxed) > 0) {
          mu_.Unlock();
          std::this_thread::sleep_for(std::chrono::microseconds(50));
          mu_.Lock();
        }
      }
    }
    s.warming = false;
    warm_idle_cv_.SignalAll();
  }
  mu_.Unlock();
}

void ClusterCache::WaitForWarming() const {
  CacheLock lock(&mu_, &waiting_);
  while (!state_->stop && (state_->warm_due || state_->warming)) warm_idle_cv_.Wait(&mu_);
}

uint64_t ClusterCache::warmed_evaluations() const {
  CacheLock lock(&mu_, &waiting_);
  return state_->warmed;
}

void ClusterCache::RebuildPolicyLocked() {
  State& s = *state_;
  std::vector<core::PodRequest> workload(s.workload.begin(), s.workload.end());
  s.context = core::MakePolicyContext(s.cluster, workload);
  absl::StatusOr<std::unique_ptr<core::Policy>> policy = core::MakePolicy(options_.policy, s.context);
  if (!policy.ok()) {
    // The name was checked when the scheduler started (see ValidatePolicyName); a policy that cannot be built
    // yet falls back to binpack until it can.
    policy = core::MakePolicy("binpack");
  }
  s.policy = *std::move(policy);
  s.policy_name = std::string(s.policy->name());
  s.placer = std::make_unique<core::Placer>(*s.policy, options_.placement);
  s.evaluations.Clear();
  ++s.policy_generation;
  s.since_rebuild = 0;
  s.models_at_rebuild = s.cluster.model_count();
}

void ClusterCache::MaybeRebuildPolicyLocked() {
  const State& s = *state_;
  // While the window fills (a scheduler just started), rebuild each time the workload doubles, so that the
  // first pods are not placed for an empty workload; then every `rebuild_after` pods.
  const size_t due = std::min(options_.rebuild_after, std::max<size_t>(1, s.workload.size() / 2));
  if (s.since_rebuild >= due || s.models_at_rebuild != s.cluster.model_count()) {
    RebuildPolicyLocked();
  }
}

// What the policy weighs from the cluster as a whole (tessera: how full each GPU model is), read before each
// pod as Placer::Place does; answers cached under another reading are not reused (state_key). Observe reads
// nothing but the cluster, so an unchanged cluster needs no second reading.
void ClusterCache::ObserveLocked() {
  State& s = *state_;
  if (s.observed_generation == s.policy_generation && s.observed_version == s.cluster.last_version() &&
      s.observed_nodes == s.cluster.node_count()) {
    return;
  }
  s.policy->Observe(s.cluster);
  s.observed_generation = s.policy_generation;
  s.observed_version = s.cluster.last_version();
  s.observed_nodes = s.cluster.node_count();
}

void ClusterCache::NoteWorkloadLocked(const core::PodRequest& request) {
  State& s = *state_;
  if (!request.wants_gpu() || s.in_workload.contains(request.uid)) return;
  s.workload.push_back(request);
  s.in_workload[request.uid] = 1;
  if (s.workload.size() > options_.workload_window) {
    s.in_workload.erase(s.workload.front().uid);
    s.workload.pop_front();
  }
  ++s.since_rebuild;
}

void ClusterCache::NoteWorkload(const core::PodRequest& request) {
  CacheLock lock(&mu_, &waiting_);
  NoteWorkloadLocked(request);
}

absl::Status ClusterCache::UpsertNode(core::NodeInfo info) {
  CacheLock lock(&mu_, &waiting_);
  State& s = *state_;
  const core::NodeState* existing = s.cluster.FindNode(info.name);
  if (existing != nullptr) {
    const core::NodeInfo& old = existing->info();
    bool same_hardware = old.gpus.size() == info.gpus.size() && old.links == info.links &&
                         old.cpu == info.cpu && old.memory == info.memory && old.numa_cpus == info.numa_cpus;
    for (size_t g = 0; same_hardware && g < info.gpus.size(); ++g) {
      const core::GpuInfo& a = old.gpus[g];
      const core::GpuInfo& b = info.gpus[g];
      same_hardware = a.uuid == b.uuid && a.index == b.index && a.model == b.model && a.memory == b.memory &&
                      a.numa_node == b.numa_node;
    }
    if (same_hardware) {
      for (const core::GpuInfo& g : info.gpus) {
        if (absl::Status st = s.cluster.SetGpuHealth(info.name, g.uuid, g.health); !st.ok()) return st;
      }
      return s.cluster.SetSchedulable(info.name, info.schedulable);
    }
    // The hardware changed: rebuild the node and record its pods again.
    std::vector<PodUid> on_node;
    for (const auto& [uid, entry] : s.pods) {
      if (entry.placement.node == info.name) on_node.push_back(uid);
    }
    std::vector<PodEntry> entries;
    for (const PodUid& uid : on_node) {
      entries.push_back(s.pods[uid]);
      (void)s.cluster.Release(uid);
      s.pods.erase(uid);
    }
    if (absl::Status st = s.cluster.RemoveNode(info.name); !st.ok()) return st;
    if (absl::Status st = s.cluster.AddNode(info); !st.ok()) return st;
    for (PodEntry& e : entries) {
      const PodUid uid = e.request.uid;
      if (!RecordLocked(e.request, e.placement).ok()) s.orphans[uid.value()] = std::move(e);
    }
    return absl::OkStatus();
  }
  if (absl::Status st = s.cluster.AddNode(std::move(info)); !st.ok()) return st;
  // Pods that waited for this node (their node was removed and has come back).
  std::vector<std::string> adopt;
  for (const auto& [uid, entry] : s.orphans) adopt.push_back(uid);
  for (const std::string& uid : adopt) {
    PodEntry e = s.orphans[uid];
    if (RecordLocked(e.request, e.placement).ok()) s.orphans.erase(uid);
  }
  return absl::OkStatus();
}

void ClusterCache::RemoveNode(const NodeName& name) {
  CacheLock lock(&mu_, &waiting_);
  State& s = *state_;
  std::vector<PodUid> on_node;
  for (const auto& [uid, entry] : s.pods) {
    if (entry.placement.node == name) on_node.push_back(uid);
  }
  for (const PodUid& uid : on_node) {
    s.orphans[uid.value()] = s.pods[uid];
    (void)s.cluster.Release(uid);
    s.pods.erase(uid);
  }
  (void)s.cluster.RemoveNode(name);
}

absl::Status ClusterCache::SetSchedulable(const NodeName& name, bool schedulable) {
  CacheLock lock(&mu_, &waiting_);
  return state_->cluster.SetSchedulable(name, schedulable);
}

void ClusterCache::SetQuota(const core::Namespace& ns, std::string_view model, core::MilliGpu limit) {
  CacheLock lock(&mu_, &waiting_);
  state_->cluster.SetQuota(ns, model, limit);
}

void ClusterCache::ReplaceQuotas(
    const std::vector<std::tuple<core::Namespace, std::string, core::MilliGpu>>& quotas) {
  CacheLock lock(&mu_, &waiting_);
  state_->cluster.ClearQuotas();
  for (const auto& [ns, model, limit] : quotas) state_->cluster.SetQuota(ns, model, limit);
}

// Resolves GPU indices from UUIDs (the node's order may differ from the one the assignment was written with)
// and commits.
absl::Status ClusterCache::RecordLocked(const core::PodRequest& request, core::Placement placement) {
  State& s = *state_;
  const core::NodeState* node = s.cluster.FindNode(placement.node);
  if (node == nullptr) {
    return absl::NotFoundError(StrCat("pod ", request.FullName(), " is assigned to node ",
                                      placement.node.value(),
                                      ", which the scheduler does not know (no Tessera inventory on it)"));
  }
  for (core::ContainerAssignment& c : placement.containers) {
    for (core::VGpuAssignment& v : c.vgpus) {
      int index = -1;
      for (int g = 0; g < node->gpu_count(); ++g) {
        if (node->gpu(g).uuid == v.uuid) index = g;
      }
      if (index < 0) {
        return absl::NotFoundError(StrCat("pod ", request.FullName(), " is assigned GPU ", v.uuid.value(),
                                          ", which node ", placement.node.value(), " does not have"));
      }
      v.gpu_index = index;
    }
  }
  if (absl::Status st = s.cluster.Commit(request, placement); !st.ok()) return st;
  const core::Placement* recorded = s.cluster.FindPlacement(request.uid);
  s.pods[request.uid] = PodEntry{request, *recorded, false, {}};
  return absl::OkStatus();
}

void ClusterCache::ReleaseLocked(const PodUid& uid) {
  State& s = *state_;
  s.orphans.erase(uid.value());
  if (!s.pods.contains(uid)) return;
  absl::StatusOr<std::vector<core::ShareChange>> changes = s.cluster.Release(uid);
  s.pods.erase(uid);
  if (!changes.ok()) return;
  // Tenants whose share came back: their records follow the cluster's.
  for (const core::ShareChange& c : *changes) {
    auto it = s.pods.find(c.tenant.pod);
    if (it == s.pods.end()) continue;
    if (const core::Placement* p = s.cluster.FindPlacement(c.tenant.pod))
      it->second.placement.containers = p->containers;
    it->second.unwritten = true;
    s.changed.insert(c.tenant.pod);
  }
}

absl::Status ClusterCache::ObservePod(const formats::PodObject& pod) {
  absl::StatusOr<core::PodRequest> request = core::ParsePodRequest(pod.spec, options_.parse);
  CacheLock lock(&mu_, &waiting_);
  State& s = *state_;
  const PodUid uid(pod.spec.uid);
  if (!request.ok()) {
    ReleaseLocked(uid);
    return request.status();
  }
  NoteWorkloadLocked(*request);
  auto annotation = pod.spec.annotations.find(formats::kAnnotationAssignment);
  const bool holds = !pod.node_name.empty() && !pod.terminated() && annotation != pod.spec.annotations.end();
  if (!holds) {
    // A pod we hold, seen unbound and not finished: an event from before our bind, delivered after it (a pod
    // never loses its node once bound). Our reservation or record stays; the bound state follows.
    auto it = s.pods.find(uid);
    if (it != s.pods.end() && pod.node_name.empty() && !pod.terminated()) return absl::OkStatus();
    ReleaseLocked(uid);
    return absl::OkStatus();
  }
  absl::StatusOr<formats::Assignment> assignment = formats::ParseAssignment(annotation->second);
  if (!assignment.ok()) {
    ReleaseLocked(uid);
    return assignment.status();
  }
  if (assignment->node.value() != pod.node_name) {
    ReleaseLocked(uid);
    return absl::FailedPreconditionError(StrCat("pod ", request->FullName(), " runs on node ", pod.node_name,
                                                " but its assignment names node ", assignment->node.value()));
  }
  core::Placement placement = formats::ToPlacement(*assignment);
  auto it = s.pods.find(uid);
  if (it != s.pods.end()) {
    // Known: our own reservation confirmed by the API, or a record seen before. Keep it when it says the
    // same.
    it->second.reserved = false;
    bool same = it->second.placement.node == placement.node &&
                it->second.placement.containers.size() == placement.containers.size();
    for (size_t c = 0; same && c < placement.containers.size(); ++c) {
      const auto& a = it->second.placement.containers[c].vgpus;
      const auto& b = placement.containers[c].vgpus;
      same = a.size() == b.size();
      for (size_t k = 0; same && k < a.size(); ++k) {
        same = a[k].uuid == b[k].uuid && a[k].cores == b[k].cores && a[k].memory == b[k].memory;
      }
    }
    if (same) {
      it->second.unwritten = false;
      return absl::OkStatus();
    }
    // An event from before our own rewrite of its shares: the record is newer, and the write is on its way.
    if (it->second.unwritten) return absl::OkStatus();
    ReleaseLocked(uid);
  }
  s.orphans.erase(uid.value());
  absl::Status st = RecordLocked(*request, std::move(placement));
  if (!st.ok() && absl::IsNotFound(st)) {
    // Its node (or GPU) is not known yet: keep it aside until the node's inventory arrives.
    formats::Assignment copy = *assignment;
    s.orphans[uid.value()] = PodEntry{*request, formats::ToPlacement(copy), false, {}};
  }
  return st;
}

void ClusterCache::ForgetPod(const PodUid& uid) {
  CacheLock lock(&mu_, &waiting_);
  ReleaseLocked(uid);
}

FilterOutcome ClusterCache::Filter(const core::PodRequest& request, std::span<const std::string> nodes) {
  const std::vector<std::string_view> views(nodes.begin(), nodes.end());
  FilterVerdicts v = FilterAt(request, views);
  FilterOutcome out;
  for (uint32_t k : v.fits) out.fits.push_back(nodes[k]);
  for (auto& [k, why] : v.failed) out.failed[nodes[k]] = std::move(why);
  for (auto& [k, why] : v.unresolvable) out.unresolvable[nodes[k]] = std::move(why);
  return out;
}

FilterVerdicts ClusterCache::FilterAt(const core::PodRequest& request,
                                      std::span<const std::string_view> nodes) {
  CacheLock lock(&mu_, &waiting_);
  State& s = *state_;
  NoteWorkloadLocked(request);
  MaybeRebuildPolicyLocked();
  ObserveLocked();
  FilterVerdicts out;
  const core::CompiledRequest compiled(s.cluster, request);
  NoteShapeLocked(request, compiled.fingerprint());
  core::NodeFit scratch;
  bool any_known = false;
  out.fits.reserve(nodes.size());
  for (uint32_t k = 0; k < nodes.size(); ++k) {
    const core::NodeState* node = s.cluster.FindNode(nodes[k]);
    if (node == nullptr) {
      out.unresolvable.emplace_back(
          k, StrCat("node ", nodes[k], ": no Tessera GPU inventory (is tessera-node running there?)"));
      continue;
    }
    any_known = true;
    const core::NodeFit& fit =
        s.placer->EvaluateCached(s.cluster, *node, compiled, s.rng, &s.evaluations, scratch);
    if (fit.fits()) {
      out.fits.push_back(k);
      continue;
    }
    core::Explanation why = s.placer->Explain(s.cluster, *node, request);
    (why.unresolvable ? out.unresolvable : out.failed).emplace_back(k, std::move(why.message));
  }
  // A high-priority pod that fits nowhere may still fit by compressing low-priority tenants (SharedGPU).
  if (out.fits.empty() && request.priority == core::Priority::kHigh && any_known) {
    std::vector<NodeName> names;
    for (std::string_view n : nodes) {
      if (s.cluster.FindNode(n) != nullptr) names.emplace_back(n);
    }
    absl::StatusOr<core::Placement> p = s.placer->Place(s.cluster, request, s.rng, names);
    if (p.ok() && !p->compressions.empty()) {
      const std::string_view node = p->node.value();
      auto named = [&](const std::pair<uint32_t, std::string>& v) { return nodes[v.first] == node; };
      std::erase_if(out.failed, named);
      std::erase_if(out.unresolvable, named);
      for (uint32_t k = 0; k < nodes.size(); ++k) {
        if (nodes[k] == node) {
          out.fits.push_back(k);
          break;
        }
      }
    }
  }
  return out;
}

std::vector<int64_t> ScaleTierScores(std::span<const TierScore> fits) {
  std::vector<int64_t> out;
  if (fits.empty()) return out;
  out.reserve(fits.size());
  // Tiers first, then scores: map each fit to one number where any better tier wins.
  int top_tier = fits[0].tier;
  double lo = 0, hi = 0;
  bool first = true;
  for (const TierScore& fit : fits) top_tier = std::max(top_tier, fit.tier);
  for (const TierScore& fit : fits) {
    if (fit.tier != top_tier) continue;
    if (first || fit.score < lo) lo = fit.score;
    if (first || fit.score > hi) hi = fit.score;
    first = false;
  }
  for (const TierScore& fit : fits) {
    int64_t score = 0;
    if (fit.tier == top_tier) {
      // The best tier spans 1-10 (or 10 when all equal); lower tiers get 0.
      score = hi > lo ? 1 + static_cast<int64_t>(std::floor(9.0 * (fit.score - lo) / (hi - lo) + 1e-9))
                      : kMaxExtenderPriority;
    }
    out.push_back(std::clamp<int64_t>(score, 0, kMaxExtenderPriority));
  }
  return out;
}

std::vector<HostScore> ScaleScores(std::span<const std::pair<std::string, core::NodeFit>> fits) {
  std::vector<TierScore> tiers;
  tiers.reserve(fits.size());
  for (const auto& [name, fit] : fits) tiers.push_back({fit.tier, fit.score});
  const std::vector<int64_t> scores = ScaleTierScores(tiers);
  std::vector<HostScore> out;
  for (size_t i = 0; i < fits.size(); ++i) out.push_back({fits[i].first, scores[i]});
  return out;
}

std::vector<HostScore> ClusterCache::Prioritize(const core::PodRequest& request,
                                                std::span<const std::string> nodes) {
  const std::vector<std::string_view> views(nodes.begin(), nodes.end());
  std::vector<HostScore> out;
  for (const PositionScore& p : PrioritizeAt(request, views)) out.push_back({nodes[p.position], p.score});
  return out;
}

std::vector<PositionScore> ClusterCache::PrioritizeAt(const core::PodRequest& request,
                                                      std::span<const std::string_view> nodes) {
  std::vector<uint32_t> fitting, others;
  std::vector<TierScore> fits;
  fitting.reserve(nodes.size());
  fits.reserve(nodes.size());
  {
    CacheLock lock(&mu_, &waiting_);
    State& s = *state_;
    NoteWorkloadLocked(request);
    MaybeRebuildPolicyLocked();
    ObserveLocked();
    const core::CompiledRequest compiled(s.cluster, request);
    NoteShapeLocked(request, compiled.fingerprint());
    core::NodeFit scratch;
    for (uint32_t k = 0; k < nodes.size(); ++k) {
      const core::NodeState* node = s.cluster.FindNode(nodes[k]);
      if (node == nullptr) {
        others.push_back(k);
        continue;
      }
      const core::NodeFit& fit =
          s.placer->EvaluateCached(s.cluster, *node, compiled, s.rng, &s.evaluations, scratch);
      if (fit.fits()) {
        fitting.push_back(k);
        fits.push_back({fit.tier, fit.score});
      } else {
        others.push_back(k);
      }
    }
  }
  // Scaled outside the lock: it needs nothing of the cache.
  const std::vector<int64_t> scaled = ScaleTierScores(fits);
  std::vector<PositionScore> out;
  out.reserve(nodes.size());
  for (size_t i = 0; i < fitting.size(); ++i) out.push_back({fitting[i], scaled[i]});
  for (uint32_t k : others) out.push_back({k, 0});
  return out;
}

absl::StatusOr<Reservation> ClusterCache::Reserve(const core::PodRequest& request, const NodeName& node) {
  CacheLock lock(&mu_, &waiting_);
  State& s = *state_;
  if (auto it = s.pods.find(request.uid); it != s.pods.end()) {
    if (it->second.placement.node == node) {
      return absl::AlreadyExistsError(
          StrCat("pod ", request.FullName(), " already holds GPUs on node ", node.value()));
    }
    return absl::FailedPreconditionError(StrCat("pod ", request.FullName(), " already holds GPUs on node ",
                                                it->second.placement.node.value(), ", not ", node.value()));
  }
  if (s.cluster.FindNode(node) == nullptr) {
    return absl::NotFoundError(
        StrCat("node ", node.value(), " has no Tessera GPU inventory (is tessera-node running there?)"));
  }
  const NodeName candidates[] = {node};
  absl::StatusOr<core::Placement> placement = s.placer->Place(s.cluster, request, s.rng, candidates);
  if (!placement.ok()) return placement.status();
  Reservation r;
  r.compressions = placement->compressions;
  if (absl::Status st = s.cluster.Commit(request, *placement); !st.ok()) return st;
  r.placement = *s.cluster.FindPlacement(request.uid);
  s.pods[request.uid] = PodEntry{request, r.placement, true, SteadyNow()};
  // Compressed tenants: their records follow the cluster's.
  for (const core::Compression& c : r.compressions) {
    auto it = s.pods.find(c.tenant.pod);
    if (it == s.pods.end()) continue;
    if (const core::Placement* p = s.cluster.FindPlacement(c.tenant.pod))
      it->second.placement.containers = p->containers;
    it->second.unwritten = true;
    s.changed.insert(c.tenant.pod);
  }
  return r;
}

void ClusterCache::Confirm(const PodUid& uid) {
  CacheLock lock(&mu_, &waiting_);
  auto it = state_->pods.find(uid);
  if (it != state_->pods.end()) it->second.reserved = false;
}

void ClusterCache::Unreserve(const PodUid& uid) {
  CacheLock lock(&mu_, &waiting_);
  auto it = state_->pods.find(uid);
  if (it == state_->pods.end() || !it->second.reserved) return;
  ReleaseLocked(uid);
}

int ClusterCache::ExpireReservations(std::chrono::steady_clock::duration age) {
  CacheLock lock(&mu_, &waiting_);
  const auto now = SteadyNow();
  std::vector<PodUid> expired;
  for (const auto& [uid, entry] : state_->pods) {
    if (entry.reserved && now - entry.reserved_at > age) expired.push_back(uid);
  }
  for (const PodUid& uid : expired) ReleaseLocked(uid);
  return static_cast<int>(expired.size());
}

std::set<std::string> ClusterCache::FitsAfterEvicting(
    const core::PodRequest& request, const std::map<std::string, std::vector<std::string>>& victims) {
  CacheLock lock(&mu_, &waiting_);
  State& s = *state_;
  // On a copy, with a policy of its own: the live policy's caches are keyed by the live nodes.
  core::Cluster copy = s.cluster;
  absl::StatusOr<std::unique_ptr<core::Policy>> policy = core::MakePolicy(s.policy_name, s.context);
  if (!policy.ok()) return {};
  const core::Placer placer(**policy, options_.placement);
  for (const auto& [node, uids] : victims) {
    for (const std::string& uid : uids) (void)copy.Release(PodUid(uid));
  }
  std::set<std::string> out;
  for (const auto& [node, uids] : victims) {
    const core::NodeState* n = copy.FindNode(NodeName(node));
    if (n == nullptr) continue;
    if (placer.Evaluate(copy, *n, request, s.rng).fits()) out.insert(node);
  }
  return out;
}

std::vector<PodEntry> ClusterCache::TakeChangedShares() {
  CacheLock lock(&mu_, &waiting_);
  State& s = *state_;
  std::vector<PodEntry> out;
  for (const PodUid& uid : s.changed) {
    auto it = s.pods.find(uid);
    if (it != s.pods.end()) out.push_back(it->second);
  }
  s.changed.clear();
  return out;
}

std::optional<PodEntry> ClusterCache::FindPod(const PodUid& uid) const {
  CacheLock lock(&mu_, &waiting_);
  auto it = state_->pods.find(uid);
  if (it == state_->pods.end()) return std::nullopt;
  return it->second;
}

core::Cluster ClusterCache::Snapshot() const {
  CacheLock lock(&mu_, &waiting_);
  return state_->cluster;
}

PageView ClusterCache::PageSnapshot() const {
  PageView view;
  CacheLock lock(&mu_, &waiting_);
  const State& s = *state_;
  view.cluster = s.cluster;
  view.fragmentation = s.context.fragmentation;
  view.policy = s.policy_name;
  view.pods.reserve(s.pods.size());
  for (const auto& [uid, entry] : s.pods) {
    view.pods.emplace(uid.value(),
                      PageView::Pod{entry.request.FullName(), entry.request.compute_policy, entry.reserved});
  }
  return view;
}

std::map<std::string, std::string> ClusterCache::PodNames() const {
  CacheLock lock(&mu_, &waiting_);
  std::map<std::string, std::string> out;
  for (const auto& [uid, entry] : state_->pods) out[uid.value()] = entry.request.FullName();
  return out;
}

std::vector<std::string> ClusterCache::Orphans() const {
  CacheLock lock(&mu_, &waiting_);
  std::vector<std::string> out;
  for (const auto& [uid, entry] : state_->orphans) {
    out.push_back(StrCat(entry.request.FullName(), " (", uid, ") on node ", entry.placement.node.value()));
  }
  return out;
}

int ClusterCache::pod_count() const {
  CacheLock lock(&mu_, &waiting_);
  return static_cast<int>(state_->pods.size());
}

int ClusterCache::node_count() const {
  CacheLock lock(&mu_, &waiting_);
  return state_->cluster.node_count();
}

std::string ClusterCache::policy_name() const {
  CacheLock lock(&mu_, &waiting_);
  return state_->policy_name;
}

}  // namespace tessera::scheduler

namespace tessera::scheduler {

uint64_t ClusterCache::policy_builds() const {
  CacheLock lock(&mu_, &waiting_);
  return state_->policy_generation;
}

}  // namespace tessera::scheduler

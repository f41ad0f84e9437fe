#include "sim/replay.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "core/placement/compiled_request.h"
#include "core/placement/evaluation_cache.h"
#include "core/placement/fragmentation.h"
#include "core/placement/placer.h"
#include "core/quantity.h"
#include "core/random.h"
#include "core/strings.h"
#include "sim/trace.h"

namespace tessera::sim {

using core::PodRequest;

int64_t GpuMilli(const PodRequest& pod) {
  int64_t total = 0;
  for (const core::ContainerRequest& c : pod.containers) {
    for (const core::VGpuDemand& v : c.vgpus) total += v.cores.value();
  }
  return total;
}

std::string ShapeLabel(const PodRequest& pod) {
  const int tag = core::PodShapeTag(pod);
  if (tag == core::kNoGpuShape) return "cpu";
  if (tag == 0) return "share";
  if (tag < 1000) return StrCat(tag, "-gpu");
  return "other";
}

std::string FailureCause(const core::Cluster& cluster, const core::PodRequest& pod) {
  if (!pod.wants_gpu()) return "cpu-memory";
  const core::CompiledRequest req(cluster, pod);
  const core::PlacementOptions options;
  // Whether the node's GPUs among `eligible` could take every container's vGPUs (each container's on distinct
  // GPUs, the least free fitting GPU first), whatever its CPU and memory.
  auto gpu_room = [&](const core::NodeState& node, core::GpuMask eligible) {
    // The node's summaries (over all its healthy GPUs) refuse most nodes of a full cluster at once.
    if (req.min_cores() > node.max_free_cores() || req.exclusive_count() > node.whole_free_gpus())
      return false;
    core::NodeScratch scratch(node, options);
    for (size_t c = 0; c < req.container_count(); ++c) {
      core::GpuMask taken;
      for (size_t k = req.container_start(c); k < req.container_start(c + 1); ++k) {
        const core::VGpuDemand& d = req.vgpus()[k];
        int best = -1;
        for (int g : scratch.Fitting(d, eligible & ~taken)) {
          if (best < 0 || scratch.free_cores(g) < scratch.free_cores(best)) best = g;
        }
        if (best < 0) return false;
        taken.Add(best);
        scratch.Take(d, best);
      }
    }
    return true;
  };
  bool room_other_models = false;
  bool room_allowed = false;
  for (const core::NodeState& n : cluster.nodes()) {
    if (!n.schedulable()) continue;
    core::GpuMask allowed;
    for (int g : n.healthy() & req.UuidAllowed(n)) {
      if (req.ModelAllowed(n.model_id(g))) allowed.Add(g);
    }
    if (!allowed.Empty() && gpu_room(n, allowed)) {
      room_allowed = true;
      const bool cpu = !n.tracks_cpu() || pod.cpu <= n.free_cpu();
      const bool memory = !n.tracks_host_memory() || pod.memory <= n.free_host_memory();
      if (cpu && memory) return "other";  // quota or NUMA binding
    } else if (!room_other_models && gpu_room(n, n.healthy())) {
      room_other_models = true;
    }
  }
  if (room_allowed) return "cpu-memory";
  return room_other_models ? "gpu-model" : "gpu";
}

ReplayInput ReplayInput::Make(core::Cluster cluster, std::vector<core::PodRequest> pods) {
  ReplayInput in;
  in.context = core::MakePolicyContext(cluster, pods);
  in.fragmentation = in.context.fragmentation;
  // The capacity is what can be allocated: healthy GPUs.
  for (const core::NodeState& n : cluster.nodes()) in.capacity_milli += 1000 * n.healthy().Count();
  in.cluster = std::move(cluster);
  in.pods = std::move(pods);
  return in;
}

namespace {

absl::Status TooManyArrivals(size_t at_least, double inflate) {
  return absl::ResourceExhaustedError(StrCat("--inflate ", inflate, " makes at least ", at_least,
                                             " arrivals (the pods and their clones); a replay takes at most ",
                                             kMaxTracePods,
                                             ": lower --inflate, or use pods that ask for more GPU"));
}

}  // namespace

absl::Status CheckArrivals(const std::vector<PodRequest>& pods, int64_t capacity_milli, double inflate) {
  int64_t total = 0;
  int64_t largest = 0;
  for (const PodRequest& p : pods) {
    total = core::SaturatingAdd(total, GpuMilli(p));
    largest = std::max(largest, GpuMilli(p));
  }
  const auto target = static_cast<int64_t>(inflate * static_cast<double>(capacity_milli));
  if (total >= target || largest == 0) return absl::OkStatus();
  // Clones stop within one pod of the target, so at least this many are made, even if every clone is the
  // largest pod.
  const int64_t fewest = (target - total - largest) / largest;
  if (fewest > static_cast<int64_t>(kMaxTracePods) - static_cast<int64_t>(pods.size())) {
    return TooManyArrivals(pods.size() + static_cast<size_t>(std::max<int64_t>(fewest, 0)), inflate);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<const PodRequest*>> ArrivalOrder(const std::vector<PodRequest>& pods,
                                                            int64_t capacity_milli, double inflate,
                                                            uint64_t seed, std::vector<PodRequest>& clones) {
  core::Rng rng(seed);
  // 1. By name, then shuffled (Fisher-Yates).
  std::vector<const PodRequest*> by_name;
  for (const PodRequest& p : pods) by_name.push_back(&p);
  std::stable_sort(by_name.begin(), by_name.end(),
                   [](const PodRequest* a, const PodRequest* b) { return a->name < b->name; });
  std::vector<const PodRequest*> order = by_name;
  for (size_t i = order.size(); i > 1; --i)
    std::swap(order[i - 1], order[rng.Uniform(static_cast<uint32_t>(i))]);

  // 2. Scale to the target.
  int64_t total = 0;
  for (const PodRequest* p : order) total += GpuMilli(*p);
  const auto target = static_cast<int64_t>(inflate * static_cast<double>(capacity_milli));
  if (total < target && total > 0 && !by_name.empty()) {
    // Clones are made first and pointed to afterwards: `clones` must not move while it grows.
    std::vector<size_t> picks;
    int64_t grown = total;
    while (true) {
      const size_t i = rng.Uniform(static_cast<uint32_t>(by_name.size()));
      const int64_t add = GpuMilli(*by_name[i]);
      if (grown + add > target) break;
      grown += add;
      // Pods asking for no GPU add nothing to `grown`: counted here, not bounded by the target.
      if (pods.size() + picks.size() >= kMaxTracePods) return TooManyArrivals(kMaxTracePods + 1, inflate);
      picks.push_back(i);
    }
    clones.clear();
    clones.reserve(picks.size());
    for (size_t k = 0; k < picks.size(); ++k) {
      PodRequest c = *by_name[picks[k]];
      c.name = StrCat(c.name, "-clone-", k);
      c.uid = core::PodUid(StrCat(c.uid.value(), "-clone-", k));
      clones.push_back(std::move(c));
    }
    for (const PodRequest& c : clones) order.push_back(&c);
  } else {
    while (total > target && !order.empty()) {
      const size_t i = rng.Uniform(static_cast<uint32_t>(order.size()));
      total -= GpuMilli(*order[i]);
      order.erase(order.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  return order;
}

absl::StatusOr<RunResult> Replay(const ReplayInput& input, const std::string& policy_name, uint64_t seed,
                                 double inflate, std::atomic<int64_t>* progress,
                                 const ReplayOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<core::Policy>> policy = core::MakePolicy(policy_name, input.context);
  if (!policy.ok()) return policy.status();
  core::PlacementOptions placement_options;
  placement_options.allow_compression = options.compression;
  core::Placer placer(**policy, placement_options);
  core::Cluster cluster = input.cluster;

  std::vector<PodRequest> clones;
  absl::StatusOr<std::vector<const PodRequest*>> arrivals =
      ArrivalOrder(input.pods, input.capacity_milli, inflate, seed, clones);
  if (!arrivals.ok()) return arrivals.status();
  const std::vector<const PodRequest*>& order = *arrivals;

  // The tie-break ranking of the nodes, once per run.
  core::Rng rng(seed * 0x9e3779b97f4a7c15ULL + 1);
  std::vector<uint32_t> rank(static_cast<size_t>(cluster.node_count()));
  std::iota(rank.begin(), rank.end(), 0u);
  for (size_t i = rank.size(); i > 1; --i)
    std::swap(rank[i - 1], rank[rng.Uniform(static_cast<uint32_t>(i))]);

  // The cluster's fragmentation, kept per node and updated where a pod lands.
  std::vector<double> node_frag(rank.size());
  double frag = 0;
  int64_t used = 0;
  for (size_t i = 0; i < rank.size(); ++i) {
    const core::NodeState& n = cluster.nodes()[i];
    node_frag[i] = input.fragmentation->NodeFragment(n);
    frag += node_frag[i];
    used += n.healthy_cores().value() - n.total_free_cores().value();
  }

  core::EvaluationCache cache;
  RunResult result;
  result.policy = policy_name;
  result.seed = seed;
  result.capacity_milli = input.capacity_milli;
  result.pods = order.size();
  result.events.reserve(order.size());
  int64_t arrived = 0;
  for (const PodRequest* pod : order) {
    if (options.max_pods > 0 && result.events.size() >= options.max_pods) break;
    arrived += GpuMilli(*pod);
    if (pod->priority == core::Priority::kHigh) ++result.priority.high_pods;
    absl::StatusOr<core::Placement> p =
        placer.Place(cluster, *pod, rng, {}, rank, options.evaluation_cache ? &cache : nullptr);
    if (p.ok()) {
      // The Placer chose it; a refusal here is a bug, not a pod that did not fit.
      if (absl::Status s = cluster.Commit(*pod, *p); !s.ok()) {
        return absl::InternalError(
            StrCat("pod ", pod->name, ": the placement chosen was refused: ", s.message()));
      }
      ++result.placed;
      const core::NodeState* n = cluster.FindNode(p->node);
      const size_t i = static_cast<size_t>(n - cluster.nodes().data());
      for (const core::ContainerAssignment& c : p->containers) {
        for (const core::VGpuAssignment& v : c.vgpus) used += v.cores.value();
      }
      // Compressed tenants hold less from now on: the GPU allocated is what tenants hold.
      for (const core::Compression& c : p->compressions) used -= (c.old_cores - c.new_cores).value();
      if (pod->priority == core::Priority::kHigh) {
        ++result.priority.high_placed;
        if (!p->compressions.empty()) ++result.priority.placed_by_compression;
      }
      const double f = input.fragmentation->NodeFragment(*n);
      frag += f - node_frag[i];
      node_frag[i] = f;
    } else {
      ++result.failed_by_shape[ShapeLabel(*pod)];
      ++result.failed_by_cause[FailureCause(cluster, *pod)];
    }
    result.events.push_back({arrived, used, frag, input.capacity_milli - used});
    if (progress != nullptr) progress->fetch_add(1, std::memory_order_relaxed);
  }
  for (const core::NodeState& n : cluster.nodes()) {
    for (int g = 0; g < n.gpu_count(); ++g) {
      for (const core::Tenant& t : n.tenants(g)) {
        if (t.cores >= t.requested) continue;
        ++result.priority.compressed_tenants;
        result.priority.compressed_milli += (t.requested - t.cores).value();
      }
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace tessera::sim

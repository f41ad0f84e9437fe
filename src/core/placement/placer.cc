#include "core/placement/placer.h"

#include <algorithm>
#include <tuple>

#include "absl/status/status.h"
#include "core/placement/compression.h"
#include "core/placement/evaluation_cache.h"
#include "core/strings.h"

namespace tessera::core {

const char* ToString(RejectCode code) {
  switch (code) {
    case RejectCode::kNone:
      return "fits";
    case RejectCode::kUnschedulable:
      return "unschedulable";
    case RejectCode::kNoGpu:
      return "no-gpu";
    case RejectCode::kModel:
      return "gpu-model";
    case RejectCode::kUuid:
      return "gpu-uuid";
    case RejectCode::kQuota:
      return "quota";
    case RejectCode::kCpu:
      return "cpu";
    case RejectCode::kHostMemory:
      return "memory";
    case RejectCode::kGpuCapacity:
      return "gpu-capacity";
    case RejectCode::kNuma:
      return "numa";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------------------------
// Placer

Placer::Placer(const Policy& policy, PlacementOptions options) : policy_(&policy), options_(options) {}

namespace {

GpuMask ModelMask(const NodeState& node, int model_id) {
  if (node.model_ids().size() == 1) return GpuMask::All(node.gpu_count());
  GpuMask m;
  for (int g = 0; g < node.gpu_count(); ++g) {
    if (node.model_id(g) == model_id) m.Add(g);
  }
  return m;
}

// Checks that do not depend on GPU use: the node, its host resources, models, UUIDs.
RejectCode StaticChecks(const NodeState& node, const CompiledRequest& req) {
  if (!node.schedulable()) return RejectCode::kUnschedulable;
  const PodRequest& r = req.request();
  if (node.tracks_cpu() && r.cpu > node.free_cpu()) return RejectCode::kCpu;
  if (node.tracks_host_memory() && r.memory > node.free_host_memory()) return RejectCode::kHostMemory;
  if (!r.wants_gpu()) return RejectCode::kNone;
  if (node.healthy().Empty()) return RejectCode::kNoGpu;
  // A pod's vGPUs are recorded in fixed arrays of kMaxGpusPerNode (the parser refuses more).
  if (req.vgpus().size() > static_cast<size_t>(kMaxGpusPerNode)) return RejectCode::kGpuCapacity;
  bool model = false;
  for (int m : node.model_ids()) model = model || req.ModelAllowed(m);
  if (!model) return RejectCode::kModel;
  if ((req.UuidAllowed(node) & node.healthy()).Empty()) return RejectCode::kUuid;
  return RejectCode::kNone;
}

std::string Pct(MilliGpu m) {
  if (m.value() % 10 == 0) return StrCat(m.value() / 10, "%");
  return StrCat(m.value() / 10, ".", m.value() % 10, "%");
}

// A share in GPUs: "6.5", "1", "0.25".
std::string Gpus(MilliGpu m) {
  std::string out = StrCat(m.value() / 1000);
  int frac = m.value() % 1000;
  if (frac == 0) return out;
  std::string digits = StrCat(1000 + frac).substr(1);
  while (digits.back() == '0') digits.pop_back();
  return StrCat(out, ".", digits);
}

std::string DescribeDemand(const NodeScratch& s, const VGpuDemand& d, int g) {
  Realized r = s.RealizeOn(d, g);
  return StrCat(Pct(r.cores), " and ", r.memory_limit.value(), " MiB");
}

// What GPU g lacks for demand d.
std::string DescribeShortfall(const NodeScratch& s, const VGpuDemand& d, int g) {
  const GpuInfo& gpu = s.node().gpu(g);
  Realized r = s.RealizeOn(d, g);
  if (r.memory_limit > gpu.memory) {
    return StrCat("GPU ", g, " has ", gpu.memory.value(), " MiB in all, ", r.memory_limit.value(), " needed");
  }
  if (d.exclusive() && s.free_cores(g) < kWholeGpu) {
    // A GPU with nothing free may be one tenant's whole GPU: "shared" would be wrong there.
    if (s.free_cores(g).value() == 0) return StrCat("GPU ", g, " is fully in use; a whole GPU is needed");
    return StrCat("GPU ", g, " is shared (", Pct(kWholeGpu - s.free_cores(g)),
                  " in use); a whole GPU is needed");
  }
  std::vector<std::string> parts;
  if (s.free_cores(g) < r.cores)
    parts.push_back(StrCat(Pct(s.free_cores(g)), " compute free, ", Pct(r.cores), " needed"));
  if (s.free_memory(g) < r.memory_accounted) {
    parts.push_back(StrCat(s.free_memory(g).value(), " MiB free, ", r.memory_accounted.value(), " needed"));
  }
  if (parts.empty()) return StrCat("GPU ", g, " is already used by another vGPU of this container");
  return StrCat("GPU ", g, " has ", StrJoin(parts, " and "));
}

// Whether GPU g, empty, could hold demand d at all.
bool RealizeOnEmpty(const NodeState& node, const VGpuDemand& d, int g, const PlacementOptions& options) {
  return Realize(d, node.memory(g), options).memory_limit <= node.memory(g);
}

std::string GpuList(GpuMask gpus) {
  std::vector<std::string> names;
  for (int g : gpus) names.push_back(StrCat(g));
  return StrCat(gpus.Count() == 1 ? "GPU " : "GPUs ", StrJoin(names, ", "));
}

// Why one container's vGPUs find no room among `eligible`: what it needs, what has room, and what the GPU
// that comes closest lacks.
std::string DescribeContainer(const NodeScratch& scratch, const std::string& name,
                              std::span<const VGpuDemand> demands, GpuMask eligible) {
  int whole = 0;
  const VGpuDemand* share = nullptr;
  for (const VGpuDemand& d : demands) {
    if (d.exclusive()) {
      ++whole;
    } else if (share == nullptr) {
      share = &d;
    }
  }
  const int shares = static_cast<int>(demands.size()) - whole;
  std::vector<std::string> parts;
  if (whole > 0) parts.push_back(whole == 1 ? std::string("a whole GPU") : StrCat(whole, " whole GPUs"));
  if (shares > 0) {
    const int any = eligible.Empty() ? 0 : *eligible.begin();
    parts.push_back(
        StrCat(shares == 1 ? std::string(whole > 0 ? "another GPU" : "a GPU") : StrCat(shares, " GPUs"),
               " with ", DescribeDemand(scratch, *share, any), shares == 1 ? " free" : " free each"));
  }
  std::string out = StrCat("container ", name, " needs ", StrJoin(parts, " and "), "; ");

  GpuMask wholly_free;
  for (int g : eligible) {
    if (scratch.free_cores(g) >= kWholeGpu) wholly_free.Add(g);
  }
  const VGpuDemand& lacking =
      (whole > 0 && wholly_free.Count() < whole) || share == nullptr ? demands.front() : *share;
  const GpuMask fitting = scratch.Fitting(lacking, eligible);
  if (lacking.exclusive()) {
    StrAppend(&out, wholly_free.Empty()
                        ? std::string("no GPU is wholly free")
                        : StrCat("only ", wholly_free.Count(), " wholly free (", GpuList(wholly_free), ")"));
  } else {
    StrAppend(&out, fitting.Empty() ? std::string("no GPU has room")
                                    : StrCat(fitting.Count(), " ", fitting.Count() == 1 ? "has" : "have",
                                             " room (", GpuList(fitting), ")"));
  }
  // The GPU that comes closest: most free compute, then memory, among those that lack room.
  int closest = -1;
  for (int g : eligible) {
    if (fitting.Has(g)) continue;
    if (closest < 0 || scratch.free_cores(g) > scratch.free_cores(closest) ||
        (scratch.free_cores(g) == scratch.free_cores(closest) &&
         scratch.free_memory(g) > scratch.free_memory(closest))) {
      closest = g;
    }
  }
  if (closest >= 0) StrAppend(&out, "; ", DescribeShortfall(scratch, lacking, closest));
  return out;
}

}  // namespace

NodeFit Placer::Evaluate(const Cluster& cluster, const NodeState& node, const PodRequest& request,
                         Rng& rng) const {
  CompiledRequest compiled(cluster, request);
  return Evaluate(node, compiled, rng);
}

NodeFit Placer::Evaluate(const NodeState& node, const CompiledRequest& req, Rng& rng) const {
  NodeFit fit;
  fit.reject = StaticChecks(node, req);
  if (!fit.fits()) return fit;
  const PodRequest& r = req.request();
  if (!r.wants_gpu()) {
    NodeScratch scratch(node, options_);
    fit.score = policy_->Score(scratch, req, fit.choice, rng);
    fit.tier = node.high_priority_tenants() == 0 ? 1 : 0;
    return fit;
  }
  // Quick refusals from the node's summaries.
  if (req.max_container_vgpus() > node.healthy().Count() || req.exclusive_count() > node.whole_free_gpus() ||
      req.min_cores() > node.max_free_cores()) {
    fit.reject = RejectCode::kGpuCapacity;
    return fit;
  }
  const GpuMask uuid_ok = req.UuidAllowed(node) & node.healthy();
  if (node.model_ids().size() == 1) {
    const int model = node.model_ids()[0];
    if (!req.ModelAllowed(model) || uuid_ok.Empty()) {
      fit.reject = RejectCode::kGpuCapacity;
      return fit;
    }
    EvaluateModel(node, req, model, uuid_ok, rng, fit);
    return fit;
  }
  // A node with several models: each model on its own (never two models in one pod); the best wins.
  RejectCode why = RejectCode::kGpuCapacity;
  bool found = false;
  NodeFit candidate;
  for (int model : node.model_ids()) {
    if (!req.ModelAllowed(model)) continue;
    const GpuMask eligible = uuid_ok & ModelMask(node, model);
    if (eligible.Empty()) continue;
    if (!EvaluateModel(node, req, model, eligible, rng, candidate)) {
      if (candidate.reject != RejectCode::kGpuCapacity) why = candidate.reject;
      continue;
    }
    if (!found || candidate.tier > fit.tier || (candidate.tier == fit.tier && candidate.score > fit.score)) {
      fit = candidate;
      found = true;
    }
  }
  if (!found) fit.reject = why;
  return fit;
}

bool Placer::EvaluateModel(const NodeState& node, const CompiledRequest& req, int model_id, GpuMask eligible,
                           Rng& rng, NodeFit& fit) const {
  const PodRequest& r = req.request();
  fit.model_id = model_id;
  fit.numa_of_container.fill(-1);
  const bool high = r.priority == Priority::kHigh;

  // One attempt: every container in turn; `idle_only` limits a high-priority pod to idle GPUs (SharedGPU).
  auto attempt = [&](bool idle_only, NodeScratch& scratch, PodChoice& choice, RejectCode& reject) {
    double cost = 0;
    for (size_t c = 0; c < req.container_count(); ++c) {
      const size_t begin = req.container_start(c);
      std::span<const VGpuDemand> demands = req.vgpus().subspan(begin, req.container_start(c + 1) - begin);
      std::span<int8_t> out(choice.gpus.data() + begin, demands.size());
      GpuMask mask = eligible;
      if (idle_only) {
        GpuMask idle;
        for (int g : mask) {
          if (scratch.free_cores(g) >= kWholeGpu) idle.Add(g);
        }
        mask = idle;
      }
      bool placed = false;
      if (!r.numa_bind) {
        placed = policy_->SelectGpus(scratch, req, demands, mask, rng, out, cost);
      } else {
        // The NUMA node with the least free compute that takes the container (best fit), so that roomier NUMA
        // nodes stay free for bigger asks.
        std::array<std::pair<int64_t, int>, kMaxGpusPerNode> order{};
        size_t count = 0;
        for (int numa : node.numa_nodes()) {
          if (numa < 0) continue;
          int64_t free = 0;
          for (int g : mask& node.GpusOnNuma(numa)) free += scratch.free_cores(g).value();
          order[count++] = {free, numa};
        }
        std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(count));
        for (size_t i = 0; i < count && !placed; ++i) {
          double numa_cost = 0;
          if (policy_->SelectGpus(scratch, req, demands, mask & node.GpusOnNuma(order[i].second), rng, out,
                                  numa_cost)) {
            placed = true;
            cost += numa_cost;
            fit.numa_of_container[c] = static_cast<int16_t>(order[i].second);
          }
        }
        if (!placed) {
          reject = policy_->SelectGpus(scratch, req, demands, mask, rng, out, cost)
                       ? RejectCode::kNuma
                       : RejectCode::kGpuCapacity;
          return false;
        }
      }
      if (!placed) {
        reject = RejectCode::kGpuCapacity;
        return false;
      }
      for (size_t k = 0; k < demands.size(); ++k) scratch.Take(demands[k], out[k]);
    }
    choice.count = static_cast<int>(req.vgpus().size());
    choice.selection_cost = cost;
    return true;
  };

  NodeScratch scratch(node, options_);
  PodChoice& choice = fit.choice;
  RejectCode reject = RejectCode::kGpuCapacity;
  bool ok = false;
  fit.tier = high ? 0 : (node.high_priority_tenants() == 0 ? 1 : 0);
  if (high) {
    ok = attempt(/*idle_only=*/true, scratch, choice, reject);
    if (ok) {
      fit.tier = 1;  // high priority on idle GPUs: first
    } else {
      scratch.Reset();
      fit.numa_of_container.fill(-1);
    }
  }
  if (!ok) ok = attempt(/*idle_only=*/false, scratch, choice, reject);
  if (!ok) {
    fit.reject = reject;
    return false;
  }
  // Quota: the namespace's share of this model.
  if (std::optional<MilliGpu> left = req.QuotaLeft(model_id)) {
    MilliGpu need(0);
    for (int i = 0; i < choice.count; ++i)
      need +=
          scratch.RealizeOn(req.vgpus()[static_cast<size_t>(i)], choice.gpus[static_cast<size_t>(i)]).cores;
    if (need > *left) {
      fit.reject = RejectCode::kQuota;
      return false;
    }
  }
  fit.score = policy_->Score(scratch, req, choice, rng);
  fit.reject = RejectCode::kNone;
  return true;
}

Placement Placer::Materialize(const NodeState& node, const CompiledRequest& req, const NodeFit& fit) const {
  Placement p;
  p.node = node.name();
  p.score = fit.score;
  const PodRequest& r = req.request();
  for (size_t c = 0; c < req.container_count(); ++c) {
    ContainerAssignment ca;
    ca.name = r.containers[c].name;
    for (size_t k = req.container_start(c); k < req.container_start(c + 1); ++k) {
      const int g = fit.choice.gpus[k];
      Realized real = Realize(req.vgpus()[k], node.gpu(g).memory, options_);
      ca.vgpus.push_back({g, node.gpu(g).uuid, real.cores, real.memory_limit});
    }
    ca.numa_node = fit.numa_of_container[c];
    if (ca.numa_node >= 0) {
      auto it = node.info().numa_cpus.find(ca.numa_node);
      if (it != node.info().numa_cpus.end()) ca.cpus = it->second;
    }
    p.containers.push_back(std::move(ca));
  }
  return p;
}

uint64_t Placer::CacheKey(const CompiledRequest& req) const {
  // The policy's cluster-wide state is part of the question.
  return req.fingerprint() ^ (policy_->state_key(req) * 0x9e3779b97f4a7c15ULL);
}

const NodeFit& Placer::EvaluateCached(const Cluster& cluster, const NodeState& node,
                                      const CompiledRequest& req, Rng& rng, EvaluationCache* cache,
                                      NodeFit& scratch) const {
  if (cache == nullptr || !policy_->deterministic()) {
    scratch = Evaluate(node, req, rng);
    return scratch;
  }
  const size_t index = static_cast<size_t>(&node - cluster.nodes().data());
  const uint64_t key = CacheKey(req);
  if (const NodeFit* hit = cache->Find(index, node.version(), key)) return *hit;
  scratch = Evaluate(node, req, rng);
  cache->Store(index, node.version(), key, scratch);
  return scratch;
}

absl::StatusOr<Placement> Placer::Place(const Cluster& cluster, const PodRequest& request, Rng& rng,
                                        std::span<const NodeName> candidates,
                                        std::span<const uint32_t> node_rank, EvaluationCache* cache) const {
  CompiledRequest req(cluster, request);
  policy_->Observe(cluster);
  std::vector<const NodeState*> nodes;
  if (candidates.empty()) {
    nodes.reserve(cluster.nodes().size());
    for (const NodeState& n : cluster.nodes()) nodes.push_back(&n);
  } else {
    for (const NodeName& name : candidates) {
      if (const NodeState* n = cluster.FindNode(name)) nodes.push_back(n);
    }
  }
  if (!policy_->deterministic()) cache = nullptr;
  NodeFit fresh;
  auto evaluate = [&](const NodeState& node) -> const NodeFit& {
    return EvaluateCached(cluster, node, req, rng, cache, fresh);
  };
  // The best node: highest tier, then highest score; ties random, or by rank.
  NodeFit best_fit;
  const NodeState* chosen = nullptr;
  if (cache != nullptr && candidates.empty() && node_rank.size() == nodes.size()) {
    // Every node under a fixed ranking: the cache's per-shape index knows the winner, up to the nodes that
    // changed since this shape was last asked. The same choice as the scan below (a test compares them).
    const int best = cache->ranked().Best(CacheKey(req), cluster.node_versions(), node_rank, [&](size_t i) {
      const NodeFit& fit = evaluate(cluster.nodes()[i]);
      return RankedIndex::Answer{fit.fits(), fit.tier, fit.score};
    });
    if (best >= 0) {
      chosen = &cluster.nodes()[static_cast<size_t>(best)];
      best_fit = evaluate(*chosen);
    }
  } else if (node_rank.empty()) {
    TieBreaker<const NodeState*, std::pair<int, double>> best(rng);
    for (const NodeState* node : nodes) {
      const NodeFit& fit = evaluate(*node);
      if (fit.fits() && best.Offer({-fit.tier, -fit.score}, node)) best_fit = fit;
    }
    if (best.has_value()) chosen = best.value();
  } else {
    std::tuple<int, double, uint32_t> best_key;
    for (const NodeState* node : nodes) {
      const NodeFit& fit = evaluate(*node);
      if (!fit.fits()) continue;
      const uint32_t rank = node_rank[static_cast<size_t>(node - cluster.nodes().data())];
      std::tuple<int, double, uint32_t> key{-fit.tier, -fit.score, rank};
      if (chosen == nullptr || key < best_key) {
        best_key = key;
        chosen = node;
        best_fit = fit;
      }
    }
  }
  if (chosen != nullptr) return Materialize(*chosen, req, best_fit);

  if (std::optional<Placement> compressed = PlanCompression(req, nodes, rng)) return *compressed;

  if (nodes.empty()) {
    return absl::FailedPreconditionError(
        StrCat("pod ", request.FullName(), " cannot be placed: there are no candidate nodes"));
  }
  std::vector<std::string> why;
  constexpr size_t kShown = 5;
  for (size_t i = 0; i < nodes.size() && i < kShown; ++i)
    why.push_back(Explain(cluster, *nodes[i], request).message);
  std::string more = nodes.size() > kShown ? StrCat("; and ", nodes.size() - kShown, " more nodes") : "";
  return absl::ResourceExhaustedError(StrCat("pod ", request.FullName(), " fits on none of ", nodes.size(),
                                             " nodes: ", StrJoin(why, "; "), more));
}

std::optional<Placement> Placer::PlanCompression(const CompiledRequest& req,
                                                 std::span<const NodeState* const> nodes, Rng& rng) const {
  const PodRequest& r = req.request();
  // The paper's case: a high-priority pod asking for a share of one GPU.
  if (!options_.allow_compression || r.priority != Priority::kHigh || req.vgpus().size() != 1 ||
      req.vgpus()[0].exclusive()) {
    return std::nullopt;
  }
  const VGpuDemand& demand = req.vgpus()[0];
  struct Candidate {
    const NodeState* node = nullptr;
    int gpu = -1;
  };
  // The GPU with the most free share among those whose low-priority tenants can yield the rest.
  TieBreaker<Candidate, int64_t> best(rng);
  for (const NodeState* node : nodes) {
    if (StaticChecks(*node, req) != RejectCode::kNone) continue;
    const GpuMask uuid_ok = req.UuidAllowed(*node) & node->healthy();
    for (int g : uuid_ok) {
      if (!req.ModelAllowed(node->model_id(g))) continue;
      if (r.numa_bind && node->gpu(g).numa_node < 0) continue;
      Realized need = Realize(demand, node->gpu(g).memory, options_);
      if (need.memory_accounted > node->free_memory(g) || need.memory_limit > node->gpu(g).memory) continue;
      if (std::optional<MilliGpu> left = req.QuotaLeft(node->model_id(g)); left && need.cores > *left)
        continue;
      MilliGpu room = node->free_cores(g);
      for (const Tenant& t : node->tenants(g)) {
        if (t.priority == Priority::kLow && t.cores > options_.min_compressed_share) {
          room += t.cores - options_.min_compressed_share;
        }
      }
      if (room < need.cores) continue;
      best.Offer(-node->free_cores(g).value(), Candidate{node, g});
    }
  }
  if (!best.has_value()) return std::nullopt;
  const NodeState& node = *best.value().node;
  const int g = best.value().gpu;
  Realized need = Realize(demand, node.gpu(g).memory, options_);
  std::vector<const Tenant*> low;
  std::vector<MilliGpu> shares;
  for (const Tenant& t : node.tenants(g)) {
    if (t.priority == Priority::kLow) {
      low.push_back(&t);
      shares.push_back(t.cores);
    }
  }
  std::optional<std::vector<MilliGpu>> cuts =
      CompressionCuts(shares, need.cores - node.free_cores(g), options_.min_compressed_share);
  if (!cuts) return std::nullopt;
  NodeFit fit;
  fit.numa_of_container.fill(-1);
  if (r.numa_bind) fit.numa_of_container[0] = static_cast<int16_t>(node.gpu(g).numa_node);
  fit.choice.gpus[0] = static_cast<int8_t>(g);
  fit.choice.count = 1;
  Placement p = Materialize(node, req, fit);
  for (size_t i = 0; i < low.size(); ++i) {
    if ((*cuts)[i].value() > 0)
      p.compressions.push_back({low[i]->id, g, low[i]->cores, low[i]->cores - (*cuts)[i]});
  }
  return p;
}

Explanation Placer::Explain(const Cluster& cluster, const NodeState& node, const PodRequest& request) const {
  CompiledRequest req(cluster, request);
  const std::string who = StrCat("node ", node.name().value(), ": ");
  Explanation e;
  switch (StaticChecks(node, req)) {
    case RejectCode::kUnschedulable:
      return {StrCat(who, "takes no new pods (cordoned, or its Tessera agent has not reported recently)"),
              true};
    case RejectCode::kCpu:
      return {
          StrCat(who, node.free_cpu().value(), " millicores of CPU free, ", request.cpu.value(), " needed"),
          request.cpu > node.info().cpu};
    case RejectCode::kHostMemory:
      return {StrCat(who, node.free_host_memory().value(), " MiB of memory free, ", request.memory.value(),
                     " needed"),
              request.memory > node.info().memory};
    case RejectCode::kNoGpu:
      return {StrCat(who, node.gpu_count() == 0 ? "has no GPU" : "has no healthy GPU"), true};
    case RejectCode::kModel: {
      std::vector<std::string> models;
      for (int m : node.model_ids()) models.push_back(cluster.ModelName(m));
      std::string allowed =
          request.model_include.empty()
              ? StrCat("excludes ", request.model_exclude_substring ? "models containing " : "",
                       StrJoin(request.model_exclude, ", "))
              : StrCat("allows only ", request.model_include_substring ? "models containing " : "",
                       StrJoin(request.model_include, ", "));
      return {StrCat(who, "has ", StrJoin(models, ", "), " GPUs; the pod ", allowed), true};
    }
    case RejectCode::kUuid:
      return {StrCat(who, "none of its healthy GPUs is allowed by tessera.dev/gpu-uuid / gpu-uuid-exclude"),
              true};
    default:
      break;
  }
  if (!request.wants_gpu()) return {StrCat(who, "fits"), false};

  // Walk the containers as Evaluate does, and describe the first that does not fit.
  Rng rng(0);
  const GpuMask uuid_ok = req.UuidAllowed(node) & node.healthy();
  std::vector<std::string> reasons;
  bool unresolvable = true;
  for (int model : node.model_ids()) {
    if (!req.ModelAllowed(model)) continue;
    const GpuMask eligible = uuid_ok & ModelMask(node, model);
    if (eligible.Empty()) continue;
    NodeFit fit;
    if (EvaluateModel(node, req, model, eligible, rng, fit)) return {StrCat(who, "fits"), false};
    if (fit.reject == RejectCode::kQuota) {
      const MilliGpu limit = cluster.Quota(request.ns, model).value_or(MilliGpu(0));
      const MilliGpu used = cluster.QuotaUsed(request.ns, model);
      MilliGpu need(0);
      const int any = *eligible.begin();
      for (const VGpuDemand& d : req.vgpus()) need += Realize(d, node.gpu(any).memory, options_).cores;
      reasons.push_back(StrCat("namespace ", request.ns.value(), " holds ", Gpus(used), " of its ",
                               Gpus(limit), " ", cluster.ModelName(model), " GPUs (quota) and the pod needs ",
                               Gpus(need), " more"));
      continue;
    }
    if (fit.reject == RejectCode::kNuma) {
      reasons.push_back("the pod fits only across NUMA nodes, and tessera.dev/numa-bind asks for one");
      unresolvable = false;
      continue;
    }
    // Capacity: find the first container that does not fit, placing the ones before it.
    NodeScratch scratch(node, options_);
    for (size_t c = 0; c < req.container_count(); ++c) {
      const size_t begin = req.container_start(c);
      std::span<const VGpuDemand> demands = req.vgpus().subspan(begin, req.container_start(c + 1) - begin);
      std::array<int8_t, kMaxGpusPerNode> out{};
      double cost = 0;
      if (policy_->SelectGpus(scratch, req, demands, eligible, rng,
                              std::span<int8_t>(out.data(), demands.size()), cost)) {
        for (size_t k = 0; k < demands.size(); ++k) scratch.Take(demands[k], out[k]);
        continue;
      }
      reasons.push_back(DescribeContainer(scratch, request.containers[c].name, demands, eligible));
      // Could it fit if the node were empty? Enough GPUs of this model large enough for each vGPU.
      int big_enough = 0;
      for (int g : eligible) {
        bool holds_all = true;
        for (const VGpuDemand& d : demands) holds_all = holds_all && RealizeOnEmpty(node, d, g, options_);
        if (holds_all) ++big_enough;
      }
      if (big_enough >= static_cast<int>(demands.size())) unresolvable = false;
      break;
    }
  }
  if (reasons.empty()) reasons.push_back("no GPU of an allowed model fits");
  return {StrCat(who, StrJoin(reasons, "; ")), unresolvable};
}

}  // namespace tessera::core

#include "sim/bound.h"

#include <glpk.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "core/strings.h"
#include "sim/replay.h"

namespace tessera::sim {

namespace {

struct NodeClass {
  int model_id = -1;
  int gpus = 0;
  int64_t cpu = 0;     // millicores per node; 0: not accounted
  int64_t memory = 0;  // MiB per node; 0: not accounted
  int64_t count = 0;
};

struct Shape {
  int gpus = 0;       // vGPUs
  int32_t share = 0;  // per vGPU, thousandths; 1000: whole GPUs
  int64_t cpu = 0;
  int64_t memory = 0;
  std::vector<int> models;  // allowed model ids; empty: any
  int64_t count = 0;
  int64_t forced = 0;
  size_t group = 0;  // a share's row: the index of its size, or of its group of sizes (see LowerBound)
  bool whole() const { return share >= 1000; }
  double gpu_milli() const { return static_cast<double>(gpus) * share; }
};

// Owns a GLPK problem.
struct LpDeleter {
  void operator()(glp_prob* p) const { glp_delete_prob(p); }
};

// Whether one node of class c could take a pod of shape s, were it empty.
bool Allowed(const Shape& s, const NodeClass& c) {
  if (s.gpus > c.gpus || (c.cpu > 0 && s.cpu > c.cpu) || (c.memory > 0 && s.memory > c.memory)) return false;
  if (s.models.empty()) return true;
  return std::find(s.models.begin(), s.models.end(), c.model_id) != s.models.end();
}

// The relaxation's LP over `classes` and `shapes`, by column generation, with one share row per entry of
// `sizes` (thousandths of a GPU, ascending): a share of shape s takes a copy of sizes[s.group] in its GPU's
// pattern, and is worth its own share in the objective.
absl::StatusOr<Bound> SolveLp(const std::vector<NodeClass>& classes, const std::vector<Shape>& shapes,
                              const std::vector<int32_t>& sizes, int64_t capacity) {
  std::unique_ptr<glp_prob, LpDeleter> lp(glp_create_prob());
  glp_set_obj_dir(lp.get(), GLP_MAX);
  // Rows: one per shape (pods available), then per class: CPU, memory, GPUs, one per share size.
  const int shape_rows = static_cast<int>(shapes.size());
  glp_add_rows(lp.get(), shape_rows);
  for (int i = 0; i < shape_rows; ++i) {
    const Shape& s = shapes[static_cast<size_t>(i)];
    if (s.forced == s.count && s.forced > 0) {
      glp_set_row_bnds(lp.get(), i + 1, GLP_FX, static_cast<double>(s.count), static_cast<double>(s.count));
    } else {
      glp_set_row_bnds(lp.get(), i + 1, s.forced > 0 ? GLP_DB : GLP_UP, static_cast<double>(s.forced),
                       static_cast<double>(s.count));
    }
  }
  struct ClassRows {
    int cpu = 0, memory = 0, gpu = 0;
    std::vector<int> share;  // per share size
  };
  std::vector<ClassRows> rows(classes.size());
  for (size_t c = 0; c < classes.size(); ++c) {
    const NodeClass& k = classes[c];
    const int first = glp_add_rows(lp.get(), 3 + static_cast<int>(sizes.size()));
    rows[c].cpu = first;
    rows[c].memory = first + 1;
    rows[c].gpu = first + 2;
    // A node that does not account CPU or memory has any amount: a free row.
    if (k.cpu > 0) {
      glp_set_row_bnds(lp.get(), first, GLP_UP, 0, static_cast<double>(k.cpu * k.count));
    } else {
      glp_set_row_bnds(lp.get(), first, GLP_FR, 0, 0);
    }
    if (k.memory > 0) {
      glp_set_row_bnds(lp.get(), first + 1, GLP_UP, 0, static_cast<double>(k.memory * k.count));
    } else {
      glp_set_row_bnds(lp.get(), first + 1, GLP_FR, 0, 0);
    }
    glp_set_row_bnds(lp.get(), first + 2, GLP_UP, 0, static_cast<double>(k.gpus * k.count));
    for (size_t v = 0; v < sizes.size(); ++v) {
      rows[c].share.push_back(first + 3 + static_cast<int>(v));
      glp_set_row_bnds(lp.get(), first + 3 + static_cast<int>(v), GLP_UP, 0, 0);
    }
  }
  // Columns y[c,s].
  for (size_t c = 0; c < classes.size(); ++c) {
    for (size_t s = 0; s < shapes.size(); ++s) {
      const Shape& sh = shapes[s];
      if (!Allowed(sh, classes[c])) continue;
      int ind[5];
      double val[5];
      int n = 0;
      ind[++n] = static_cast<int>(s) + 1;
      val[n] = 1;
      ind[++n] = rows[c].cpu;
      val[n] = static_cast<double>(sh.cpu);
      ind[++n] = rows[c].memory;
      val[n] = static_cast<double>(sh.memory);
      if (sh.gpus > 0) {
        ind[++n] = sh.whole() ? rows[c].gpu : rows[c].share[sh.group];
        val[n] = sh.gpus;
      }
      const int col = glp_add_cols(lp.get(), 1);
      glp_set_col_bnds(lp.get(), col, GLP_LO, 0, 0);
      glp_set_obj_coef(lp.get(), col, sh.gpu_milli());
      glp_set_mat_col(lp.get(), col, n, ind, val);
    }
  }
  // Forced pods: a column per shape of "left out anyway" at a prohibitive price, so that the LP is feasible
  // while the patterns that fit the forced shares are still being generated (the first patterns hold one
  // share per GPU). A final solution that still uses one means not even the relaxation places them all.
  std::vector<int> left_out;
  constexpr double kForcedPenalty = 1e7;  // per pod; a pod holds at most 64 GPUs (64,000)
  for (int i = 0; i < shape_rows; ++i) {
    if (shapes[static_cast<size_t>(i)].forced == 0) continue;
    int ind[2] = {0, i + 1};
    double val[2] = {0, 1};
    const int col = glp_add_cols(lp.get(), 1);
    glp_set_col_bnds(lp.get(), col, GLP_LO, 0, 0);
    glp_set_obj_coef(lp.get(), col, -kForcedPenalty);
    glp_set_mat_col(lp.get(), col, 1, ind, val);
    left_out.push_back(col);
  }
  // Columns z[c,p]: a pattern of copies per share size; one GPU.
  Bound bound;
  // The patterns in the LP, per class. Pricing may propose one already there: the LP is optimal, so its
  // reduced cost is not positive, and only rounding in the big-M penalty's duals (1e7) made it look so.
  // Taking that as converged ends what otherwise repeats until the iteration limit (seen on
  // bench/variants.py's memory-heavy, seed 43).
  std::vector<std::set<std::vector<int>>> in_lp(classes.size());
  auto add_pattern = [&](size_t c, const std::vector<int>& copies) {
    if (!in_lp[c].insert(copies).second) return false;
    std::vector<int> ind(1);
    std::vector<double> val(1);
    ind.push_back(rows[c].gpu);
    val.push_back(1);
    for (size_t v = 0; v < sizes.size(); ++v) {
      if (copies[v] == 0) continue;
      ind.push_back(rows[c].share[v]);
      val.push_back(-copies[v]);
    }
    const int col = glp_add_cols(lp.get(), 1);
    glp_set_col_bnds(lp.get(), col, GLP_LO, 0, 0);
    glp_set_mat_col(lp.get(), col, static_cast<int>(ind.size()) - 1, ind.data(), val.data());
    ++bound.patterns;
    return true;
  };
  // Start from one share per GPU, which always fits.
  for (size_t c = 0; c < classes.size(); ++c) {
    for (size_t v = 0; v < sizes.size(); ++v) {
      std::vector<int> copies(sizes.size(), 0);
      copies[v] = 1;
      add_pattern(c, copies);
    }
  }

  glp_smcp parm;
  glp_init_smcp(&parm);
  parm.msg_lev = GLP_MSG_OFF;
  for (;;) {
    ++bound.iterations;
    const int rc = glp_simplex(lp.get(), &parm);
    if (rc != 0) return absl::InternalError(StrCat("GLPK's simplex failed (code ", rc, ")"));
    const int status = glp_get_status(lp.get());
    if (status == GLP_NOFEAS) {
      bound.feasible = false;
      bound.max_allocated_milli = 0;
      bound.unallocated_pct = 100;
      return bound;
    }
    if (status != GLP_OPT) return absl::InternalError(StrCat("GLPK ended with status ", status));
    // Pricing: per class, the pattern of largest value at the share rows' duals (an unbounded knapsack over
    // thousandths of a GPU), against the GPU row's dual.
    bool added = false;
    for (size_t c = 0; c < classes.size() && !sizes.empty(); ++c) {
      const double gpu_dual = glp_get_row_dual(lp.get(), rows[c].gpu);
      std::vector<double> duals(sizes.size());
      for (size_t v = 0; v < sizes.size(); ++v) duals[v] = glp_get_row_dual(lp.get(), rows[c].share[v]);
      std::vector<double> value(1001, 0);
      std::vector<int> last(1001, -1);  // the size added last to reach the best value at this capacity
      for (int w = 1; w <= 1000; ++w) {
        value[static_cast<size_t>(w)] = value[static_cast<size_t>(w - 1)];
        last[static_cast<size_t>(w)] = -2;  // same as w - 1
        for (size_t v = 0; v < sizes.size(); ++v) {
          if (sizes[v] > w) break;
          if (duals[v] <= 0) continue;
          const double candidate = value[static_cast<size_t>(w - sizes[v])] + duals[v];
          if (candidate > value[static_cast<size_t>(w)] + 1e-12) {
            value[static_cast<size_t>(w)] = candidate;
            last[static_cast<size_t>(w)] = static_cast<int>(v);
          }
        }
      }
      if (value[1000] - gpu_dual <= 1e-6 * std::max(1.0, gpu_dual)) continue;
      std::vector<int> copies(sizes.size(), 0);
      for (int w = 1000; w > 0;) {
        const int v = last[static_cast<size_t>(w)];
        if (v == -1) break;
        if (v == -2) {
          --w;
          continue;
        }
        ++copies[static_cast<size_t>(v)];
        w -= sizes[static_cast<size_t>(v)];
      }
      if (add_pattern(c, copies)) added = true;
    }
    if (!added) break;
    if (bound.iterations > 10000) return absl::InternalError("column generation did not converge");
  }
  double placed = 0;
  for (int col = 1; col <= glp_get_num_cols(lp.get()); ++col) {
    placed += glp_get_obj_coef(lp.get(), col) > 0
                  ? glp_get_obj_coef(lp.get(), col) * glp_get_col_prim(lp.get(), col)
                  : 0;
  }
  for (int col : left_out) {
    if (glp_get_col_prim(lp.get(), col) > 1e-6) bound.feasible = false;
  }
  bound.max_allocated_milli = placed;
  // Shares rounded down (grouped sizes) may seem to hold more than the GPUs: nothing leaves less than none.
  bound.unallocated_pct = std::max(0.0, 100.0 * (static_cast<double>(capacity) - bound.max_allocated_milli) /
                                            static_cast<double>(capacity));
  return bound;
}

}  // namespace

absl::StatusOr<Bound> LowerBound(const core::Cluster& cluster, std::span<const core::PodRequest* const> pods,
                                 std::span<const core::PodRequest* const> forced,
                                 const BoundOptions& options) {
  // Node classes.
  std::map<std::tuple<int, int, int64_t, int64_t>, size_t> class_index;
  std::vector<NodeClass> classes;
  int64_t capacity = 0;
  for (const core::NodeState& n : cluster.nodes()) {
    const int gpus = n.schedulable() ? n.healthy().Count() : 0;
    capacity += 1000 * n.healthy().Count();
    if (gpus == 0)
      continue;  // CPU-only nodes could take CPU-only pods; leaving them out only loosens
                 // the floor, and the offline bound places no CPU-only pod
    const int model = n.model_id(*n.healthy().begin());
    const auto key = std::make_tuple(model, gpus, n.info().cpu.value(), n.info().memory.value());
    auto [it, added] = class_index.try_emplace(key, classes.size());
    if (added) classes.push_back({model, gpus, n.info().cpu.value(), n.info().memory.value(), 0});
    ++classes[it->second].count;
  }
  if (capacity == 0) return absl::InvalidArgumentError("the cluster has no healthy GPU");

  // Pod shapes.
  std::map<std::tuple<int, int32_t, int64_t, int64_t, std::vector<int>>, size_t> shape_index;
  std::vector<Shape> shapes;
  auto add = [&](const core::PodRequest& p, bool is_forced) -> bool {
    int gpus = 0;
    int32_t share = 0;
    for (const core::ContainerRequest& c : p.containers) {
      for (const core::VGpuDemand& v : c.vgpus) {
        if (v.cores.value() == 0) return false;  // a share known only on a GPU
        ++gpus;
        share = std::max(share, v.cores.value());
      }
    }
    std::vector<int> models;
    for (const std::string& m : p.model_include) {
      const int id = cluster.ModelId(m);
      if (id >= 0) models.push_back(id);
    }
    if (!p.model_include.empty() && models.empty()) return false;  // fits nowhere
    std::sort(models.begin(), models.end());
    models.erase(std::unique(models.begin(), models.end()), models.end());
    const auto key = std::make_tuple(gpus, share, p.cpu.value(), p.memory.value(), models);
    auto [it, added] = shape_index.try_emplace(key, shapes.size());
    if (added) shapes.push_back({gpus, share, p.cpu.value(), p.memory.value(), models, 0, 0});
    Shape& s = shapes[it->second];
    ++(is_forced ? s.forced : s.count);
    return true;
  };
  const std::set<const core::PodRequest*> forced_set(forced.begin(), forced.end());
  for (const core::PodRequest* p : pods) add(*p, forced_set.contains(p));
  for (Shape& s : shapes) {
    s.count += s.forced;  // `add` counted forced pods apart
    // A pod that no node could take even empty is refused by every scheduler: it is never forced.
    bool fits_somewhere = false;
    for (const NodeClass& c : classes) {
      fits_somewhere = fits_somewhere || Allowed(s, c);
    }
    if (!fits_somewhere) s.forced = 0;
  }
  if (shapes.empty()) {
    Bound none;
    none.unallocated_pct = 100;
    return none;
  }

  // Share sizes, one row each: exact. Past `exact_share_sizes` of them (a workload whose shares take any
  // value), the LP grows by a row per size and class, and column generation needs a pattern for nearly every
  // pair of them: hours where twenty sizes take seconds. Then the sizes are grouped, `share_groups` groups of
  // consecutive sizes, and solved twice: each share as the smallest of its group (a relaxation: every
  // placement still fits, so the bound stays a bound) and as the largest (a restriction: its optimum is no
  // more than the exact LP's). The first is the bound; the distance between the two is how much the grouping
  // may have cost.
  std::vector<int32_t> distinct;
  for (const Shape& s : shapes) {
    if (s.gpus > 0 && !s.whole()) distinct.push_back(s.share);
  }
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  // Every size its own group (the exact LP), or no more groups than sizes: each group then holds one (an
  // empty one would price a share of size 0).
  const bool exact = distinct.size() <= options.exact_share_sizes;
  const size_t groups =
      exact ? distinct.size() : std::clamp<size_t>(options.share_groups, 1, distinct.size());
  auto group_of = [&](size_t size_index) { return size_index * groups / distinct.size(); };  // consecutive
  std::vector<int32_t> smallest(groups, 1000), largest(groups, 0);
  for (size_t i = 0; i < distinct.size(); ++i) {
    smallest[group_of(i)] = std::min(smallest[group_of(i)], distinct[i]);
    largest[group_of(i)] = distinct[i];
  }
  for (Shape& s : shapes) {
    if (s.gpus > 0 && !s.whole()) {
      s.group = group_of(static_cast<size_t>(std::lower_bound(distinct.begin(), distinct.end(), s.share) -
                                             distinct.begin()));
    }
  }
  absl::StatusOr<Bound> relaxed = SolveLp(classes, shapes, smallest, capacity);
  if (!relaxed.ok() || exact) return relaxed;
  absl::StatusOr<Bound> restricted = SolveLp(classes, shapes, largest, capacity);
  if (!restricted.ok()) return restricted.status();
  Bound out = *relaxed;
  out.share_sizes_grouped = true;
  // A restriction that cannot place the forced pods says nothing about the exact LP: the slack is unknown.
  out.grouping_slack_pct =
      restricted->feasible ? restricted->unallocated_pct - relaxed->unallocated_pct : NAN;
  out.patterns += restricted->patterns;
  out.iterations += restricted->iterations;
  return out;
}

absl::StatusOr<SeedBound> BoundForSeed(const core::Cluster& cluster,
                                       const std::vector<core::PodRequest>& pods, int64_t capacity_milli,
                                       uint64_t seed, double inflate, double forced_until) {
  std::vector<core::PodRequest> clones;
  absl::StatusOr<std::vector<const core::PodRequest*>> arrivals =
      ArrivalOrder(pods, capacity_milli, inflate, seed, clones);
  if (!arrivals.ok()) return arrivals.status();
  const std::vector<const core::PodRequest*>& order = *arrivals;
  // The pods arrived while they ask for at most 100% of the GPUs; the early ones, up to `forced_until`.
  std::vector<const core::PodRequest*> arrived;
  std::vector<const core::PodRequest*> early;
  int64_t asked = 0;
  for (const core::PodRequest* p : order) {
    asked += GpuMilli(*p);
    if (asked > capacity_milli) break;
    arrived.push_back(p);
    if (static_cast<double>(asked) <= forced_until * static_cast<double>(capacity_milli)) early.push_back(p);
  }
  SeedBound out;
  out.seed = seed;
  absl::StatusOr<Bound> offline = LowerBound(cluster, arrived);
  if (!offline.ok()) return offline.status();
  out.offline = *offline;
  absl::StatusOr<Bound> floor = LowerBound(cluster, arrived, early);
  if (!floor.ok()) return floor.status();
  out.online_floor = *floor;
  return out;
}

}  // namespace tessera::sim

// Tessera's own placement policy. See docs/placement.md ("tessera") for the reasoning and the measurements.
//
// It scores as FGD does (Weng et al., ATC '23): the node and GPU where the cluster's expected fragmentation
// grows least, at FGD's resolution (the study's int(100 * sigmoid(-growth / 1000))). That resolution is
// coarse on purpose: comparing the exact growth instead loses placement quality (on the Alibaba trace, 5.8%
// of the GPUs unallocated at 100% arrived instead of 4.7%), because placements that are as good as each other
// then stop falling onto the same nodes.
//
// To FGD's growth it adds two losses FGD's measure does not see, both in GPUs:
//   - GPU models others need. Pods bound to models keep arriving in the workload's proportions until the
//     cluster is full, so of the GPUs free now, the share demand_share(m) of the GPU asked will be asked by pods
//     bound to model m. pressure(m) = demand_share(m) x free GPUs / free GPUs of m (at most 1) is the part of
//     each free GPU of m those pods will need; a GPU taken there by a pod that could go elsewhere loses that
//     much. It is read from the cluster before each pod (Observe), so it rises as other pods fill a model and
//     falls when they leave; FGD's measure counts a model's idle GPUs alike however scarce the model is.
//   - Shares' terminal waste. FGD counts a GPU's free share as fragment while it is free; but shares keep
//     arriving, and a gap that the workload's shares fill closely is soon closed (a lone 0.32 gap of 0.68 by a
//     0.65), while one they cannot fill stays waste (0.21 after 0.47 + 0.32: only 0.16 and 0.11 shares fit, and
//     the 0.19 gaps of 0.81 shares already outnumber them). waste(gap) is the GPU a gap is expected to leave
//     when it is closed: filled by share class j with the chance fill(j) = min(1, future pods of j / gaps
//     already waiting for j), where future pods are the free GPU in the workload's proportions and a gap
//     waits for the largest class that fits it; what is left then is valued the same way. A share taking a
//     gap adds waste(after) - waste(before) to FGD's growth, in GPUs; a wholly free GPU's waste is 0 (whole
//     pods use it). The chances are read again each time the cluster's free GPU moves by 1/128 of its GPUs, and
//     the count of readings is part of state_key: between readings nodes' remembered answers stay valid.
//   - Host resources. FGD's measure ignores memory, and CPU but as a cliff. A node strands its free GPUs
//     beyond what its free CPU and memory can feed at the CPU and memory per GPU the workload's GPU pods ask;
//     each GPU a placement strands counts a quarter (a stranded GPU may still take a pod of less CPU).
// Within FGD's equally good placements, the same two again (stranded GPUs in quarter GPUs, so that
// placements that differ by a sliver stay ties), through tanh so that they only order ties. Last, whole GPUs
// follow the interconnect (Gaia's access-cost tree): within a node the nearest free group, across nodes the
// node whose group is nearest. What still ties goes to the Placer's tie-break (random, or a fixed node order).
#include <algorithm>
#include <cmath>
#include <map>

#include "core/placement/policies_internal.h"

namespace tessera::core {

namespace {

double StudyScore(double growth) {
  return std::floor(100.0 / (1.0 + std::exp(growth / 1000.0)));
}

// The resolution at which stranded GPUs are compared, in GPUs.
constexpr double kStrandResolution = 0.25;
// In FGD's growth, in GPUs of fragmentation: a GPU taken on a model under pressure p is p GPU lost to the
// pods bound to that model; a GPU stranded by host CPU or memory counts a quarter (measured:
// bench/variants.py, docs/placement.md).
constexpr double kPressureWeight = 1.0;
constexpr double kStrandWeight = 0.25;
// Where the CPU pods without GPU ask is at least kCpuOnlyShare of what the GPU pods ask, the CPU per GPU of
// the strand estimate is kCpuCompetition x the GPU pods' (measured on cpu-only-200/300, seeds 42-45: 1.5 left
// 45.86 and 59.94% against 46.12 and 60.45% at 1, 46.59 and 60.14% at 0.7; on the default trace, where they
// ask 0.29 of it, 1.5 left 4.00% against 3.87%, hence the gate).
constexpr double kCpuOnlyShare = 0.5;
constexpr double kCpuCompetition = 1.5;
// A GPU of shares' terminal waste, in GPUs of FGD's fragmentation (measured: docs/placement.md).
constexpr double kGapWeight = 12;
// The fill chances of the share classes move in 1/8 steps; they are read again each time the cluster's free
// GPU moves by 1/128 of its GPUs (a count of those readings is part of state_key, so that nodes' remembered
// answers stay valid in between).
constexpr int kFillSteps = 8;
constexpr int kFreeSteps = 128;

uint64_t Mix(uint64_t key, uint64_t value) {
  key ^= value + 0x9e3779b97f4a7c15ULL + (key << 6) + (key >> 2);
  return key;
}

class TesseraPolicy : public Policy {
 public:
  explicit TesseraPolicy(const PolicyContext& c)
      : model_(c.fragmentation),
        cpu_per_gpu_(static_cast<double>(c.cpu_per_gpu.value())),
        memory_per_gpu_(static_cast<double>(c.memory_per_gpu.value())),
        demand_share_(c.model_demand_share),
        views_(c.fragmentation) {
    // Until the cluster is observed: every GPU free.
    std::vector<double> free = c.model_supply;
    free.resize(demand_share_.size(), 0);
    SetPressure(free);
    // The share classes: the typical pods' shares below a GPU, with their part of the GPUs pods use.
    std::map<int64_t, double> classes;
    // Where pods without GPU ask much of the CPU (at least half of what the GPU pods ask), a free GPU needs
    // more CPU than its own pods ask: the CPU-only pods to come compete for it. Strands are then counted at
    // 1.5 x the GPU pods' CPU per GPU (measured: docs/placement.md, cpu-only-F).
    double cpu_only = 0;
    double cpu_gpu_pods = 0;
    for (const TypicalPod& t : model_->profile().pods) {
      (t.gpus > 0 ? cpu_gpu_pods : cpu_only) += t.popularity * static_cast<double>(t.cpu.value());
    }
    if (cpu_gpu_pods > 0 && cpu_only >= kCpuOnlyShare * cpu_gpu_pods) cpu_per_gpu_ *= kCpuCompetition;
    for (const TypicalPod& t : model_->profile().pods) {
      gpus_per_pod_ += t.popularity * t.gpus * static_cast<double>(t.share.value()) / 1000.0;
      if (t.gpus > 0 && t.share.value() > 0 && t.share < kWholeGpu) {
        classes[t.share.value()] += t.popularity * t.gpus;
      }
    }
    for (const auto& [share, popularity] : classes) {
      class_share_.push_back(share);
      class_popularity_.push_back(popularity);
    }
    // Until the cluster is observed: no gap is expected to be filled.
    waste_.resize(1001);
    for (size_t g = 0; g < 1000; ++g) waste_[g] = static_cast<double>(g) / 1000.0;
    waste_[1000] = 0;
    key_ = Mix(pressure_key_, fill_key_);
  }

  // Model pressure: how much of a model's free GPUs the constrained pods still to come will need. Pods keep
  // arriving in the workload's proportions until the cluster is full, so of the GPUs free now, a share
  // demand_share(m) will be asked by pods bound to m: pressure(m) = demand_share(m) x free GPUs / free GPUs
  // of m, at most 1. It rises as other pods fill the model; in 1/16 steps, so that the nodes' remembered
  // answers stay valid between steps.
  void Observe(const Cluster& cluster) const override {
    std::vector<double> free(demand_share_.size(), 0);
    double free_total = 0;
    double capacity = 0;
    for (const NodeState& n : cluster.nodes()) {
      if (!n.schedulable() || n.gpu_count() == 0) continue;
      const double node_free = n.total_free_cores().value() / 1000.0;
      free_total += node_free;
      capacity += n.healthy().Count();
      const auto m = static_cast<size_t>(n.model_id(0));
      if (m < free.size()) free[m] += node_free;
    }
    SetPressure(free);
    const int free_step = capacity > 0 ? static_cast<int>(free_total / capacity * kFreeSteps) : 0;
    if (!class_share_.empty() && (!filled_ || free_step != free_step_)) {
      free_step_ = free_step;
      std::vector<double> gaps(class_share_.size(), 0);
      for (const NodeState& n : cluster.nodes()) {
        if (!n.schedulable()) continue;
        for (int g : n.healthy()) {
          const int64_t f = n.free_cores(g).value();
          if (f <= 0 || f >= kWholeGpu.value()) continue;
          // The gap waits for the largest class that fits it.
          auto it = std::upper_bound(class_share_.begin(), class_share_.end(), f);
          if (it != class_share_.begin()) gaps[static_cast<size_t>(it - class_share_.begin() - 1)] += 1;
        }
      }
      SetFill(gaps, free_total);
    }
    key_ = Mix(pressure_key_, fill_key_);
  }
  uint64_t state_key() const override { return key_; }
  // Model pressure prices the GPUs a pod takes, the waste table the shares it places: a pod without GPU
  // reads neither, a pod of whole GPUs only the pressure. So the readings that follow the cluster as it fills
  // leave those pods' remembered answers valid.
  uint64_t state_key(const CompiledRequest& pod) const override {
    if (!pod.request().wants_gpu()) return 0;
    for (const VGpuDemand& v : pod.vgpus()) {
      if (!v.exclusive()) return key_;
    }
    return pressure_key_;
  }

  // A share changing a GPU's free share: the terminal waste it adds, in thousandths of a GPU.
  double GapCost(MilliGpu before, MilliGpu after) const {
    return 1000 * kGapWeight *
           (waste_[static_cast<size_t>(after.value())] - waste_[static_cast<size_t>(before.value())]);
  }
  std::string_view name() const override { return "tessera"; }

  bool SelectGpus(const NodeScratch& node, const CompiledRequest& pod, std::span<const VGpuDemand> vgpus,
                  GpuMask eligible, Rng&, std::span<int8_t> out, double& cost) const override {
    const FragmentationViews::View& e = views_.Get(node.node());
    // Earlier containers of this pod already changed some GPUs: start from there. The pod's CPU is taken
    // once: in the first container's change, and already in the others' "before".
    FragmentationViews::Changes changes;
    size_t n = FragmentationViews::EarlierChanges(node, changes);
    const MilliCpu cpu = pod.request().cpu;
    const double before = n == 0 ? e.fragment : model_->FragmentAfter(e.node, cpu, {changes.data(), n});
    GpuMask taken;
    double after = before;
    // Whole GPUs first, by Gaia's access-cost tree: one by Singular (keep intact pairs intact), several by
    // Link (the nearest group). Every wholly free GPU changes fragmentation alike, so topology decides
    // which; ties go by a draw seeded with the node's state, so that the answer is the same for the same
    // state (the evaluation cache relies on it).
    std::array<size_t, kMaxGpusPerNode> whole{};
    size_t whole_count = 0;
    for (size_t i = 0; i < vgpus.size(); ++i) {
      if (vgpus[i].exclusive()) whole[whole_count++] = i;
    }
    if (whole_count > 0) {
      const GpuMask candidates = node.Fitting(vgpus[whole[0]], eligible);
      Rng draw(node.node().version() * 0x9e3779b97f4a7c15ULL + n);
      std::optional<GpuMask> chosen;
      if (whole_count == 1) {
        if (std::optional<int> g = node.node().tree().ScheduleSingular(node.free_cores(), candidates, draw)) {
          chosen = GpuMask::Of(*g);
        }
      } else {
        chosen = node.node().tree().ScheduleLink(node.free_cores(), candidates, static_cast<int>(whole_count),
                                                 draw);
      }
      if (!chosen || chosen->Count() != static_cast<int>(whole_count)) return false;
      size_t k = 0;
      for (int g : *chosen) {
        out[whole[k++]] = static_cast<int8_t>(g);
        changes[n++] = {node.free_cores(g), MilliGpu(0)};
      }
      taken = *chosen;
      after = model_->FragmentAfter(e.node, cpu, {changes.data(), n});
    }
    // Then each share: the GPU where fragmentation and the gap's terminal waste grow least; among equals the
    // one with the least free share (best fit), then the lowest index.
    // GPUs with the same free share are the same candidate.
    double gap_cost = 0;
    for (size_t i = 0; i < vgpus.size(); ++i) {
      if (vgpus[i].exclusive()) continue;
      double best = 0;
      int best_gpu = -1;
      MilliGpu best_free(0);
      std::array<MilliGpu, kMaxGpusPerNode> seen;
      size_t seen_count = 0;
      for (int g : node.Fitting(vgpus[i], eligible & ~taken)) {
        const MilliGpu free = node.free_cores(g);
        if (std::find(seen.begin(), seen.begin() + static_cast<std::ptrdiff_t>(seen_count), free) !=
            seen.begin() + static_cast<std::ptrdiff_t>(seen_count)) {
          continue;
        }
        seen[seen_count++] = free;
        changes[n] = {free, free - node.RealizeOn(vgpus[i], g).cores};
        const double f = model_->FragmentAfter(e.node, cpu, {changes.data(), n + 1}) +
                         GapCost(changes[n].first, changes[n].second);
        if (best_gpu < 0 || f < best - 1e-9 || (f < best + 1e-9 && free < best_free)) {
          best = f;
          best_gpu = g;
          best_free = free;
        }
      }
      if (best_gpu < 0) return false;
      out[i] = static_cast<int8_t>(best_gpu);
      taken.Add(best_gpu);
      changes[n] = {best_free, best_free - node.RealizeOn(vgpus[i], best_gpu).cores};
      const double gap = GapCost(changes[n].first, changes[n].second);
      ++n;
      gap_cost += gap;
      after = best - gap;
    }
    cost += after - before + gap_cost;
    return true;
  }

  double Score(const NodeScratch& after, const CompiledRequest& pod, const PodChoice& choice,
               Rng&) const override {
    const NodeState& node = after.node();
    double growth = choice.selection_cost;
    if (choice.count == 0) {
      const FragmentationViews::View& e = views_.Get(node);
      growth = model_->FragmentAfter(e.node, pod.request().cpu, {}) - e.fragment;
    }
    // GPUs stranded by host resources: free GPUs beyond what the free CPU and memory can feed.
    // (Per-GPU demands of 0, a workload whose GPU pods ask no CPU or memory, constrain nothing.)
    auto stranded = [this](double gpus, double cpu, double memory) {
      const double by_cpu = cpu_per_gpu_ > 0 ? cpu / cpu_per_gpu_ : gpus;
      const double by_memory = memory_per_gpu_ > 0 ? memory / memory_per_gpu_ : gpus;
      return gpus - std::clamp(std::min(by_cpu, by_memory), 0.0, gpus);
    };
    const double gpus = node.total_free_cores().value() / 1000.0;
    const double taken = after.taken_cores().value() / 1000.0;
    const double cpu = static_cast<double>(node.free_cpu().value());
    const double memory =
        node.tracks_host_memory() ? static_cast<double>(node.free_host_memory().value()) : 1e18;
    const double cpu_asked = node.tracks_cpu() ? static_cast<double>(pod.request().cpu.value()) : 0.0;
    const double memory_asked = static_cast<double>(pod.request().memory.value());
    const double raw_strands =
        stranded(gpus - taken, node.tracks_cpu() ? cpu - cpu_asked : 1e18, memory - memory_asked) -
        stranded(gpus, node.tracks_cpu() ? cpu : 1e18, memory);
    const double strands = std::round(raw_strands / kStrandResolution) * kStrandResolution;
    // GPUs of a model that the model-constrained pods still to come need (Observe).
    double pressure = 0;
    if (node.gpu_count() > 0 && static_cast<size_t>(node.model_id(0)) < pressure_.size()) {
      pressure = pressure_[static_cast<size_t>(node.model_id(0))] * taken;
    }
    // Last, for pods of several whole GPUs: the nearer the GPUs, the better (Gaia's access cost, 0-60).
    GpuMask whole;
    for (int i = 0; i < choice.count; ++i) {
      const int g = choice.gpus[static_cast<size_t>(i)];
      if (node.free_cores(g) == kWholeGpu && after.free_cores(g).value() == 0) whole.Add(g);
    }
    const double distance = whole.Count() > 1 ? node.tree().CostOf(whole) / 60.0 : 0.0;
    // Both are losses FGD's measure does not see: added to its growth, at FGD's resolution.
    growth += 1000 * (kPressureWeight * pressure + kStrandWeight * raw_strands);
    return 10 * StudyScore(growth) - std::tanh(strands + pressure) - 0.01 * distance;
  }

 private:
  std::shared_ptr<const FragmentationModel> model_;
  double cpu_per_gpu_;
  double memory_per_gpu_;
  void SetPressure(const std::vector<double>& free) const {
    double total = 0;
    for (double f : free) total += f;
    pressure_.assign(free.size(), 0);
    uint64_t key = 0;
    for (size_t m = 0; m < free.size(); ++m) {
      const double p = free[m] > 0 ? std::min(1.0, demand_share_[m] * total / free[m]) : 1.0;
      const int step = static_cast<int>(std::round(p * kPressureSteps));
      pressure_[m] = step / static_cast<double>(kPressureSteps);
      key = key * 31 + static_cast<uint64_t>(step);
    }
    pressure_key_ = key;
  }
  static constexpr int kPressureSteps = 16;

  // Each share class's chance to fill a gap waiting for it: the pods of the class still to come (the free
  // GPU, in the workload's proportions) over those gaps (and the one being made), at most 1, in 1/8 steps;
  // then the terminal waste of every gap size, the best class to wait for, recursively.
  void SetFill(const std::vector<double>& gaps, double free_total) const {
    if (class_share_.empty()) return;
    const double pods = gpus_per_pod_ > 0 ? free_total / gpus_per_pod_ : 0;
    std::vector<double> fill(class_share_.size());
    uint64_t key = 0x51ab1e;
    for (size_t j = 0; j < fill.size(); ++j) {
      const double chance = std::min(1.0, class_popularity_[j] * pods / (gaps[j] + 1));
      const int step = static_cast<int>(std::round(chance * kFillSteps));
      fill[j] = step / static_cast<double>(kFillSteps);
      key = Mix(key, static_cast<uint64_t>(step));
    }
    if (key == fill_chances_ && filled_) return;
    fill_chances_ = key;
    fill_key_ = ++fill_readings_;
    filled_ = true;
    for (size_t g = 1; g < 1000; ++g) {
      const double gap = static_cast<double>(g) / 1000.0;
      double w = gap;
      for (size_t j = 0; j < fill.size() && static_cast<size_t>(class_share_[j]) <= g; ++j) {
        w = std::min(w, fill[j] * waste_[g - static_cast<size_t>(class_share_[j])] + (1 - fill[j]) * gap);
      }
      waste_[g] = w;
    }
  }

  std::vector<double> demand_share_;
  mutable std::vector<double> pressure_;
  mutable uint64_t pressure_key_ = 0;
  mutable uint64_t key_ = 0;
  // Share classes (typical shares below a GPU, ascending) and their part of the pods' GPUs; the GPUs a pod
  // uses on average; the terminal waste of a gap by its size in thousandths (1000: a wholly free GPU, 0).
  std::vector<int64_t> class_share_;
  std::vector<double> class_popularity_;
  double gpus_per_pod_ = 0;
  mutable std::vector<double> waste_;
  mutable uint64_t fill_chances_ = 0;  // the chances' steps, hashed
  mutable uint64_t fill_readings_ = 0;
  mutable uint64_t fill_key_ = 0;  // which waste table: the count of tables computed
  mutable int free_step_ = -1;
  mutable bool filled_ = false;
  FragmentationViews views_;
};

}  // namespace

std::unique_ptr<Policy> NewTesseraPolicy(const PolicyContext& context) {
  return std::make_unique<TesseraPolicy>(context);
}

}  // namespace tessera::core

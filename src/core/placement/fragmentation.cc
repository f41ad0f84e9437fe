#include "core/placement/fragmentation.h"

#include <algorithm>
#include <array>
#include <map>
#include <tuple>

#include "core/strings.h"

namespace tessera::core {

WorkloadProfile WorkloadProfile::FromPods(std::span<const PodRequest> pods, double coverage) {
  // Shape key: CPU, share per GPU, GPU count, the allowed models as written.
  using Key = std::tuple<int64_t, int32_t, int, std::string>;
  std::map<Key, int64_t> counts;
  std::map<Key, std::vector<std::string>> models;
  int64_t total = 0;
  for (const PodRequest& p : pods) {
    int gpus = 0;
    MilliGpu share(0);
    bool unknown = false;
    for (const ContainerRequest& c : p.containers) {
      for (const VGpuDemand& v : c.vgpus) {
        ++gpus;
        unknown = unknown || v.cores.value() == 0;
        share = std::max(share, v.cores);
      }
    }
    if (unknown) continue;
    Key key{p.cpu.value(), share.value(), gpus, gpus > 0 ? StrJoin(p.model_include, "|") : std::string()};
    ++counts[key];
    models[key] = gpus > 0 ? p.model_include : std::vector<std::string>();
    ++total;
  }
  std::vector<std::pair<Key, int64_t>> sorted(counts.begin(), counts.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    if (a.second != b.second) return a.second > b.second;
    return a.first > b.first;
  });
  WorkloadProfile profile;
  int64_t covered = 0;
  for (const auto& [key, count] : sorted) {
    if (static_cast<double>(covered) >= coverage * static_cast<double>(total)) break;
    TypicalPod t;
    t.cpu = MilliCpu(std::get<0>(key));
    t.share = MilliGpu(std::get<1>(key));
    t.gpus = std::get<2>(key);
    t.models = models[key];
    t.count = count;
    profile.pods.push_back(std::move(t));
    covered += count;
  }
  for (TypicalPod& t : profile.pods)
    t.popularity = static_cast<double>(t.count) / static_cast<double>(covered);
  return profile;
}

FragmentationModel::FragmentationModel(WorkloadProfile profile, const Cluster& cluster)
    : profile_(std::move(profile)), model_count_(cluster.model_count()) {
  for (const TypicalPod& t : profile_.pods) {
    if (t.gpus == 0) {
      threshold_of_.push_back(-1);
      continue;
    }
    auto it = std::find(thresholds_.begin(), thresholds_.end(), t.share);
    if (it == thresholds_.end()) {
      thresholds_.push_back(t.share);
      it = thresholds_.end() - 1;
    }
    threshold_of_.push_back(static_cast<int>(it - thresholds_.begin()));
  }
  allowed_.assign(profile_.pods.size() * static_cast<size_t>(model_count_), 0);
  for (size_t t = 0; t < profile_.pods.size(); ++t) {
    for (int m = 0; m < model_count_; ++m) {
      const std::vector<std::string>& allowed = profile_.pods[t].models;
      allowed_[t * static_cast<size_t>(model_count_) + static_cast<size_t>(m)] =
          allowed.empty() || std::find(allowed.begin(), allowed.end(), cluster.ModelName(m)) != allowed.end();
    }
  }
}

bool FragmentationModel::Allowed(size_t typical, int model_id) const {
  if (model_id < 0 || model_id >= model_count_) return profile_.pods[typical].models.empty();
  return allowed_[typical * static_cast<size_t>(model_count_) + static_cast<size_t>(model_id)] != 0;
}

FragmentationModel::NodeView FragmentationModel::Prepare(const NodeState& node) const {
  // A node of several models is rare; take its first GPU's model, as the trace's nodes have one.
  const int model = node.gpu_count() > 0 ? node.model_id(0) : -1;
  // A node that does not account CPU has all the CPU any pod asks for; unhealthy GPUs take no pods.
  const MilliCpu cpu = node.tracks_cpu() ? node.free_cpu() : MilliCpu(int64_t{1} << 50);
  std::array<MilliGpu, kMaxGpusPerNode> free{};
  size_t n = 0;
  for (int g : node.healthy()) free[n++] = node.free_cores(g);
  return Prepare(model, cpu, {free.data(), n});
}

FragmentationModel::NodeView FragmentationModel::Prepare(int model_id, MilliCpu cpu,
                                                         std::span<const MilliGpu> free) const {
  NodeView v;
  v.model_id = model_id;
  v.cpu = cpu;
  v.fit_count.assign(thresholds_.size(), 0);
  v.partial.assign(thresholds_.size(), 0);
  for (size_t m = 0; m < profile_.pods.size(); ++m) {
    if (threshold_of_[m] >= 0 && Allowed(m, model_id)) {
      v.active.push_back(static_cast<uint16_t>(m));
    } else {
      v.idle_weight += profile_.pods[m].popularity;
    }
  }
  std::stable_sort(v.active.begin(), v.active.end(),
                   [this](uint16_t a, uint16_t b) { return threshold_of_[a] < threshold_of_[b]; });
  for (MilliGpu f : free) {
    v.idle += f.value();
    for (size_t t = 0; t < thresholds_.size(); ++t) {
      if (f >= thresholds_[t]) {
        ++v.fit_count[t];
      } else {
        v.partial[t] += f.value();
      }
    }
  }
  return v;
}

double FragmentationModel::Fragment(const NodeView& view) const {
  return FragmentAfter(view, MilliCpu(0), {});
}

double FragmentationModel::FragmentAfter(const NodeView& view, MilliCpu cpu_taken,
                                         std::span<const std::pair<MilliGpu, MilliGpu>> changes) const {
  const MilliCpu cpu = view.cpu - cpu_taken;
  int64_t idle = view.idle;
  for (const auto& [before, after] : changes) idle += after.value() - before.value();
  double total = view.idle_weight * static_cast<double>(idle);
  // Per share threshold, the node's fitting GPUs and the free share of the others after the changes;
  // computed once per threshold, as `active` is ordered by threshold.
  int current = -1;
  MilliGpu r(0);
  int fits = 0;
  int64_t partial = 0;
  for (uint16_t m : view.active) {
    const TypicalPod& t = profile_.pods[m];
    const int th = threshold_of_[m];
    if (th != current) {
      current = th;
      r = thresholds_[static_cast<size_t>(th)];
      fits = view.fit_count[static_cast<size_t>(th)];
      partial = view.partial[static_cast<size_t>(th)];
      for (const auto& [before, after] : changes) {
        if (before >= r) {
          --fits;
        } else {
          partial -= before.value();
        }
        if (after >= r) {
          ++fits;
        } else {
          partial += after.value();
        }
      }
    }
    // m fits (enough GPUs with its share free, and the CPU): only the smaller GPUs' share is lost to it.
    const int64_t fragment = fits >= t.gpus && cpu >= t.cpu ? partial : idle;
    total += t.popularity * static_cast<double>(fragment);
  }
  return total;
}

std::vector<double> FragmentationModel::GpuFragments(const NodeState& node) const {
  std::vector<double> out(static_cast<size_t>(node.gpu_count()), 0.0);
  const NodeView view = Prepare(node);
  std::vector<int> healthy;
  for (int g : node.healthy()) healthy.push_back(g);
  // Typical pods that can use none of the node: every healthy GPU's idle share.
  double whole = view.idle_weight;
  // Per active typical pod that fits the node: the GPUs below its share lose their idle share to it.
  std::vector<std::pair<MilliGpu, double>> below;  // (share, popularity)
  for (uint16_t m : view.active) {
    const TypicalPod& t = profile_.pods[m];
    const size_t th = static_cast<size_t>(threshold_of_[m]);
    if (view.fit_count[th] >= t.gpus && view.cpu >= t.cpu) {
      below.emplace_back(thresholds_[th], t.popularity);
    } else {
      whole += t.popularity;
    }
  }
  for (int g : healthy) {
    const MilliGpu free = node.free_cores(g);
    double weight = whole;
    for (const auto& [share, popularity] : below) {
      if (free < share) weight += popularity;
    }
    out[static_cast<size_t>(g)] = weight * static_cast<double>(free.value());
  }
  return out;
}

}  // namespace tessera::core

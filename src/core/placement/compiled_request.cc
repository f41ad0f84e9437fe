#include "core/placement/compiled_request.h"

#include <algorithm>

namespace tessera::core {

CompiledRequest::CompiledRequest(const Cluster& cluster, const PodRequest& request) : request_(&request) {
  starts_.push_back(0);
  min_cores_ = kWholeGpu;
  for (const ContainerRequest& c : request.containers) {
    max_container_vgpus_ = std::max(max_container_vgpus_, static_cast<int>(c.vgpus.size()));
    for (const VGpuDemand& v : c.vgpus) {
      vgpus_.push_back(v);
      if (v.exclusive()) ++exclusive_;
      min_cores_ = std::min(min_cores_, v.cores.value() > 0 ? v.cores : MilliGpu(1));
    }
    starts_.push_back(vgpus_.size());
  }
  if (vgpus_.empty()) min_cores_ = MilliGpu(0);
  shape_tag_ = PodShapeTag(request);
  if (!request.model_include.empty() || !request.model_exclude.empty()) {
    allowed_models_.assign(static_cast<size_t>(cluster.model_count()), request.model_include.empty() ? 1 : 0);
    for (const std::string& m : request.model_include) {
      for (int id : cluster.ModelIds(m, request.model_include_substring)) allowed_models_[static_cast<size_t>(id)] = 1;
    }
    for (const std::string& m : request.model_exclude) {
      for (int id : cluster.ModelIds(m, request.model_exclude_substring)) allowed_models_[static_cast<size_t>(id)] = 0;
    }
  }
  quota_left_.resize(static_cast<size_t>(cluster.model_count()));
  for (int m = 0; m < cluster.model_count(); ++m) {
    std::optional<MilliGpu> limit = cluster.Quota(request.ns, m);
    if (limit) quota_left_[static_cast<size_t>(m)] = *limit - cluster.QuotaUsed(request.ns, m);
  }
  // FNV-1a over the evaluation's inputs.
  uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ULL;
    }
  };
  for (size_t c = 0; c + 1 < starts_.size(); ++c) {
    mix(0xc0c0 + starts_[c + 1] - starts_[c]);
    for (size_t k = starts_[c]; k < starts_[c + 1]; ++k) {
      mix(static_cast<uint64_t>(vgpus_[k].cores.value()));
      mix(static_cast<uint64_t>(vgpus_[k].memory.kind) << 56 ^ static_cast<uint64_t>(vgpus_[k].memory.value));
    }
  }
  mix(static_cast<uint64_t>(request.cpu.value()));
  mix(static_cast<uint64_t>(request.memory.value()));
  mix(static_cast<uint64_t>(request.priority == Priority::kHigh) | static_cast<uint64_t>(request.numa_bind)
                                                                       << 1);
  for (char a : allowed_models_) mix(static_cast<uint64_t>(a) + 7);
  for (const std::optional<MilliGpu>& q : quota_left_)
    mix(q ? static_cast<uint64_t>(q->value()) : ~uint64_t{0});
  for (const GpuUuid& u : request.uuid_include) {
    for (char ch : u.value()) mix(static_cast<uint64_t>(ch));
    mix(1);
  }
  for (const GpuUuid& u : request.uuid_exclude) {
    for (char ch : u.value()) mix(static_cast<uint64_t>(ch));
    mix(2);
  }
  fingerprint_ = h;
}

bool CompiledRequest::ModelAllowed(int model_id) const {
  if (allowed_models_.empty()) return true;
  return model_id >= 0 && static_cast<size_t>(model_id) < allowed_models_.size() &&
         allowed_models_[static_cast<size_t>(model_id)] != 0;
}

std::optional<MilliGpu> CompiledRequest::QuotaLeft(int model_id) const {
  if (model_id < 0 || static_cast<size_t>(model_id) >= quota_left_.size()) return std::nullopt;
  return quota_left_[static_cast<size_t>(model_id)];
}

GpuMask CompiledRequest::UuidAllowed(const NodeState& node) const {
  const PodRequest& r = *request_;
  GpuMask all = GpuMask::All(node.gpu_count());
  if (r.uuid_include.empty() && r.uuid_exclude.empty()) return all;
  GpuMask out = r.uuid_include.empty() ? all : GpuMask();
  for (int g = 0; g < node.gpu_count(); ++g) {
    const GpuUuid& u = node.gpu(g).uuid;
    if (std::find(r.uuid_include.begin(), r.uuid_include.end(), u) != r.uuid_include.end()) out.Add(g);
    if (std::find(r.uuid_exclude.begin(), r.uuid_exclude.end(), u) != r.uuid_exclude.end()) out.Remove(g);
  }
  return out;
}

}  // namespace tessera::core

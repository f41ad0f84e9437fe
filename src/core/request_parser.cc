#include "core/request_parser.h"

#include <algorithm>
#include <array>
#include <limits>
#include <set>

#include "absl/status/status.h"
#include "core/gpu_mask.h"
#include "core/quantity.h"
#include "core/strings.h"

namespace tessera::core {

const char* ToString(ResourceFamily f) {
  switch (f) {
    case ResourceFamily::kNone:
      return "none";
    case ResourceFamily::kTessera:
      return "Tessera";
    case ResourceFamily::kHami:
      return "HAMi";
    case ResourceFamily::kGpuManager:
      return "gpu-manager";
    case ResourceFamily::kGpushare:
      return "gpushare";
    case ResourceFamily::kVolcano:
      return "Volcano";
  }
  return "none";
}

namespace {

// How a resource's number is read.
enum class Unit { kCount, kPercent, kMiB, kGpuManagerCore, kGpuManager256MiB, kGpushareMemory };

struct KnownResource {
  std::string name;
  ResourceFamily family;
  enum Role { kGpu, kCores, kMemory, kMemoryPercent, kPriority } role;
  Unit unit;
};

// Every resource name read, HAMi's as the options name them.
std::vector<KnownResource> Known(const ParseOptions& o) {
  return {
      {kResourceGpu, ResourceFamily::kTessera, KnownResource::kGpu, Unit::kCount},
      {kResourceCores, ResourceFamily::kTessera, KnownResource::kCores, Unit::kPercent},
      {kResourceMemory, ResourceFamily::kTessera, KnownResource::kMemory, Unit::kMiB},
      {kResourceMemoryPercent, ResourceFamily::kTessera, KnownResource::kMemoryPercent, Unit::kPercent},
      {o.hami.gpu, ResourceFamily::kHami, KnownResource::kGpu, Unit::kCount},
      {o.hami.cores, ResourceFamily::kHami, KnownResource::kCores, Unit::kPercent},
      {o.hami.memory, ResourceFamily::kHami, KnownResource::kMemory, Unit::kMiB},
      {o.hami.memory_percent, ResourceFamily::kHami, KnownResource::kMemoryPercent, Unit::kPercent},
      {o.hami.priority, ResourceFamily::kHami, KnownResource::kPriority, Unit::kCount},
      {"tencent.com/vcuda-core", ResourceFamily::kGpuManager, KnownResource::kCores, Unit::kGpuManagerCore},
      {"tencent.com/vcuda-memory", ResourceFamily::kGpuManager, KnownResource::kMemory,
       Unit::kGpuManager256MiB},
      {"aliyun.com/gpu-mem", ResourceFamily::kGpushare, KnownResource::kMemory, Unit::kGpushareMemory},
      {kGpushareCount, ResourceFamily::kGpushare, KnownResource::kGpu, Unit::kCount},
      {"volcano.sh/vgpu-number", ResourceFamily::kVolcano, KnownResource::kGpu, Unit::kCount},
      {"volcano.sh/vgpu-cores", ResourceFamily::kVolcano, KnownResource::kCores, Unit::kPercent},
      {"volcano.sh/vgpu-memory", ResourceFamily::kVolcano, KnownResource::kMemory, Unit::kMiB},
      {"volcano.sh/vgpu-memory-percentage", ResourceFamily::kVolcano, KnownResource::kMemoryPercent,
       Unit::kPercent},
  };
}

// One GPU resource as the user wrote it.
struct Field {
  std::string name;
  int64_t value = 0;
};

// A container's GPU ask in Tessera's terms, with the names the user wrote (for messages).
struct Ask {
  ResourceFamily family = ResourceFamily::kNone;
  std::optional<Field> gpu;
  std::optional<Field> cores;           // percent per vGPU; above 100 without gpu: the "2.5 GPUs" form
  std::optional<Field> memory;          // MiB per vGPU
  std::optional<Field> memory_percent;  // percent of the GPU's memory per vGPU
  std::optional<Field> priority;        // HAMi's task priority: 0 high, else low
  bool no_core_limit = false;           // HAMi or Volcano with gpucores left out or 0
};

// No name: the caller names the container itself (the admission webhook's "container m: ..."; a placeholder
// name here used to double it: container m: container "container": ...).
std::string In(const std::string& container) {
  return container.empty() ? std::string() : StrCat("container \"", container, "\": ");
}

absl::Status Invalid(const std::string& container, std::string_view message) {
  return absl::InvalidArgumentError(StrCat(In(container), message));
}

// The integer value of one resource, from limits or requests (they must agree: extended resources cannot be
// overcommitted).
absl::StatusOr<std::optional<Field>> ReadField(const ContainerSpec& c, const KnownResource& r) {
  auto lim = c.limits.find(r.name);
  auto req = c.requests.find(r.name);
  if (lim == c.limits.end() && req == c.requests.end()) return std::optional<Field>();
  const std::string& text = lim != c.limits.end() ? lim->second : req->second;
  absl::StatusOr<K8sQuantity> q = ParseQuantity(text);
  if (!q.ok()) return Invalid(c.name, StrCat(r.name, ": ", q.status().message()));
  if (lim != c.limits.end() && req != c.requests.end()) {
    absl::StatusOr<K8sQuantity> q2 = ParseQuantity(req->second);
    if (!q2.ok()) return Invalid(c.name, StrCat(r.name, " (requests): ", q2.status().message()));
    if (q2->milli != q->milli) {
      return Invalid(c.name, StrCat(r.name, " is ", lim->second, " in limits but ", req->second,
                                    " in requests; extended resources cannot be overcommitted: set both to ",
                                    lim->second, " (or give only limits)"));
    }
  }
  const bool memory_unit = r.unit == Unit::kMiB;
  if (!q->suffix.empty() && q->suffix != "k" && !(q->suffix[0] == 'e' || q->suffix[0] == 'E')) {
    if (memory_unit && q->suffix.size() == 2 && q->suffix[1] == 'i' && q->milli > 0) {
      // "4Gi": the user wrote bytes; say how many MiB that is.
      const int64_t mib = q->Ceil() >> 20;
      return Invalid(c.name, StrCat(r.name, " is counted in MiB, so \"", text, "\" would mean ", q->Ceil(),
                                    " MiB; write ", mib > 0 ? mib : 1, " for ", text));
    }
    if (q->suffix == "m") {
      // Say what the value is: "30000m" is 30 (the number before the m used to be suggested: "write 30000").
      std::string value = StrCat(q->milli / 1000);
      if (q->milli % 1000 != 0) {
        std::string frac = StrCat(1000 + q->milli % 1000).substr(1);
        while (frac.back() == '0') frac.pop_back();
        value = StrCat(value, ".", frac);
      }
      if (q->IsInteger()) {
        return Invalid(c.name, StrCat(r.name, " is \"", text, "\", which is ", value,
                                      " (the m suffix means thousandths); write ", value));
      }
      return Invalid(c.name,
                     StrCat(r.name, " is \"", text, "\", which is ", value,
                            " (the m suffix means thousandths), not a whole number; write a plain whole ",
                            "number", memory_unit ? " of MiB" : ""));
    }
    return Invalid(c.name, StrCat(r.name, " must be a plain whole number, not \"", text, "\""));
  }
  if (!q->IsInteger()) {
    return Invalid(c.name, StrCat(r.name, " must be a whole number, not \"", text, "\""));
  }
  if (q->milli < 0) return Invalid(c.name, StrCat(r.name, " cannot be negative (\"", text, "\")"));
  // No GPU has 2^40 MiB; larger values only invite overflow further on.
  constexpr int64_t kLargest = int64_t{1} << 40;
  if (q->milli / 1000 > kLargest) {
    return Invalid(c.name, StrCat(r.name, " is ", text, ", more than any GPU could hold; check the value"));
  }
  return std::optional<Field>(Field{r.name, q->milli / 1000});
}

// Reads the GPU resources of a container and translates other systems' names into an Ask in Tessera's terms.
// `gpushare_count` is the pod's aliyun.com/gpu-count label.
absl::StatusOr<Ask> ReadAsk(const ContainerSpec& c, const ParseOptions& options,
                            std::optional<int64_t> gpushare_count = {}) {
  Ask raw;
  std::set<ResourceFamily> families;
  const std::vector<KnownResource> known = Known(options);
  std::vector<std::optional<Field>> values(known.size());
  for (size_t i = 0; i < known.size(); ++i) {
    absl::StatusOr<std::optional<Field>> f = ReadField(c, known[i]);
    if (!f.ok()) return f.status();
    values[i] = *f;
    if (*f) families.insert(known[i].family);
  }
  if (families.empty()) return raw;
  if (families.size() > 1) {
    std::vector<std::string> names;
    for (size_t i = 0; i < known.size(); ++i) {
      if (values[i]) names.push_back(values[i]->name);
    }
    return Invalid(c.name, StrCat("mixes the GPU resources of different systems (", StrJoin(names, ", "),
                                  "); use one system's names, preferably tessera.dev/*"));
  }
  raw.family = *families.begin();
  for (size_t i = 0; i < known.size(); ++i) {
    if (!values[i]) continue;
    Field f = *values[i];
    switch (known[i].unit) {
      case Unit::kGpuManagerCore:
        // gpu-manager: 100 per GPU. A multiple of 100 is that many whole GPUs; below 100, a share of one.
        if (f.value >= 100) {
          if (f.value % 100 != 0) {
            return Invalid(c.name,
                           StrCat(f.name, " is ", f.value, ": above 100 it must be a multiple of 100 ",
                                  "(whole GPUs). For ", f.value / 100, " whole GPUs and a share, write ",
                                  "tessera.dev/gpu-cores: ", f.value));
          }
          raw.gpu = Field{f.name, f.value / 100};
          raw.cores = Field{f.name, 100};
          continue;
        }
        break;
      case Unit::kGpuManager256MiB:
        f.value *= 256;  // at most 2^48: the value is capped at 2^40
        break;
      case Unit::kGpushareMemory:
        if (__builtin_mul_overflow(f.value, options.gpushare_memory_unit.value(), &f.value) ||
            f.value > (int64_t{1} << 40)) {
          return Invalid(c.name, StrCat(f.name, " is more than any GPU could hold; it counts ",
                                        options.gpushare_memory_unit.value() == 1024 ? "GiB" : "MiB"));
        }
        break;
      default:
        break;
    }
    switch (known[i].role) {
      case KnownResource::kGpu:
        raw.gpu = f;
        break;
      case KnownResource::kPriority:
        raw.priority = f;
        break;
      case KnownResource::kCores:
        if (!raw.cores) raw.cores = f;
        break;
      case KnownResource::kMemory:
        raw.memory = f;
        break;
      case KnownResource::kMemoryPercent:
        raw.memory_percent = f;
        break;
    }
  }
  if (raw.priority && !raw.gpu && !raw.cores && !raw.memory && !raw.memory_percent) {
    // The task priority alone asks for no GPU: there is nothing for it to rank.
    raw.family = ResourceFamily::kNone;
    raw.priority.reset();
    return raw;
  }
  switch (raw.family) {
    case ResourceFamily::kHami:
    case ResourceFamily::kVolcano:
      // HAMi (and Volcano's vGPU, built on it): gpucores 0 means "no core limit"; memory left out means the
      // whole memory of the GPU.
      if (raw.cores && raw.cores->value == 0) raw.cores.reset();
      raw.no_core_limit = !raw.cores && !(raw.gpu && raw.gpu->value == 0);
      if (!raw.memory && !raw.memory_percent && !(raw.gpu && raw.gpu->value == 0)) {
        raw.memory_percent = Field{"(whole memory, as HAMi gives)", 100};
      }
      break;
    case ResourceFamily::kGpushare:
      // ACK's multi-GPU share: aliyun.com/gpu-count GPUs (a pod label, or the resource), the memory split evenly
      // over them; the count alone is that many whole GPUs.
      if (!raw.gpu && gpushare_count) raw.gpu = Field{StrCat(kGpushareCount, " (label)"), *gpushare_count};
      if (raw.gpu && raw.memory && raw.gpu->value > 1) {
        if (raw.memory->value % raw.gpu->value != 0) {
          return Invalid(c.name, StrCat("aliyun.com/gpu-mem is ", raw.memory->value, " MiB in all over ",
                                        raw.gpu->value, " GPUs (", raw.gpu->name,
                                        "), not a whole number of MiB each; ask for a multiple of ",
                                        raw.gpu->value, " MiB, or write tessera.dev/gpu: ", raw.gpu->value,
                                        " and tessera.dev/gpu-memory: <MiB per GPU>"));
        }
        raw.memory->value /= raw.gpu->value;
      }
      break;
    case ResourceFamily::kGpuManager:
      if (raw.cores && raw.cores->value == 100) raw.memory.reset();  // whole GPUs come with their memory
      if (raw.cores && raw.cores->value == 0) {
        return Invalid(c.name, "tencent.com/vcuda-core is 0; ask for 1-99 for a share or 100 per whole GPU");
      }
      // gpu-manager limits utilization only when the pod says tencent.com/vcuda-core-limit (ParsePodRequest
      // reads it); without it a share may use idle compute.
      raw.no_core_limit = raw.cores && raw.cores->value < 100;
      break;
    default:
      break;
  }
  return raw;
}

// Percent of a GPU as a number of GPUs: 150 -> "1.5", 205 -> "2.05", 300 -> "3".
std::string GpusOf(int64_t percent) {
  std::string out = StrCat(percent / 100);
  if (percent % 100 == 0) return out;
  std::string frac = StrCat(100 + percent % 100).substr(1);
  if (frac.back() == '0') frac.pop_back();
  return StrCat(out, ".", frac);
}

// Expands an Ask into vGPUs, validating it.
absl::StatusOr<std::vector<VGpuDemand>> Expand(const std::string& container, const Ask& ask) {
  std::vector<VGpuDemand> out;
  if (ask.family == ResourceFamily::kNone) return out;
  MemorySpec memory;
  if (ask.memory && ask.memory_percent) {
    return Invalid(container, StrCat("gives both ", ask.memory->name, " and ", ask.memory_percent->name,
                                     "; give one: memory in MiB, or in percent of the GPU"));
  }
  if (ask.memory) {
    if (ask.memory->value < 1) {
      return Invalid(container,
                     StrCat(ask.memory->name, " is 0; ask for at least 1 MiB, or leave it out for ",
                            "memory in proportion to the compute share"));
    }
    memory = {MemorySpec::Kind::kMiB, ask.memory->value};
  }
  if (ask.memory_percent) {
    if (ask.memory_percent->value < 1 || ask.memory_percent->value > 100) {
      return Invalid(container, StrCat(ask.memory_percent->name, " is ", ask.memory_percent->value,
                                       "; it is a percentage of one GPU's memory, 1-100"));
    }
    memory = {MemorySpec::Kind::kPercent, ask.memory_percent->value};
  }
  const bool any_share = ask.cores || ask.memory || ask.memory_percent;
  int64_t count = 1;
  if (ask.gpu) {
    count = ask.gpu->value;
    if (count == 0) {
      if (any_share) {
        return Invalid(container, StrCat(ask.gpu->name, " is 0 but a GPU share is given; ask for ",
                                         ask.gpu->name, ": 1 or more, or remove the other GPU resources"));
      }
      return out;
    }
    if (count > kMaxGpusPerNode) {
      return Invalid(container, StrCat(ask.gpu->name, " is ", count, "; no node has more than ",
                                       kMaxGpusPerNode, " GPUs"));
    }
  }
  MilliGpu cores = kWholeGpu;
  if (ask.cores) {
    const int64_t c = ask.cores->value;
    if (c < 1) {
      return Invalid(container, StrCat(ask.cores->name, " is 0; ask for 1-100 percent of a GPU, or leave it ",
                                       "out to get compute in proportion to the memory asked for"));
    }
    if (c > 100) {
      if (ask.gpu) {
        return Invalid(container,
                       StrCat(ask.cores->name, " is ", c, " with ", ask.gpu->name, ": ", ask.gpu->value,
                              "; cores are per vGPU, 1-100. For ", ask.gpu->value, " whole GPUs write ",
                              kResourceCores, ": 100; for ", GpusOf(c), " GPUs remove ", ask.gpu->name,
                              " and keep ", kResourceCores, ": ", c));
      }
      if (c > 100LL * kMaxGpusPerNode) {
        return Invalid(container, StrCat(ask.cores->name, " is ", c, "; no node has more than ",
                                         kMaxGpusPerNode, " GPUs"));
      }
      // Gaia's "2.5 GPUs": whole GPUs linked by topology, plus one share of another GPU.
      for (int64_t i = 0; i < c / 100; ++i) out.push_back({kWholeGpu, memory});
      if (c % 100 != 0) out.push_back({ToMilliGpu(Percent(static_cast<int32_t>(c % 100))), memory});
      return out;
    }
    cores = ToMilliGpu(Percent(static_cast<int32_t>(c)));
  } else if (ask.memory || ask.memory_percent) {
    cores = MilliGpu(0);  // in proportion to the memory, on the GPU chosen
  }
  if (memory.kind == MemorySpec::Kind::kPercent && cores.value() == 0) {
    cores = ToMilliGpu(Percent(static_cast<int32_t>(memory.value)));
  }
  for (int64_t i = 0; i < count; ++i) out.push_back({cores, memory});
  return out;
}

std::vector<std::string> SplitList(std::string_view value) {
  std::vector<std::string> out;
  for (std::string_view part : StrSplit(value, ',')) {
    part = StripWhitespace(part);
    if (!part.empty()) out.emplace_back(part);
  }
  return out;
}

// A comma-separated annotation, under Tessera's key or its HAMi alias; `used` names the key found.
absl::StatusOr<std::vector<std::string>> ReadList(const PodSpec& pod, const char* key, const char* alias,
                                                  std::string* used) {
  *used = key;
  auto it = pod.annotations.find(key);
  if (it == pod.annotations.end() && alias != nullptr) it = pod.annotations.find(alias);
  if (it == pod.annotations.end()) return std::vector<std::string>();
  *used = it->first;
  std::vector<std::string> list = SplitList(it->second);
  if (list.empty()) {
    return absl::InvalidArgumentError(StrCat("annotation ", it->first, " is empty; list values separated by ",
                                             "commas (e.g. \"A100-SXM4-80GB,H100\") or remove it"));
  }
  return list;
}

// Whether `a` is within `k` edits of `b`, for "did you mean" on misspelt annotation keys. Only the diagonal
// band |i - j| <= k of the edit-distance table can hold a value <= k, so the cost is O(k * min(|a|, |b|)),
// and keys whose lengths differ by more than k cost nothing: 60 MB of long tessera.dev/ keys, each compared
// in full against every known key, used to cost 39 s of CPU.
bool WithinEdits(std::string_view a, std::string_view b, size_t k) {
  if (a.size() > b.size()) std::swap(a, b);
  if (b.size() - a.size() > k) return false;
  const size_t inf = k + 1;
  std::vector<size_t> row(b.size() + 1, inf);
  for (size_t j = 0; j <= std::min(b.size(), k); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    const size_t lo = i > k ? i - k : 1;
    const size_t hi = std::min(b.size(), i + k);
    size_t diag = row[lo - 1];  // the table's (i - 1, lo - 1)
    row[lo - 1] = lo - 1 == 0 && i <= k ? i : inf;
    size_t best = row[lo - 1];
    for (size_t j = lo; j <= hi; ++j) {
      const size_t up = row[j];
      const size_t v = std::min({up + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      row[j] = std::min(v, inf);
      diag = up;
      best = std::min(best, row[j]);
    }
    if (hi < b.size()) row[hi + 1] = inf;
    if (best > k) return false;
  }
  return row[b.size()] <= k;
}

absl::Status ReadAnnotations(const PodSpec& pod, PodRequest& req) {
  constexpr std::array<const char*, 7> kUserKeys = {
      kAnnotationModel,    kAnnotationModelExclude,  kAnnotationUuid,    kAnnotationUuidExclude,
      kAnnotationPriority, kAnnotationComputePolicy, kAnnotationNumaBind};
  for (const auto& [key, value] : pod.annotations) {
    if (!key.starts_with("tessera.dev/") || key == kAnnotationGpuAdded) continue;
    // A resource written as an annotation asks for nothing: say so instead of scheduling without it.
    for (const char* resource : {kResourceGpu, kResourceCores, kResourceMemory, kResourceMemoryPercent}) {
      if (key == resource) {
        return absl::InvalidArgumentError(StrCat(key, " is a resource, not an annotation: move \"", key, ": ",
                                                 value, "\" to a container's resources.limits"));
      }
    }
    if (std::find_if(kUserKeys.begin(), kUserKeys.end(), [&key = key](const char* k) { return key == k; }) !=
        kUserKeys.end()) {
      continue;
    }
    for (const char* known : kUserKeys) {
      if (WithinEdits(key, known, 2)) {
        return absl::InvalidArgumentError(StrCat("unknown annotation ", key, "; did you mean ", known, "?"));
      }
    }
  }
  std::string models_key, no_models_key, uuids_key, no_uuids_key;
  absl::StatusOr<std::vector<std::string>> models =
      ReadList(pod, kAnnotationModel, kHamiUseGpuType, &models_key);
  if (!models.ok()) return models.status();
  absl::StatusOr<std::vector<std::string>> no_models =
      ReadList(pod, kAnnotationModelExclude, kHamiNoUseGpuType, &no_models_key);
  if (!no_models.ok()) return no_models.status();
  absl::StatusOr<std::vector<std::string>> uuids =
      ReadList(pod, kAnnotationUuid, kHamiUseGpuUuid, &uuids_key);
  if (!uuids.ok()) return uuids.status();
  absl::StatusOr<std::vector<std::string>> no_uuids =
      ReadList(pod, kAnnotationUuidExclude, kHamiNoUseGpuUuid, &no_uuids_key);
  if (!no_uuids.ok()) return no_uuids.status();
  for (const std::string& m : *models) {
    if (std::find(no_models->begin(), no_models->end(), m) != no_models->end()) {
      return absl::InvalidArgumentError(StrCat("GPU model ", m, " is both in ", models_key, " and in ",
                                               no_models_key, "; keep it in one of them"));
    }
  }
  for (const std::string& u : *uuids) {
    if (std::find(no_uuids->begin(), no_uuids->end(), u) != no_uuids->end()) {
      return absl::InvalidArgumentError(
          StrCat("GPU ", u, " is both in ", uuids_key, " and in ", no_uuids_key, "; keep it in one of them"));
    }
  }
  req.model_include = *models;
  req.model_exclude = *no_models;
  req.model_include_substring = models_key == kHamiUseGpuType;
  req.model_exclude_substring = no_models_key == kHamiNoUseGpuType;
  for (const std::string& u : *uuids) req.uuid_include.emplace_back(u);
  for (const std::string& u : *no_uuids) req.uuid_exclude.emplace_back(u);

  if (auto it = pod.annotations.find(kAnnotationPriority); it != pod.annotations.end()) {
    if (std::optional<Priority> p = PriorityAnnotation(it->second)) {
      req.priority = *p;
    } else {
      return absl::InvalidArgumentError(
          StrCat(kAnnotationPriority, " is \"", it->second, "\"; write high or low"));
    }
  }
  if (auto it = pod.annotations.find(kAnnotationComputePolicy); it != pod.annotations.end()) {
    if (std::optional<ComputePolicy> p = ComputePolicyAnnotation(it->second)) {
      req.compute_policy = *p;
    } else {
      return absl::InvalidArgumentError(StrCat(kAnnotationComputePolicy, " is \"", it->second,
                                               "\"; write hard (the share holds) or elastic (idle compute ",
                                               "may be used up to a ceiling)"));
    }
  }
  auto numa = pod.annotations.find(kAnnotationNumaBind);
  if (numa == pod.annotations.end()) numa = pod.annotations.find(kHamiNumaBind);  // HAMi's name for it
  if (numa != pod.annotations.end()) {
    std::string v = AsciiLower(StripWhitespace(numa->second));
    if (v == "true") {
      req.numa_bind = true;
    } else if (v == "false") {
      req.numa_bind = false;
    } else {
      return absl::InvalidArgumentError(
          StrCat(numa->first, " is \"", numa->second, "\"; write true or false"));
    }
  }
  return absl::OkStatus();
}

// No node has 2^50 cores or bytes; larger values only invite overflow further on. A pod's total (below) has
// the same cap as each container's, so that no sum of containers under the cap can wrap into one that fits.
constexpr int64_t kMaxHostQuantity = int64_t{1} << 50;

// Sums a host resource (cpu in millicores, memory in MiB) the way the kubelet does: the larger of the app
// containers' sum and the largest init container. The sums saturate and a total above kMaxHostQuantity is
// refused: 17 containers each under the cap once summed past 2^64 and wrapped to one core, which fit
// anywhere.
absl::StatusOr<int64_t> HostResource(const PodSpec& pod, const char* name, bool memory) {
  auto read = [&](const ContainerSpec& c) -> absl::StatusOr<int64_t> {
    auto it = c.requests.find(name);
    if (it == c.requests.end()) {
      it = c.limits.find(name);
      if (it == c.limits.end()) return 0;
    }
    absl::StatusOr<K8sQuantity> q = ParseQuantity(it->second);
    if (!q.ok()) return Invalid(c.name, StrCat(name, ": ", q.status().message()));
    if (q->milli < 0) return Invalid(c.name, StrCat(name, " cannot be negative"));
    if (q->milli / 1000 > kMaxHostQuantity) {
      return Invalid(c.name, StrCat(name, " is ", it->second, ", more than any node has; check the value"));
    }
    if (!memory) return q->milli;  // millicores
    const int64_t bytes = q->Ceil();
    return (bytes + (int64_t{1} << 20) - 1) >> 20;
  };
  int64_t sum = 0;
  for (const ContainerSpec& c : pod.containers) {
    absl::StatusOr<int64_t> v = read(c);
    if (!v.ok()) return v.status();
    sum = SaturatingAdd(sum, *v);
  }
  // Sidecars run beside the app containers and beside every init container started after them.
  int64_t sidecars = 0;
  int64_t init_max = 0;
  for (const ContainerSpec& c : pod.init_containers) {
    absl::StatusOr<int64_t> v = read(c);
    if (!v.ok()) return v.status();
    if (c.sidecar) {
      sidecars = SaturatingAdd(sidecars, *v);
    } else {
      init_max = std::max(init_max, SaturatingAdd(sidecars, *v));
    }
  }
  sum = std::max(SaturatingAdd(sum, sidecars), init_max);
  const int64_t cap = memory ? kMaxHostQuantity >> 20 : kMaxHostQuantity * 1000;
  if (sum > cap) {
    return absl::InvalidArgumentError(StrCat("the pod's containers ask for more ", name,
                                             " in all than any node has (",
                                             memory ? "over 2^50 bytes" : "over 2^50 cores",
                                             "); check the containers' ", name, " requests and limits"));
  }
  return sum;
}

}  // namespace

std::optional<Priority> PriorityAnnotation(std::string_view value) {
  return PriorityFromString(AsciiLower(StripWhitespace(value)));
}

std::optional<ComputePolicy> ComputePolicyAnnotation(std::string_view value) {
  return ComputePolicyFromString(AsciiLower(StripWhitespace(value)));
}

absl::StatusOr<PodRequest> ParsePodRequest(const PodSpec& pod, const ParseOptions& options) {
  return ParsePodRequest(pod, options, GpushareCountLabel(pod));
}

absl::StatusOr<PodRequest> ParsePodRequest(const PodSpec& pod, const ParseOptions& options,
                                           const absl::StatusOr<std::optional<int64_t>>& gpushare_count) {
  PodRequest req;
  req.ns = Namespace(pod.ns.empty() ? "default" : pod.ns);
  req.name = pod.name;
  req.uid = PodUid(pod.uid);
  std::set<std::string> names;
  // The containers that hold GPUs: sidecars (init containers that run for the pod's life) and app containers.
  std::vector<const ContainerSpec*> holders;
  for (const ContainerSpec& c : pod.init_containers) {
    if (c.sidecar) {
      holders.push_back(&c);
      continue;
    }
    absl::StatusOr<Ask> ask = ReadAsk(c, options);
    if (!ask.ok()) return ask.status();
    if (ask->family != ResourceFamily::kNone) {
      return Invalid(c.name,
                     "is an init container asking for a GPU; Tessera shares GPUs with containers that run for "
                     "the pod's life: move the GPU resources to a container under spec.containers, or make "
                     "this one a sidecar (restartPolicy: Always)");
    }
  }
  for (const ContainerSpec& c : pod.containers) holders.push_back(&c);
  if (!gpushare_count.ok()) return gpushare_count.status();
  std::optional<Field> hami_priority;  // the first container's, which every other must agree with
  bool no_core_limit = false;
  std::set<std::string> gpu_added;
  if (auto it = pod.annotations.find(kAnnotationGpuAdded); it != pod.annotations.end()) {
    for (std::string& name : SplitList(it->second)) gpu_added.insert(std::move(name));
  }
  for (const ContainerSpec* holder : holders) {
    const ContainerSpec& c = *holder;
    if (!names.insert(c.name).second) {
      return absl::InvalidArgumentError(StrCat("two containers are named \"", c.name, "\""));
    }
    absl::StatusOr<Ask> ask = ReadAsk(c, options, *gpushare_count);
    if (!ask.ok()) return ask.status();
    if (ask->priority) {
      if (hami_priority && (hami_priority->value == 0) != (ask->priority->value == 0)) {
        return Invalid(c.name, StrCat(ask->priority->name, " is ", ask->priority->value, " here but ",
                                      hami_priority->value, " in another container; a pod has one priority: ",
                                      "give every container the same, or annotate the pod ", kAnnotationPriority));
      }
      hami_priority = ask->priority;
    }
    no_core_limit = no_core_limit ||
                    (ask->no_core_limit && !(ask->family == ResourceFamily::kGpuManager &&
                                             pod.annotations.contains(kGpuManagerCoreLimit)));
    std::optional<Field> added;
    if (gpu_added.contains(c.name) && ask->family == ResourceFamily::kTessera && ask->gpu &&
        (ask->cores || ask->memory || ask->memory_percent)) {
      added = ask->gpu;
      ask->gpu.reset();
    }
    absl::StatusOr<std::vector<VGpuDemand>> vgpus = Expand(c.name, *ask);
    if (!vgpus.ok()) return vgpus.status();
    if (added && added->value != static_cast<int64_t>(vgpus->size())) {
      return Invalid(c.name, StrCat(kResourceGpu, " is ", added->value, " but the rest of the request asks for ",
                                    vgpus->size(), " vGPUs; ", kAnnotationGpuAdded,
                                    " says the admission webhook added it: recreate the pod from its original "
                                    "spec (without ", kResourceGpu, " and without the annotation)"));
    }
    if (vgpus->empty()) continue;
    const bool shares = std::any_of(vgpus->begin(), vgpus->end(), [](const VGpuDemand& v) {
      const bool whole_memory = v.memory.kind == MemorySpec::Kind::kDefault ||
                                (v.memory.kind == MemorySpec::Kind::kPercent && v.memory.value == 100);
      return !v.exclusive() || !whole_memory;
    });
    if (c.privileged && shares) {
      return Invalid(
          c.name,
          "is privileged and asks for a GPU share; a privileged container sees every GPU on the node, "
          "so its share cannot be enforced. Drop securityContext.privileged, or ask for whole GPUs "
          "(tessera.dev/gpu: N with no cores or memory)");
    }
    req.containers.push_back({c.name, *std::move(vgpus)});
  }
  if (req.VGpuCount() > kMaxGpusPerNode) {
    return absl::InvalidArgumentError(StrCat("the pod's containers ask for ", req.VGpuCount(),
                                             " vGPUs in all; Tessera places at most ", kMaxGpusPerNode,
                                             " per pod (the most GPUs a node can have)"));
  }
  absl::Status annotations = ReadAnnotations(pod, req);
  if (!annotations.ok()) return annotations;
  // What HAMi's names say beyond the resources (the admission webhook writes them as annotations; a pod that
  // reaches the extender untranslated means the same).
  if (hami_priority) {
    const Priority p = hami_priority->value == 0 ? Priority::kHigh : Priority::kLow;
    if (pod.annotations.contains(kAnnotationPriority) && req.priority != p) {
      return absl::InvalidArgumentError(StrCat(hami_priority->name, " is ", hami_priority->value, " (",
                                               ToString(p), ") but the pod's ", kAnnotationPriority, " says ",
                                               ToString(req.priority), "; keep one of them"));
    }
    req.priority = p;
  }
  if (no_core_limit && options.hami_no_core_limit == NoCoreLimit::kElastic && !req.containers.empty() &&
      !pod.annotations.contains(kAnnotationComputePolicy)) {
    req.compute_policy = ComputePolicy::kElastic;
  }
  absl::StatusOr<int64_t> cpu = HostResource(pod, "cpu", /*memory=*/false);
  if (!cpu.ok()) return cpu.status();
  absl::StatusOr<int64_t> mem = HostResource(pod, "memory", /*memory=*/true);
  if (!mem.ok()) return mem.status();
  req.cpu = MilliCpu(*cpu);
  req.memory = MiB(*mem);
  return req;
}

absl::StatusOr<std::optional<int64_t>> ImpliedGpuCount(const ResourceList& limits, const ParseOptions& options) {
  ContainerSpec c;  // unnamed: errors leave the container to the caller
  c.limits = limits;
  absl::StatusOr<Ask> ask = ReadAsk(c, options);
  if (!ask.ok()) return ask.status();
  if (ask->family != ResourceFamily::kTessera || ask->gpu) return std::optional<int64_t>();
  absl::StatusOr<std::vector<VGpuDemand>> vgpus = Expand(c.name, *ask);
  if (!vgpus.ok()) return vgpus.status();
  if (vgpus->empty()) return std::optional<int64_t>();
  return std::optional<int64_t>(static_cast<int64_t>(vgpus->size()));
}

absl::StatusOr<std::optional<Translation>> TranslateToTessera(const ResourceList& resources,
                                                              const ParseOptions& options,
                                                              std::optional<int64_t> gpushare_count) {
  ContainerSpec c;  // unnamed: errors leave the container to the caller
  c.limits = resources;
  absl::StatusOr<Ask> ask = ReadAsk(c, options, gpushare_count);
  if (!ask.ok()) return ask.status();
  const std::vector<KnownResource> known = Known(options);
  auto gpu_resource = [&known](const std::string& name) {
    return std::any_of(known.begin(), known.end(), [&name](const KnownResource& k) {
      return name == k.name && k.family != ResourceFamily::kTessera;
    });
  };
  if (ask->family == ResourceFamily::kNone || ask->family == ResourceFamily::kTessera) {
    // A lone task priority asks for nothing, but no node advertises it: it goes, or the pod waits forever.
    if (ask->family == ResourceFamily::kNone && resources.contains(options.hami.priority)) {
      Translation t;
      for (const auto& [name, value] : resources) {
        if (name != options.hami.priority) t.resources[name] = value;
      }
      return std::optional<Translation>(std::move(t));
    }
    return std::optional<Translation>();
  }
  // Validate as Tessera would, so that a translated request never parses differently from the original.
  absl::StatusOr<std::vector<VGpuDemand>> vgpus = Expand(c.name, *ask);
  if (!vgpus.ok()) return vgpus.status();
  Translation t;
  for (const auto& [name, value] : resources) {
    if (!gpu_resource(name)) t.resources[name] = value;
  }
  if (ask->gpu) t.resources[kResourceGpu] = StrCat(ask->gpu->value);
  if (ask->cores) t.resources[kResourceCores] = StrCat(ask->cores->value);
  if (ask->memory) t.resources[kResourceMemory] = StrCat(ask->memory->value);
  if (ask->memory_percent) t.resources[kResourceMemoryPercent] = StrCat(ask->memory_percent->value);
  t.elastic = ask->no_core_limit && !vgpus->empty() && options.hami_no_core_limit == NoCoreLimit::kElastic;
  if (ask->priority) t.priority = ask->priority->value == 0 ? Priority::kHigh : Priority::kLow;
  t.family = ask->family;
  return std::optional<Translation>(std::move(t));
}

absl::StatusOr<std::optional<int64_t>> GpushareCountLabel(const PodSpec& pod) {
  const std::string* text = nullptr;
  if (auto it = pod.labels.find(kGpushareCount); it != pod.labels.end()) {
    text = &it->second;
  } else if (auto a = pod.annotations.find(kGpushareCount); a != pod.annotations.end()) {
    text = &a->second;
  }
  if (text == nullptr) return std::optional<int64_t>();
  const std::string_view v = StripWhitespace(*text);
  bool digits = !v.empty() && v.size() <= 3;
  for (char ch : v) digits = digits && ch >= '0' && ch <= '9';
  const int64_t n = digits ? std::stoll(std::string(v)) : 0;
  if (n < 1 || n > kMaxGpusPerNode) {
    return absl::InvalidArgumentError(StrCat(kGpushareCount, " is \"", *text, "\"; write the number of GPUs, 1 to ",
                                             kMaxGpusPerNode));
  }
  return std::optional<int64_t>(n);
}

std::vector<std::string> MigrationWarnings(const PodSpec& pod) {
  std::vector<std::string> out;
  for (const char* key : {"hami.io/node-scheduler-policy", "hami.io/gpu-scheduler-policy"}) {
    if (auto it = pod.annotations.find(key); it != pod.annotations.end()) {
      out.push_back(StrCat(key, "=", it->second, " is ignored: Tessera places every pod by the cluster's policy ",
                           "(tessera-scheduler --policy), which packs shares and spreads nothing by choice"));
    }
  }
  if (auto it = pod.annotations.find("nvidia.com/vgpu-mode"); it != pod.annotations.end()) {
    if (AsciiLower(StripWhitespace(it->second)) == "mig") {
      out.push_back("nvidia.com/vgpu-mode=mig is ignored: Tessera does not partition GPUs with MIG; the pod gets "
                    "a share enforced by Tessera's hook library, as in HAMi's hami-core mode");
    }
  }
  return out;
}

absl::Status ParseHamiNames(std::string_view text, HamiNames* names) {
  for (std::string_view part : StrSplit(text, ',')) {
    part = StripWhitespace(part);
    if (part.empty()) continue;
    const size_t eq = part.find('=');
    const std::string_view key = eq == std::string_view::npos ? part : part.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? "" : StripWhitespace(part.substr(eq + 1));
    std::string* slot = key == "gpu"                 ? &names->gpu
                        : key == "cores"             ? &names->cores
                        : key == "memory"            ? &names->memory
                        : key == "memory-percentage" ? &names->memory_percent
                        : key == "priority"          ? &names->priority
                                                     : nullptr;
    if (slot == nullptr) {
      return absl::InvalidArgumentError(StrCat("unknown HAMi resource \"", key,
                                               "\"; name gpu, cores, memory, memory-percentage or priority"));
    }
    if (value.empty() || value.find('/') == std::string_view::npos || value.starts_with("tessera.dev/")) {
      return absl::InvalidArgumentError(StrCat("HAMi's ", key, " resource \"", value,
                                               "\" is not an extended resource name of another system (domain/name)"));
    }
    *slot = std::string(value);
  }
  return absl::OkStatus();
}

MilliGpu PodRequest::TotalCores() const {
  // Summed wide and clamped: a request built by hand (a trace row, a test) may hold more vGPUs than a parsed
  // one.
  int64_t total = 0;
  for (const ContainerRequest& c : containers) {
    for (const VGpuDemand& v : c.vgpus) total = SaturatingAdd(total, v.cores.value());
  }
  return MilliGpu(static_cast<int32_t>(std::min<int64_t>(total, std::numeric_limits<int32_t>::max())));
}

int PodRequest::VGpuCount() const {
  int64_t n = 0;
  for (const ContainerRequest& c : containers) n = SaturatingAdd(n, static_cast<int64_t>(c.vgpus.size()));
  return static_cast<int>(std::min<int64_t>(n, std::numeric_limits<int>::max()));
}

int PodShapeTag(const PodRequest& request) {
  const int n = request.VGpuCount();
  if (n == 0) return kNoGpuShape;
  bool all_whole = true;
  for (const ContainerRequest& c : request.containers) {
    for (const VGpuDemand& v : c.vgpus) all_whole = all_whole && v.exclusive();
  }
  if (all_whole) return n;
  if (n == 1) return 0;
  return 1000 + n;
}

std::vector<std::string> GpuResourceNames(const ParseOptions& options) {
  std::vector<std::string> names;
  for (const KnownResource& k : Known(options)) names.push_back(k.name);
  return names;
}

std::string PodRequest::FullName() const {
  return StrCat(ns.value(), "/", name);
}

}  // namespace tessera::core

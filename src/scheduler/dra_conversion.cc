#include "scheduler/dra_conversion.h"

#include <algorithm>
#include <map>
#include <optional>

#include "core/gpu_mask.h"
#include "core/quantity.h"
#include "core/strings.h"
#include "formats/dra_placement.h"
#include "formats/inventory.h"
#include "k8s/api_status.h"

namespace tessera::scheduler {

namespace {

using nlohmann::json;

const k8s::ResourceType kTemplates{"resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate",
                                   true};
// deploy/dra/deviceclasses.yaml.
constexpr char kClass[] = "gpu.tessera.dev";
constexpr char kElasticClass[] = "gpu-elastic.tessera.dev";
// The longest Kubernetes object name (a DNS subdomain) and pod claim name (a DNS label).
constexpr size_t kMaxObjectName = 253;
constexpr size_t kMaxClaimName = 63;

const json& Field(const json& j, const char* key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

// 4096 MiB as "4Gi": kube-apiserver's canonical form (the largest binary suffix that keeps the number whole),
// so that the template read back compares equal to the one written.
std::string CanonicalMiB(int64_t mib) {
  static constexpr const char* kSuffixes[] = {"Mi", "Gi", "Ti", "Pi", "Ei"};
  size_t i = 0;
  while (i + 1 < std::size(kSuffixes) && mib % 1024 == 0) {
    mib /= 1024;
    ++i;
  }
  return StrCat(mib, kSuffixes[i]);
}

// FNV-1a (64 bits): a name suffix that is the same in every build and process.
std::string Fnv1aHex(std::string_view s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (int k = 0; k < 8; ++k) out += kHex[(h >> (60 - 4 * k)) & 15];
  return out;
}

// A value put in a CEL string literal: only characters that need no escaping, so that nothing the user wrote
// can end the literal.
absl::Status CheckCelLiteral(std::string_view what, std::string_view value) {
  for (char c : value) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '_' || c == '.' || c == ' ' || c == ':' || c == '/' || c == '(' || c == ')';
    if (!ok) {
      return absl::InvalidArgumentError(StrCat(
          what, " \"", value, "\" has a character a ResourceClaim's CEL selector cannot carry as written ",
          "(letters, digits, space and - _ . : / ( ) only): correct the annotation"));
    }
  }
  return absl::OkStatus();
}

std::string Attribute(std::string_view name) {
  return StrCat("device.attributes[\"", formats::kDraDriver, "\"].", name);
}

// The pod's GPU constraints as CEL selectors (dra_selector.h decides == and != on attributes itself; HAMi's
// substring match is CEL's contains(), which kube-scheduler's allocator decides).
absl::StatusOr<std::vector<std::string>> Selectors(const core::PodRequest& r) {
  std::vector<std::string> out;
  auto any_of = [&](const std::vector<std::string>& values, std::string_view attribute, bool substring,
                    bool exclude, std::string_view what) -> absl::Status {
    if (values.empty()) return absl::OkStatus();
    std::vector<std::string> terms;
    for (const std::string& v : values) {
      if (absl::Status st = CheckCelLiteral(what, v); !st.ok()) return st;
      if (substring) {
        std::string lower;
        for (char c : v) lower += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
        terms.push_back(
            StrCat(exclude ? "!" : "", Attribute(attribute), ".lowerAscii().contains(\"", lower, "\")"));
      } else {
        terms.push_back(StrCat(Attribute(attribute), exclude ? " != \"" : " == \"", v, "\""));
      }
    }
    out.push_back(terms.size() == 1 ? terms[0] : StrJoin(terms, exclude ? " && " : " || "));
    return absl::OkStatus();
  };
  if (absl::Status st = any_of(r.model_include, "model", r.model_include_substring, false, "GPU model");
      !st.ok())
    return st;
  if (absl::Status st = any_of(r.model_exclude, "model", r.model_exclude_substring, true, "GPU model");
      !st.ok())
    return st;
  std::vector<std::string> uuids;
  for (const core::GpuUuid& u : r.uuid_include) uuids.push_back(u.value());
  if (absl::Status st = any_of(uuids, "uuid", false, false, "GPU UUID"); !st.ok()) return st;
  uuids.clear();
  for (const core::GpuUuid& u : r.uuid_exclude) uuids.push_back(u.value());
  if (absl::Status st = any_of(uuids, "uuid", false, true, "GPU UUID"); !st.ok()) return st;
  return out;
}

// One vGPU's share as the claim states it: percent of compute and MiB.
struct Share {
  int64_t cores = 0, memory = 0;
};

absl::StatusOr<Share> ShareOf(const core::VGpuDemand& d, const std::string& container,
                              const DraOffer& offer) {
  int64_t milli = d.cores.value();
  std::optional<int64_t> memory;
  if (d.memory.kind == core::MemorySpec::Kind::kMiB) memory = d.memory.value;
  // The GPU's memory, for what is in proportion to it: known only when every DRA GPU has the same.
  auto gpu_memory = [&](std::string_view what) -> absl::StatusOr<int64_t> {
    if (offer.memory_mib.size() == 1) return *offer.memory_mib.begin();
    std::string sizes = offer.memory_mib.empty()
                            ? std::string("none is published yet")
                            : StrCat("they have ", StrJoin(offer.memory_mib, ", "), " MiB");
    return absl::FailedPreconditionError(
        StrCat("container \"", container, "\" asks for ", what,
               ", which a ResourceClaim can state only when every DRA GPU has the same memory (", sizes,
               "): give both the compute share and the memory in MiB (tessera.dev/gpu-cores and "
               "tessera.dev/gpu-memory, or your system's names for them), or ask for whole GPUs"));
  };
  if (d.memory.kind == core::MemorySpec::Kind::kPercent) {
    absl::StatusOr<int64_t> total = gpu_memory(StrCat(d.memory.value, "% of a GPU's memory"));
    if (!total.ok()) return total.status();
    memory = *total * d.memory.value / 100;  // rounded down, as the request parser's proportions
  }
  if (milli == 0 && !memory) {
    return absl::InvalidArgumentError(StrCat(
        "container \"", container, "\" asks for a GPU share with neither compute nor memory: give one"));
  }
  if (milli == 0) {
    // Compute in proportion to the memory asked (gpushare, HAMi without cores): rounded up, as the parser
    // does.
    absl::StatusOr<int64_t> total = gpu_memory("compute in proportion to its memory");
    if (!total.ok()) return total.status();
    milli = std::min<int64_t>(1000, (*memory * 1000 + *total - 1) / *total);
  } else if (!memory) {
    absl::StatusOr<int64_t> total =
        gpu_memory(StrCat(milli / 10, milli % 10 != 0 ? StrCat(".", milli % 10) : std::string(),
                          "% of a GPU with its memory in proportion (memory left out)"));
    if (!total.ok()) return total.status();
    memory = *total * milli / 1000;
  }
  // Tessera's devices count compute in whole percents (docs/dra.md): a share in thousandths rounds up.
  Share s;
  s.cores = std::clamp<int64_t>((milli + 9) / 10, 1, 100);
  s.memory = std::max<int64_t>(1, *memory);
  return s;
}

}  // namespace

absl::StatusOr<ExtendedToDra> ParseExtendedToDra(std::string_view text) {
  if (text == "auto") return ExtendedToDra::kAuto;
  if (text == "always") return ExtendedToDra::kAlways;
  if (text == "never") return ExtendedToDra::kNever;
  return absl::InvalidArgumentError(
      StrCat("--extended-resources-to-dra is \"", text, "\"; write auto, always or never (docs/dra.md)"));
}

const char* ToString(ExtendedToDra mode) {
  switch (mode) {
    case ExtendedToDra::kAuto:
      return "auto";
    case ExtendedToDra::kAlways:
      return "always";
    case ExtendedToDra::kNever:
      return "never";
  }
  return "?";
}

DraOffer OfferFromSlices(const std::vector<std::shared_ptr<const json>>& slices) {
  DraOffer offer;
  for (const std::shared_ptr<const json>& slice : slices) {
    if (!slice) continue;
    const json& spec = Field(*slice, "spec");
    if (!Field(spec, "driver").is_string() || Field(spec, "driver").get<std::string>() != formats::kDraDriver)
      continue;
    const json& devices = Field(spec, "devices");
    if (!devices.is_array()) continue;
    for (const json& d : devices) {
      offer.driver = true;
      const json& memory = Field(Field(Field(d, "capacity"), "memory"), "value");
      if (!memory.is_string()) continue;
      absl::StatusOr<core::K8sQuantity> q = core::ParseQuantity(memory.get<std::string>());
      if (q.ok() && q->milli > 0) offer.memory_mib.insert(q->Ceil() / (1024 * 1024));
    }
  }
  return offer;
}

bool NodeOffersDevicePlugin(const json& node) {
  const json& gpus = Field(Field(Field(node, "status"), "allocatable"), core::kResourceGpu);
  if (!gpus.is_string()) return false;
  absl::StatusOr<core::K8sQuantity> q = core::ParseQuantity(gpus.get<std::string>());
  return q.ok() && q->milli > 0;
}

namespace {
std::string NodeName(const json& node) {
  const json& name = Field(Field(node, "metadata"), "name");
  return name.is_string() ? name.get<std::string>() : "";
}

const json& Annotations(const json& node) {
  return Field(Field(node, "metadata"), "annotations");
}

// Whether an inventory annotation's text names a GPU its agent did not give to DRA.
bool ServesDevicePlugin(const json& inventory) {
  if (!inventory.is_string()) return false;
  absl::StatusOr<formats::GpuInventory> inv = formats::ParseGpuInventory(inventory.get<std::string>());
  return inv.ok() && std::any_of(inv->gpus.begin(), inv->gpus.end(), [](const formats::InventoryGpu& g) {
           return g.health_reason != formats::kDraHealthReason;
         });
}

std::optional<std::chrono::system_clock::time_point> HeartbeatOf(const json& node) {
  const json& heartbeat = Field(Annotations(node), formats::kHeartbeatAnnotation);
  if (!heartbeat.is_string()) return std::nullopt;
  absl::StatusOr<std::chrono::system_clock::time_point> t =
      formats::ParseHeartbeat(heartbeat.get<std::string>());
  if (!t.ok()) return std::nullopt;
  return *t;
}
}  // namespace

DevicePluginIntent NodeDevicePluginIntent(const json& node) {
  return {.gpus = ServesDevicePlugin(Field(Annotations(node), formats::kGpuInventoryAnnotation)),
          .heartbeat = HeartbeatOf(node)};
}

bool ShouldConvert(ExtendedToDra mode, const DraOffer& offer) {
  switch (mode) {
    case ExtendedToDra::kAlways:
      return true;
    case ExtendedToDra::kNever:
      return false;
    case ExtendedToDra::kAuto:
      return offer.driver && !offer.device_plugin;
  }
  return false;
}

void DraOfferTracker::OnNode(const json& node) {
  const std::string name = NodeName(node);
  const bool offers = NodeOffersDevicePlugin(node);
  const json& inventory = Field(Annotations(node), formats::kGpuInventoryAnnotation);
  const size_t hash = inventory.is_string() ? std::hash<std::string>{}(inventory.get<std::string>()) : 0;
  std::optional<Intent> known;
  {
    MutexLock lock(&mu_);
    if (auto it = intents_.find(name); it != intents_.end()) known = it->second;
  }
  // The inventory is parsed again only when it changed (the heartbeat changes every 10 s, the inventory
  // seldom); outside the lock, as admission reads the offer meanwhile.
  const Intent intent{
      .inventory_hash = hash,
      .gpus = known && known->inventory_hash == hash ? known->gpus : ServesDevicePlugin(inventory),
      .heartbeat = HeartbeatOf(node)};
  MutexLock lock(&mu_);
  if (offers) {
    device_plugin_nodes_.insert(name);
  } else {
    device_plugin_nodes_.erase(name);
  }
  if (inventory.is_string()) {
    intents_[name] = intent;
  } else {
    intents_.erase(name);
  }
}

void DraOfferTracker::OnNodeDeleted(const json& node) {
  MutexLock lock(&mu_);
  device_plugin_nodes_.erase(NodeName(node));
  intents_.erase(NodeName(node));
}

DraOffer DraOfferTracker::Offer() const {
  const auto now = clock_.Steady();
  DraOffer offer;
  bool fresh = false;
  {
    MutexLock lock(&mu_);
    if (from_slices_ && now - from_slices_->first < std::chrono::seconds(1)) {
      offer = from_slices_->second;
      fresh = true;
    }
  }
  // Outside the lock (the slices of a large cluster take a while): the callers that find it stale walk them.
  if (!fresh) offer = OfferFromSlices(slices_ ? slices_() : std::vector<std::shared_ptr<const json>>{});
  MutexLock lock(&mu_);
  if (!fresh) from_slices_.emplace(now, offer);
  offer.device_plugin = !device_plugin_nodes_.empty();
  if (!offer.device_plugin) {
    // None offers it this moment: a node whose tessera-node is alive and serves device-plugin GPUs is
    // restarting it (or its kubelet), not giving its GPUs to DRA.
    // (A loop, not any_of: the thread-safety analysis does not see mu_ held in a lambda.)
    const auto wall = clock_.Now();
    for (const auto& [name, i] : intents_) {
      if (i.gpus && i.heartbeat && wall - *i.heartbeat <= heartbeat_timeout_) {
        offer.device_plugin = true;
        break;
      }
    }
  }
  return offer;
}

json TemplateObject(const ClaimTemplate& t, std::string_view ns) {
  return {
      {"apiVersion", "resource.k8s.io/v1"},
      {"kind", "ResourceClaimTemplate"},
      {"metadata",
       {{"name", t.name}, {"namespace", ns}, {"labels", {{kTemplateManagedByLabel, kTemplateManagedBy}}}}},
      {"spec", {{"spec", t.spec}}}};
}

absl::StatusOr<Conversion> ConvertToClaims(const core::PodRequest& request, const core::PodSpec& spec,
                                           const DraOffer& offer, const std::set<std::string>& pod_claims) {
  Conversion out;
  absl::StatusOr<std::vector<std::string>> selectors = Selectors(request);
  if (!selectors.ok()) return selectors.status();
  const bool elastic = request.compute_policy == core::ComputePolicy::kElastic;
  const bool high = request.priority == core::Priority::kHigh;
  if (request.numa_bind) {
    out.warnings.push_back(
        "tessera.dev/numa-bind is not carried to the ResourceClaim: on the DRA path each container gets the "
        "CPUs "
        "of its GPUs' NUMA node when the node states them (docs/dra.md)");
  }
  std::set<std::string> names = pod_claims;
  for (const core::ContainerRequest& c : request.containers) {
    if (c.vgpus.empty()) continue;
    if (c.vgpus.size() > static_cast<size_t>(core::kMaxGpusPerNode)) {
      return absl::InvalidArgumentError(StrCat("container \"", c.name, "\" asks for ", c.vgpus.size(),
                                               " GPUs; a claim's GPUs are on one node, at most ",
                                               core::kMaxGpusPerNode));
    }
    ContainerClaim cc;
    cc.container = c.name;
    bool found = false;
    for (size_t i = 0; i < spec.containers.size() && !found; ++i) {
      if (spec.containers[i].name != c.name) continue;
      cc.index = i;
      found = true;
    }
    for (size_t i = 0; i < spec.init_containers.size() && !found; ++i) {
      if (spec.init_containers[i].name != c.name) continue;
      cc.index = i;
      cc.init = true;
      found = true;
    }
    if (!found)
      return absl::InternalError(StrCat("container \"", c.name, "\" of the request is not in the pod"));
    // The vGPUs by shape, in order: N identical ones are one request of count N ("2.5 GPUs": 2 whole + 1
    // share).
    std::vector<std::pair<core::VGpuDemand, int64_t>> shapes;
    for (const core::VGpuDemand& d : c.vgpus) {
      if (!shapes.empty() && shapes.back().first == d) {
        ++shapes.back().second;
      } else {
        shapes.push_back({d, 1});
      }
    }
    // Elastic is a share's policy: whole GPUs alone (HAMi's nvidia.com/gpu without gpucores) take the plain
    // class.
    const bool container_elastic =
        elastic &&
        std::any_of(c.vgpus.begin(), c.vgpus.end(), [](const core::VGpuDemand& d) { return !d.exclusive(); });
    json requests = json::array();
    std::vector<std::string> parts;
    for (size_t k = 0; k < shapes.size(); ++k) {
      const auto& [d, count] = shapes[k];
      json exactly = {{"deviceClassName", container_elastic ? kElasticClass : kClass},
                      {"allocationMode", "ExactCount"},
                      {"count", count}};
      std::string part = d.exclusive() || count > 1 ? StrCat("x", count) : "";
      if (!d.exclusive()) {
        absl::StatusOr<Share> s = ShareOf(d, c.name, offer);
        if (!s.ok()) return s.status();
        exactly["capacity"] = {
            {"requests", {{"cores", StrCat(s->cores)}, {"memory", CanonicalMiB(s->memory)}}}};
        part = StrCat(part.empty() ? "" : StrCat(part, "-"), "c", s->cores, "-m", s->memory);
      }
      if (!selectors->empty()) {
        json list = json::array();
        for (const std::string& e : *selectors) list.push_back({{"cel", {{"expression", e}}}});
        exactly["selectors"] = std::move(list);
      }
      requests.push_back({{"name", shapes.size() == 1 ? std::string("gpu") : StrCat("gpu-", k)},
                          {"exactly", std::move(exactly)}});
      parts.push_back(std::move(part));
    }
    ClaimTemplate t;
    t.spec = {{"devices", {{"requests", std::move(requests)}}}};
    if (high) {
      t.spec["devices"]["config"] = json::array(
          {{{"opaque", {{"driver", formats::kDraDriver}, {"parameters", {{"priority", "high"}}}}}}});
    }
    t.name = StrCat(container_elastic ? "tessera-gpu-elastic-" : "tessera-gpu-", StrJoin(parts, "-"));
    // What the shape's name does not say (selectors, priority) is told apart by a hash of the spec.
    if (!selectors->empty() || high) t.name += StrCat("-", Fnv1aHex(t.spec.dump()));
    if (t.name.size() > kMaxObjectName) t.name = StrCat("tessera-gpu-", Fnv1aHex(t.spec.dump()));
    cc.template_name = t.name;
    bool known = false;
    for (const ClaimTemplate& have : out.templates) known = known || have.name == t.name;
    if (!known) out.templates.push_back(std::move(t));
    // The pod's name for the claim: gpu-<container> (gpu-<index> when that is too long for a DNS label).
    cc.claim = StrCat("gpu-", c.name);
    if (cc.claim.size() > kMaxClaimName) cc.claim = StrCat(cc.init ? "gpu-init-" : "gpu-", cc.index);
    if (!names.insert(cc.claim).second) {
      return absl::InvalidArgumentError(StrCat("the pod already names a resource claim \"", cc.claim,
                                               "\", which tessera-scheduler would give ", "container \"",
                                               c.name, "\" for its GPUs: rename that claim"));
    }
    out.claims.push_back(std::move(cc));
  }
  return out;
}

absl::Status ClaimTemplateMaker::Ensure(std::string_view ns, const ClaimTemplate& t) {
  const std::string what = StrCat("ResourceClaimTemplate ", ns, "/", t.name);
  absl::StatusOr<json> created = api_.Create(kTemplates, ns, TemplateObject(t, ns));
  if (created.ok()) return absl::OkStatus();
  if (!absl::IsAlreadyExists(created.status())) {
    return absl::UnavailableError(StrCat(
        "could not create ", what, " (", Message(created.status()),
        "): check that tessera-scheduler may create resourceclaimtemplates ",
        "(deploy/scheduler/10-rbac.yaml) and that the API server answers, then ", "create the pod again"));
  }
  absl::StatusOr<json> got = api_.Get(kTemplates, ns, t.name);
  if (!got.ok()) {
    return absl::UnavailableError(
        StrCat("could not read ", what, " (", Message(got.status()), "); create the pod again"));
  }
  const json& labels = Field(Field(*got, "metadata"), "labels");
  const json& by = Field(labels, kTemplateManagedByLabel);
  if (!by.is_string() || by.get<std::string>() != kTemplateManagedBy) {
    return absl::FailedPreconditionError(StrCat(
        what, " exists but was not made by tessera-scheduler (no label ", kTemplateManagedByLabel, "=",
        kTemplateManagedBy, "), so it is not used for this pod's GPUs: delete or rename it, then create ",
        "the pod again"));
  }
  if (Field(Field(*got, "spec"), "spec") != t.spec) {
    return absl::FailedPreconditionError(StrCat(
        what, " exists but asks for something else than this pod (it was changed), so it is not used: ",
        "delete it (tessera-scheduler makes it again), then create the pod again"));
  }
  return absl::OkStatus();
}

}  // namespace tessera::scheduler

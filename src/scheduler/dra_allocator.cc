#include "scheduler/dra_allocator.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>

#include "common/log.h"
#include "core/cluster.h"
#include "core/gpu_mask.h"
#include "core/placement/placer.h"
#include "core/placement/policy.h"
#include "core/quantity.h"
#include "core/random.h"
#include "core/strings.h"
#include "formats/dra_placement.h"
#include "formats/inventory.h"

namespace tessera::scheduler::dra {

namespace {

constexpr int64_t kMiB = 1024 * 1024;
// Tessera's devices state compute as a percent (docs/dra.md, "What the node publishes").
constexpr int64_t kCoresCapacity = 100;

// A quantity in whole units (rounded up), or nullopt when it is not one.
std::optional<int64_t> Units(const Json& q) {
  if (!q.is_string()) return std::nullopt;
  absl::StatusOr<core::K8sQuantity> parsed = core::ParseQuantity(q.get<std::string>());
  if (!parsed.ok() || parsed->milli < 0) return std::nullopt;
  return parsed->Ceil();
}

// 32768Mi as "32Gi", as the API server writes quantities back (what the node agent publishes, too).
std::string CanonicalBytes(int64_t bytes) {
  static constexpr const char* kSuffixes[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
  if (bytes == 0) return "0";
  size_t i = 0;
  while (i + 1 < std::size(kSuffixes) && bytes % 1024 == 0) {
    bytes /= 1024;
    ++i;
  }
  return StrCat(bytes, kSuffixes[i]);
}

std::optional<AttributeValue> ParseAttribute(const Json& a) {
  if (!a.is_object() || a.size() != 1) return std::nullopt;
  const std::string& kind = a.begin().key();
  const Json& v = a.begin().value();
  if (kind == "int" && v.is_number_integer()) return AttributeValue::Int(v.get<int64_t>());
  if (kind == "bool" && v.is_boolean()) return AttributeValue::Bool(v.get<bool>());
  if (kind == "string" && v.is_string()) return AttributeValue::String(v.get<std::string>());
  if (kind == "version" && v.is_string())
    return AttributeValue::String(v.get<std::string>(), AttributeValue::Kind::kVersion);
  return std::nullopt;
}

absl::StatusOr<Capacity> ParseCapacity(const Json& c) {
  Capacity out;
  std::optional<int64_t> value = Units(Field(c, "value"));
  if (!value) return absl::InvalidArgumentError("a capacity without a readable value");
  out.value = *value;
  const Json& policy = Field(c, "requestPolicy");
  if (policy.is_object()) {
    if (policy.contains("default")) out.default_value = Units(policy["default"]);
    const Json& range = Field(policy, "validRange");
    if (range.is_object()) {
      out.min = Units(Field(range, "min")).value_or(0);
      out.max = Units(Field(range, "max")).value_or(0);
      out.step = Units(Field(range, "step")).value_or(0);
    }
    const Json& values = Field(policy, "validValues");
    if (values.is_array()) {
      for (const Json& v : values) {
        if (std::optional<int64_t> u = Units(v)) out.valid_values.push_back(*u);
      }
      std::sort(out.valid_values.begin(), out.valid_values.end());
    }
  }
  return out;
}

// The qualified name of an attribute as a slice states it: unqualified names are in the driver's domain.
std::string Qualified(const std::string& name) {
  return name.find('/') == std::string::npos ? StrCat(formats::kDraDriver, "/", name) : name;
}

bool Tolerates(const Json& tolerations, const Json& taint) {
  const std::string key = Str(taint, "key"), value = Str(taint, "value"), effect = Str(taint, "effect");
  if (!tolerations.is_array()) return false;
  for (const Json& t : tolerations) {
    const std::string op = Str(t, "operator").empty() ? "Equal" : Str(t, "operator");
    const std::string tkey = Str(t, "key"), teffect = Str(t, "effect");
    if (!teffect.empty() && teffect != effect) continue;
    if (tkey.empty() && op == "Exists") return true;
    if (tkey != key) continue;
    if (op == "Exists" || (op == "Equal" && Str(t, "value") == value)) return true;
  }
  return false;
}

// A node selector requirement (nodeAffinity's matchExpressions or matchFields) against a value.
bool Requirement(const Json& r, const std::optional<std::string>& value) {
  const std::string op = Str(r, "operator");
  const Json& values = Field(r, "values");
  auto in = [&] {
    if (!value || !values.is_array()) return false;
    for (const Json& v : values) {
      if (v.is_string() && v.get<std::string>() == *value) return true;
    }
    return false;
  };
  if (op == "In") return in();
  if (op == "NotIn") return !in();
  if (op == "Exists") return value.has_value();
  if (op == "DoesNotExist") return !value.has_value();
  if ((op == "Gt" || op == "Lt") && value && values.is_array() && values.size() == 1 &&
      values[0].is_string()) {
    int64_t a = 0, b = 0;
    if (!ParseInt(*value, &a) || !ParseInt(values[0].get<std::string>(), &b)) return false;
    return op == "Gt" ? a > b : a < b;
  }
  return false;
}

// Can the pod run on the node as far as kube-scheduler's node filters go (name, selector, affinity, taints)?
bool PodFitsNode(const Json& pod, const NodeView& node) {
  const Json& spec = Field(pod, "spec");
  if (node.unschedulable &&
      !Tolerates(Field(spec, "tolerations"),
                 Json{{"key", "node.kubernetes.io/unschedulable"}, {"effect", "NoSchedule"}})) {
    return false;
  }
  const Json& selector = Field(spec, "nodeSelector");
  if (selector.is_object()) {
    for (const auto& [k, v] : selector.items()) {
      auto it = node.labels.find(k);
      if (it == node.labels.end() || !v.is_string() || it->second != v.get<std::string>()) return false;
    }
  }
  const Json& terms = Path(spec, {"affinity", "nodeAffinity",
                                  "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms"});
  if (terms.is_array() && !terms.empty()) {
    bool any = false;
    for (const Json& term : terms) {
      bool all = true;
      for (const Json& r :
           Field(term, "matchExpressions").is_array() ? Field(term, "matchExpressions") : Json::array()) {
        auto it = node.labels.find(Str(r, "key"));
        all = all && Requirement(r, it == node.labels.end() ? std::nullopt : std::optional(it->second));
      }
      for (const Json& r :
           Field(term, "matchFields").is_array() ? Field(term, "matchFields") : Json::array()) {
        all = all && Str(r, "key") == "metadata.name" && Requirement(r, node.name);
      }
      any = any || all;
    }
    if (!any) return false;
  }
  for (const Json& taint : node.taints) {
    const std::string effect = Str(taint, "effect");
    if ((effect == "NoSchedule" || effect == "NoExecute") && !Tolerates(Field(spec, "tolerations"), taint)) {
      return false;
    }
  }
  return true;
}

uint64_t Fnv1a(uint64_t h, std::string_view text) {
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ULL;
  return h;
}

uint64_t Mix(uint64_t seed, std::string_view name) {
  uint64_t h = 1469598103934665603ULL ^ seed;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  core::Rng r(h);
  return r.Next();
}

// One alternative of a request, as a claim states it.
struct Alternative {
  std::string name;  // "gpu" or "gpu/small" (the result's `request`)
  std::string device_class;
  int64_t count = 1;
  std::optional<int64_t> cores, memory;
  std::vector<Selector> selectors;
};
struct RequestSpec {
  std::string name;
  std::vector<Alternative> alternatives;
  std::optional<std::string> match_attribute;  // a matchAttribute constraint over this request
};

// The claim's spec as Tessera places it, or why Tessera leaves it to kube-scheduler.
absl::StatusOr<std::vector<RequestSpec>> ParseClaim(const Json& claim, const std::set<std::string>& classes,
                                                    const std::map<std::string, DeviceClass>& known) {
  const Json& devices = Path(claim, {"spec", "devices"});
  const Json& requests = Field(devices, "requests");
  if (!requests.is_array() || requests.empty())
    return absl::FailedPreconditionError("the claim asks for no device");
  std::vector<RequestSpec> out;
  auto alternative = [&](const Json& e, std::string name) -> absl::StatusOr<Alternative> {
    Alternative a;
    a.name = std::move(name);
    a.device_class = Str(e, "deviceClassName");
    if (!classes.contains(a.device_class)) {
      return absl::FailedPreconditionError(
          StrCat("request ", a.name, " asks for class ", a.device_class, ", not one Tessera places"));
    }
    auto cls = known.find(a.device_class);
    if (cls == known.end())
      return absl::UnavailableError(StrCat("DeviceClass ", a.device_class, " not seen yet"));
    if (!cls->second.undecided.empty()) return absl::FailedPreconditionError(cls->second.undecided);
    const std::string mode = Str(e, "allocationMode");
    if (!mode.empty() && mode != "ExactCount") {
      return absl::FailedPreconditionError(StrCat("request ", a.name, " uses allocationMode ", mode));
    }
    if (Field(e, "adminAccess").is_boolean() && Field(e, "adminAccess").get<bool>()) {
      return absl::FailedPreconditionError(StrCat("request ", a.name, " asks for admin access"));
    }
    if (Field(e, "tolerations").is_array() && !Field(e, "tolerations").empty()) {
      return absl::FailedPreconditionError(StrCat("request ", a.name, " tolerates device taints"));
    }
    if (Field(e, "count").is_number_integer()) a.count = Field(e, "count").get<int64_t>();
    if (a.count < 1 || a.count > core::kMaxGpusPerNode) {
      return absl::FailedPreconditionError(StrCat("request ", a.name, " asks for ", a.count, " devices"));
    }
    const Json& asked = Path(e, {"capacity", "requests"});
    if (asked.is_object()) {
      for (const auto& [k, v] : asked.items()) {
        std::optional<int64_t> u = Units(v);
        if (!u)
          return absl::FailedPreconditionError(StrCat("request ", a.name, ": capacity ", k, " unreadable"));
        if (k == "cores") {
          a.cores = u;
        } else if (k == "memory") {
          a.memory = u;
        } else {
          return absl::FailedPreconditionError(StrCat("request ", a.name, " asks for capacity ", k));
        }
      }
    }
    if (Field(e, "selectors").is_array()) {
      for (const Json& s : Field(e, "selectors")) {
        absl::StatusOr<Selector> compiled = Selector::Compile(Str(Field(s, "cel"), "expression"));
        if (!compiled.ok()) {
          return absl::FailedPreconditionError(
              StrCat("request ", a.name,
                     "'s selector is outside what Tessera evaluates: ", compiled.status().message()));
        }
        a.selectors.push_back(*std::move(compiled));
      }
    }
    return a;
  };
  for (const Json& r : requests) {
    RequestSpec spec;
    spec.name = Str(r, "name");
    if (Field(r, "exactly").is_object()) {
      absl::StatusOr<Alternative> a = alternative(r["exactly"], spec.name);
      if (!a.ok()) return a.status();
      spec.alternatives.push_back(*std::move(a));
    } else if (Field(r, "firstAvailable").is_array()) {
      for (const Json& sub : r["firstAvailable"]) {
        absl::StatusOr<Alternative> a = alternative(sub, StrCat(spec.name, "/", Str(sub, "name")));
        if (!a.ok()) return a.status();
        spec.alternatives.push_back(*std::move(a));
      }
    }
    if (spec.alternatives.empty())
      return absl::FailedPreconditionError(StrCat("request ", spec.name, " is empty"));
    out.push_back(std::move(spec));
  }
  const Json& constraints = Field(devices, "constraints");
  if (constraints.is_array()) {
    for (const Json& c : constraints) {
      const std::string attribute = Str(c, "matchAttribute");
      if (attribute.empty()) return absl::FailedPreconditionError("a constraint other than matchAttribute");
      std::vector<std::string> names;
      if (Field(c, "requests").is_array()) {
        for (const Json& n : c["requests"]) names.push_back(n.is_string() ? n.get<std::string>() : "");
      }
      if (names.empty()) {
        for (const RequestSpec& r : out) names.push_back(r.name);
      }
      // One request per constraint: its devices share the value. A constraint across requests is left to
      // kube-scheduler, which searches the combinations.
      if (names.size() != 1)
        return absl::FailedPreconditionError("a matchAttribute constraint across requests");
      bool found = false;
      for (RequestSpec& r : out) {
        if (r.name != names[0] && !names[0].starts_with(r.name + "/")) continue;
        if (r.match_attribute && *r.match_attribute != attribute) {
          return absl::FailedPreconditionError("two matchAttribute constraints on one request");
        }
        r.match_attribute = attribute;
        found = true;
      }
      if (!found) return absl::FailedPreconditionError(StrCat("a constraint names request ", names[0]));
    }
  }
  return out;
}

// What each allocated claim holds of a pool's devices.
struct Held {
  std::string device;
  int64_t cores = 0, memory = 0;  // percent, bytes
};

}  // namespace

const Json& Field(const Json& j, const char* key) {
  static const Json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

std::string Str(const Json& j, const char* key) {
  const Json& v = Field(j, key);
  return v.is_string() ? v.get<std::string>() : "";
}

const Json& Path(const Json& j, std::initializer_list<const char*> keys) {
  const Json* at = &j;
  for (const char* k : keys) at = &Field(*at, k);
  return *at;
}

std::optional<int64_t> Capacity::Consumed(std::optional<int64_t> asked) const {
  if (!asked) return default_value ? *default_value : value;
  int64_t v = *asked;
  if (!valid_values.empty()) {
    auto it = std::lower_bound(valid_values.begin(), valid_values.end(), v);
    if (it == valid_values.end()) return std::nullopt;
    v = *it;
  } else if (min > 0 || step > 0 || max > 0) {
    v = std::max(v, min);
    if (step > 0 && (v - min) % step != 0) v = min + ((v - min) / step + 1) * step;
    if (max > 0 && v > max) return std::nullopt;
  }
  return v > value ? std::nullopt : std::optional(v);
}

absl::StatusOr<Pool> ParseSlice(const Json& slice) {
  const Json& spec = Field(slice, "spec");
  if (Str(spec, "driver") != formats::kDraDriver) return absl::InvalidArgumentError("not a Tessera slice");
  Pool pool;
  pool.node = Str(spec, "nodeName");
  pool.name = Str(Field(spec, "pool"), "name");
  if (pool.node.empty() || pool.name.empty()) {
    return absl::InvalidArgumentError("a Tessera slice without nodeName or pool");
  }
  const Json& count = Path(spec, {"pool", "resourceSliceCount"});
  if (count.is_number_integer() && count.get<int64_t>() != 1) {
    return absl::InvalidArgumentError("a pool of several slices (tessera-node publishes one)");
  }
  const Json& devices = Field(spec, "devices");
  if (!devices.is_array()) return pool;
  for (const Json& d : devices) {
    Device device;
    device.name = Str(d, "name");
    if (const Json& attrs = Field(d, "attributes"); attrs.is_object()) {
      for (const auto& [name, value] : attrs.items()) {
        if (std::optional<AttributeValue> a = ParseAttribute(value)) device.attributes[Qualified(name)] = *a;
      }
    }
    auto index = device.attributes.find(StrCat(formats::kDraDriver, "/index"));
    if (index == device.attributes.end() || index->second.kind != AttributeValue::Kind::kInt ||
        index->second.i < 0 || index->second.i >= core::kMaxGpusPerNode) {
      continue;  // not a device tessera-node published
    }
    device.index = static_cast<int>(index->second.i);
    absl::StatusOr<Capacity> cores = ParseCapacity(Path(d, {"capacity", "cores"}));
    absl::StatusOr<Capacity> memory = ParseCapacity(Path(d, {"capacity", "memory"}));
    if (!cores.ok() || !memory.ok() || cores->value != kCoresCapacity || memory->value < kMiB) continue;
    device.cores = *cores;
    device.memory = *memory;
    device.shared =
        Field(d, "allowMultipleAllocations").is_boolean() && d["allowMultipleAllocations"].get<bool>();
    if (Field(d, "taints").is_array()) {
      for (const Json& t : d["taints"]) {
        const std::string effect = Str(t, "effect");
        device.tainted = device.tainted || effect == "NoSchedule" || effect == "NoExecute";
      }
    }
    pool.devices.push_back(std::move(device));
  }
  std::sort(pool.devices.begin(), pool.devices.end(),
            [](const Device& a, const Device& b) { return a.index < b.index; });
  return pool;
}

DeviceClass ParseDeviceClass(const Json& device_class) {
  DeviceClass c;
  const Json& spec = Field(device_class, "spec");
  if (Field(spec, "selectors").is_array()) {
    for (const Json& s : spec["selectors"]) {
      absl::StatusOr<Selector> compiled = Selector::Compile(Str(Field(s, "cel"), "expression"));
      if (!compiled.ok()) {
        c.undecided = StrCat("DeviceClass ", Str(Field(device_class, "metadata"), "name"),
                             "'s selector is outside what Tessera evaluates: ", compiled.status().message());
        continue;
      }
      c.selectors.push_back(*std::move(compiled));
    }
  }
  if (Field(spec, "config").is_array()) c.config = spec["config"];
  if (Field(spec, "extendedResourceName").is_string()) {
    c.undecided = "the DeviceClass maps an extended resource (kube-scheduler allocates those)";
  }
  return c;
}

NodeView ParseNode(const Json& node) {
  NodeView v;
  v.name = Str(Field(node, "metadata"), "name");
  if (const Json& labels = Path(node, {"metadata", "labels"}); labels.is_object()) {
    for (const auto& [k, val] : labels.items()) {
      if (val.is_string()) v.labels[k] = val.get<std::string>();
    }
  }
  const Json& spec = Field(node, "spec");
  if (Field(spec, "taints").is_array()) v.taints = spec["taints"];
  v.unschedulable = Field(spec, "unschedulable").is_boolean() && spec["unschedulable"].get<bool>();
  const Json& allocatable = Path(node, {"status", "allocatable"});
  if (const Json& cpu = Field(allocatable, "cpu"); cpu.is_string()) {
    if (absl::StatusOr<core::K8sQuantity> q = core::ParseQuantity(cpu.get<std::string>()); q.ok())
      v.cpu_milli = q->milli;
  }
  v.memory_bytes = Units(Field(allocatable, "memory")).value_or(0);
  const Json& inventory = Path(node, {"metadata", "annotations", "tessera.dev/gpu-inventory"});
  if (inventory.is_string()) {
    if (absl::StatusOr<formats::GpuInventory> inv = formats::ParseGpuInventory(inventory.get<std::string>());
        inv.ok()) {
      v.links = inv->links;
    }
  }
  return v;
}

HostRequest PodHostRequest(const Json& pod) {
  const Json& spec = Field(pod, "spec");
  auto requests = [](const Json& c) {
    HostRequest r;
    const Json& req = Path(c, {"resources", "requests"});
    if (const Json& cpu = Field(req, "cpu"); cpu.is_string()) {
      if (absl::StatusOr<core::K8sQuantity> q = core::ParseQuantity(cpu.get<std::string>()); q.ok())
        r.cpu_milli = q->milli;
    }
    r.memory_bytes = Units(Field(req, "memory")).value_or(0);
    return r;
  };
  HostRequest sum, init_max, sidecars;
  if (Field(spec, "containers").is_array()) {
    for (const Json& c : spec["containers"]) {
      HostRequest r = requests(c);
      sum.cpu_milli += r.cpu_milli;
      sum.memory_bytes += r.memory_bytes;
    }
  }
  if (Field(spec, "initContainers").is_array()) {
    for (const Json& c : spec["initContainers"]) {
      HostRequest r = requests(c);
      if (Str(c, "restartPolicy") == "Always") {
        sidecars.cpu_milli += r.cpu_milli;
        sidecars.memory_bytes += r.memory_bytes;
        continue;
      }
      init_max.cpu_milli = std::max(init_max.cpu_milli, sidecars.cpu_milli + r.cpu_milli);
      init_max.memory_bytes = std::max(init_max.memory_bytes, sidecars.memory_bytes + r.memory_bytes);
    }
  }
  HostRequest out{std::max(sum.cpu_milli + sidecars.cpu_milli, init_max.cpu_milli),
                  std::max(sum.memory_bytes + sidecars.memory_bytes, init_max.memory_bytes)};
  const Json& overhead = Field(spec, "overhead");
  if (overhead.is_object()) {
    HostRequest o = requests(Json{{"resources", {{"requests", overhead}}}});
    out.cpu_milli += o.cpu_milli;
    out.memory_bytes += o.memory_bytes;
  }
  return out;
}

bool DraAllocator::UsesOnly(const Json& claim_spec, const std::set<std::string>& classes) {
  const Json& requests = Path(claim_spec, {"devices", "requests"});
  if (!requests.is_array() || requests.empty()) return false;
  for (const Json& r : requests) {
    if (Field(r, "exactly").is_object()) {
      if (!classes.contains(Str(r["exactly"], "deviceClassName"))) return false;
    } else if (Field(r, "firstAvailable").is_array() && !r["firstAvailable"].empty()) {
      for (const Json& sub : r["firstAvailable"]) {
        if (!classes.contains(Str(sub, "deviceClassName"))) return false;
      }
    } else {
      return false;
    }
  }
  return true;
}

std::string DraAllocator::ShareIdFor(const std::string& claim_uid, size_t index) {
  const std::string key = StrCat("tessera.dev/dra-share/", claim_uid, "/", index);
  uint64_t a = Fnv1a(1469598103934665603ULL, key), b = Fnv1a(0x9e3779b97f4a7c15ULL, key);
  a = core::Rng(a).Next();
  b = core::Rng(b).Next();
  a = (a & 0xffffffffffff0fffULL) | 0x0000000000004000ULL;
  b = (b & 0x3fffffffffffffffULL) | 0x8000000000000000ULL;
  char out[37];
  snprintf(out, sizeof(out), "%08llx-%04llx-%04llx-%04llx-%012llx", static_cast<unsigned long long>(a >> 32),
           static_cast<unsigned long long>((a >> 16) & 0xffff), static_cast<unsigned long long>(a & 0xffff),
           static_cast<unsigned long long>(b >> 48), static_cast<unsigned long long>(b & 0xffffffffffffULL));
  return out;
}

bool DraAllocator::AllocatedByTessera(const Json& claim) {
  const std::string uid = Str(Field(claim, "metadata"), "uid");
  const Json& results = Path(claim, {"status", "allocation", "devices", "results"});
  if (uid.empty() || !results.is_array() || results.empty()) return false;
  for (size_t k = 0; k < results.size(); ++k) {
    if (Str(results[k], "driver") != formats::kDraDriver || Str(results[k], "shareID") != ShareIdFor(uid, k))
      return false;
  }
  return true;
}

// A round's view of the cluster: Tessera's pools as a core::Cluster (each pool's devices as GPUs 0..n-1), the
// claims allocated so far committed on it, and each node's free CPU and memory.
struct DraAllocator::State {
  core::Cluster cluster;
  std::unique_ptr<core::Policy> policy;
  std::unique_ptr<core::Placer> placer;
  core::Rng rng{0};
  std::vector<uint32_t> rank;                            // per node of the cluster, by position
  std::map<std::string, const Pool*> pool_of;            // node -> pool
  std::map<std::string, const NodeView*> node_of;        // node -> view
  std::map<std::string, int64_t> cpu_free, memory_free;  // node -> free (when accounted)
  std::set<std::string> over;                            // nodes whose devices are over capacity
  std::vector<core::PodRequest> workload;                // the allocated claims, for the policy's context
  int64_t next_uid = 0;
};

DraAllocator::DraAllocator(AllocatorOptions options) : options_(std::move(options)) {}
DraAllocator::~DraAllocator() = default;

void DraAllocator::SetPools(std::vector<Pool> pools) {
  placed_held_.reset();
  pools_ = std::move(pools);
}
void DraAllocator::SetClasses(std::map<std::string, DeviceClass> classes) {
  classes_ = std::move(classes);
}
void DraAllocator::SetNodes(std::vector<NodeView> nodes) {
  nodes_ = std::move(nodes);
}
void DraAllocator::SetAllocatedClaims(const std::vector<Json>& claims) {
  placed_held_.reset();
  allocated_ = claims;
}

namespace {

// The devices a claim's allocation holds on Tessera's pools.
std::vector<std::pair<std::string, Held>> HeldBy(const Json& claim) {
  std::vector<std::pair<std::string, Held>> out;
  const Json& results = Path(claim, {"status", "allocation", "devices", "results"});
  if (!results.is_array()) return out;
  for (const Json& r : results) {
    if (Str(r, "driver") != formats::kDraDriver) continue;
    Held h;
    h.device = Str(r, "device");
    const Json& consumed = Field(r, "consumedCapacity");
    // No consumedCapacity: the device was taken whole (not shared).
    h.cores =
        consumed.is_object() ? Units(Field(consumed, "cores")).value_or(kCoresCapacity) : kCoresCapacity;
    h.memory = consumed.is_object() ? Units(Field(consumed, "memory")).value_or(-1) : -1;
    out.emplace_back(Str(r, "pool"), h);
  }
  return out;
}

}  // namespace

void DraAllocator::SetQuotas(std::vector<core::QuotaStanding> quotas) {
  placed_held_.reset();
  quotas_ = std::move(quotas);
}

std::vector<core::QuotaStanding> DraAllocator::QuotaHeld() const {
  if (placed_held_) return *placed_held_;
  State s;
  Build(s);
  return s.cluster.QuotaStandings();
}

std::vector<PodDecision> DraAllocator::Place(const std::vector<PodInput>& pods) {
  State s;
  Build(s);
  core::PolicyContext context = core::MakePolicyContext(s.cluster, s.workload);
  absl::StatusOr<std::unique_ptr<core::Policy>> policy = core::MakePolicy(options_.policy, context);
  if (!policy.ok()) policy = core::MakePolicy("binpack");
  s.policy = *std::move(policy);
  s.placer = std::make_unique<core::Placer>(*s.policy);
  state_ = &s;
  std::vector<PodDecision> out;
  for (const PodInput& p : pods) out.push_back(PlaceOne(p));
  state_ = nullptr;
  placed_held_ = s.cluster.QuotaStandings();
  return out;
}

void DraAllocator::Build(State& s) const {
  s.rng = core::Rng(options_.seed);
  for (const NodeView& n : nodes_) s.node_of[n.name] = &n;
  // The pools, in name order, as the cluster's nodes (devices 0..n-1 by their index attribute).
  std::vector<const Pool*> pools;
  for (const Pool& p : pools_) pools.push_back(&p);
  std::sort(pools.begin(), pools.end(), [](const Pool* a, const Pool* b) { return a->node < b->node; });
  for (const Pool* p : pools) {
    if (p->devices.empty() || s.pool_of.contains(p->node)) continue;
    core::NodeInfo info;
    info.name = core::NodeName(p->node);
    auto view = s.node_of.find(p->node);
    info.links = core::LinkMatrix(static_cast<int>(p->devices.size()));
    for (size_t i = 0; i < p->devices.size(); ++i) {
      const Device& d = p->devices[i];
      core::GpuInfo g;
      auto uuid = d.attributes.find(StrCat(formats::kDraDriver, "/uuid"));
      g.uuid = core::GpuUuid(uuid != d.attributes.end() ? uuid->second.s : StrCat(p->node, "/", d.name));
      g.index = static_cast<int>(i);
      auto model = d.attributes.find(StrCat(formats::kDraDriver, "/model"));
      g.model = model != d.attributes.end() ? model->second.s : "unknown";
      g.memory = core::MiB(d.memory.value / kMiB);
      auto numa = d.attributes.find(StrCat(formats::kDraDriver, "/numaNode"));
      g.numa_node = numa != d.attributes.end() ? static_cast<int>(numa->second.i) : -1;
      g.health = d.tainted ? core::GpuHealth::kUnhealthy : core::GpuHealth::kHealthy;
      info.gpus.push_back(g);
      // The links between the pool's devices: the node agent's measured ones (by NVML index) when known.
      for (size_t j = 0; j < i; ++j) {
        const Device& e = p->devices[j];
        if (view != s.node_of.end() && view->second->links && d.index < view->second->links->size() &&
            e.index < view->second->links->size()) {
          info.links.Set(static_cast<int>(i), static_cast<int>(j), view->second->links->at(d.index, e.index));
        }
      }
    }
    if (view != s.node_of.end()) info.schedulable = !view->second->unschedulable;
    if (absl::Status st = s.cluster.AddNode(std::move(info)); !st.ok()) {
      log::Warn("a DRA pool cannot be placed on", {{"node", p->node}, {"error", std::string(st.message())}});
      continue;
    }
    s.pool_of[p->node] = p;
    if (view != s.node_of.end() && view->second->cpu_milli > 0) {
      s.cpu_free[p->node] = view->second->cpu_milli - view->second->cpu_requested;
    }
    if (view != s.node_of.end() && view->second->memory_bytes > 0) {
      s.memory_free[p->node] = view->second->memory_bytes - view->second->memory_requested;
    }
  }
  for (const core::NodeState& n : s.cluster.nodes())
    s.rank.push_back(static_cast<uint32_t>(Mix(options_.seed, n.info().name.value())));
  // What the allocated claims hold.
  for (const Json& claim : allocated_) {
    std::map<std::string, std::vector<Held>> by_pool;
    for (auto& [pool, held] : HeldBy(claim)) by_pool[pool].push_back(held);
    for (const auto& [pool_name, held] : by_pool) {
      auto pool = s.pool_of.find(pool_name);
      if (pool == s.pool_of.end()) continue;
      core::PodRequest request;
      request.uid = core::PodUid(StrCat(Str(Field(claim, "metadata"), "uid"), "/", pool_name));
      request.ns = core::Namespace(Str(Field(claim, "metadata"), "namespace"));
      request.name = Str(Field(claim, "metadata"), "name");
      core::Placement placement;
      placement.node = core::NodeName(pool_name);
      for (size_t k = 0; k < held.size(); ++k) {
        const Device* device = nullptr;
        int position = 0;
        for (size_t i = 0; i < pool->second->devices.size(); ++i) {
          if (pool->second->devices[i].name == held[k].device) {
            device = &pool->second->devices[i];
            position = static_cast<int>(i);
          }
        }
        if (device == nullptr) continue;
        const int64_t memory = held[k].memory < 0 ? device->memory.value : held[k].memory;
        const int64_t milli = std::clamp<int64_t>(held[k].cores, 0, kCoresCapacity) * 1000 / kCoresCapacity;
        const int64_t mib = (memory + kMiB - 1) / kMiB;
        core::ContainerRequest c{.name = StrCat("r", k),
                                 .vgpus = {{core::MilliGpu(milli), {core::MemorySpec::Kind::kMiB, mib}}}};
        request.containers.push_back(c);
        core::ContainerAssignment a;
        a.name = c.name;
        a.vgpus.push_back({.gpu_index = position,
                           .uuid = s.cluster.FindNode(pool_name)->info().gpus[position].uuid,
                           .cores = core::MilliGpu(milli),
                           .memory = core::MiB(mib)});
        placement.containers.push_back(a);
      }
      if (request.containers.empty()) continue;
      if (absl::Status st = s.cluster.Commit(request, placement); !st.ok()) {
        // More than the devices hold (allocated by two allocators at once, or a slice that shrank): place
        // nothing more there until it is resolved.
        if (!s.over.contains(pool_name)) {
          log::Warn("DRA claims hold more than a node's GPUs",
                    {{"node", pool_name}, {"claim", request.name}, {"error", std::string(st.message())}});
        }
        s.over.insert(pool_name);
        continue;
      }
      s.workload.push_back(request);
    }
  }
  // The quotas, after the claims allocated: what they hold is counted, never refused.
  for (const core::QuotaStanding& q : quotas_) {
    if (q.limit) s.cluster.SetQuota(q.ns, q.model, *q.limit);
  }
  s.cluster.SetQuotaHeldElsewhere(quotas_);
}

PodDecision DraAllocator::PlaceOne(const PodInput& input) {
  State& s = *state_;
  PodDecision d;
  const Json& pod = input.pod;
  // The node the pod may go to: where its claims allocated already are, and where it fits.
  std::optional<std::string> fixed;
  std::vector<std::vector<RequestSpec>> specs(input.claims.size());
  for (size_t i = 0; i < input.claims.size(); ++i) {
    const Json& claim = input.claims[i];
    if (Path(claim, {"status", "allocation"}).is_object()) {
      std::set<std::string> nodes;
      for (auto& [pool, held] : HeldBy(claim)) nodes.insert(pool);
      if (nodes.size() != 1 || (fixed && *fixed != *nodes.begin())) {
        d.kind = PodDecision::Kind::kHandOver;
        d.reason = StrCat("claim ", Str(Field(claim, "metadata"), "name"), " is allocated on other nodes");
        return d;
      }
      fixed = *nodes.begin();
      continue;
    }
    absl::StatusOr<std::vector<RequestSpec>> spec = ParseClaim(claim, options_.classes, classes_);
    if (!spec.ok()) {
      d.kind = absl::IsUnavailable(spec.status()) ? PodDecision::Kind::kWait : PodDecision::Kind::kHandOver;
      d.reason = StrCat("claim ", Str(Field(claim, "metadata"), "name"), ": ", spec.status().message());
      return d;
    }
    specs[i] = *std::move(spec);
  }
  const HostRequest host = PodHostRequest(pod);
  std::vector<core::NodeName> candidates;
  std::vector<std::string> refused;
  for (const auto& [name, pool] : s.pool_of) {
    if (fixed && name != *fixed) continue;
    if (input.avoid_nodes.contains(name)) continue;
    auto view = s.node_of.find(name);
    if (view == s.node_of.end()) continue;  // the Node object is not known (yet)
    if (s.over.contains(name) || !PodFitsNode(pod, *view->second)) continue;
    if (auto it = s.cpu_free.find(name); it != s.cpu_free.end() && it->second < host.cpu_milli) continue;
    if (auto it = s.memory_free.find(name); it != s.memory_free.end() && it->second < host.memory_bytes)
      continue;
    candidates.push_back(core::NodeName(name));
  }
  if (candidates.empty()) {
    d.reason = fixed
                   ? StrCat("node ", *fixed,
                            " of its allocated claim cannot take the pod (CPU, memory, taints or selectors)")
               : input.avoid_nodes.empty()
                   ? "no node with Tessera GPUs can take the pod (CPU, memory, taints, selectors or affinity)"
                   : StrCat("no node with Tessera GPUs but ", StrJoin(input.avoid_nodes, ", "),
                            " (where kube-scheduler would not bind it) can take the pod");
    return d;
  }
  // Each claim in turn; the first decides the node of the others.
  struct Choice {
    core::Placement placement;
    std::vector<const Alternative*> alternatives;  // per container of the request
  };
  std::vector<std::optional<Choice>> chosen(input.claims.size());
  std::vector<core::PodUid> committed;
  auto undo = [&] {
    for (const core::PodUid& uid : committed) (void)s.cluster.Release(uid);
  };
  for (size_t i = 0; i < input.claims.size(); ++i) {
    if (specs[i].empty()) continue;
    const std::string claim_name = Str(Field(input.claims[i], "metadata"), "name");
    std::string why;
    // Requests in order; each request's alternatives in order, the first that places wins. Several requests
    // of one claim: placed one after the other on the first one's node.
    Choice claim_choice;
    claim_choice.placement.node = core::NodeName("");
    bool placed_all = true;
    for (const RequestSpec& r : specs[i]) {
      std::optional<std::pair<core::Placement, const Alternative*>> found;
      for (const Alternative& alt : r.alternatives) {
        // The devices this alternative may take (class and request selectors), by GPU UUID, cluster-wide.
        std::map<std::string, std::vector<core::GpuUuid>> groups;  // matchAttribute value -> devices
        bool error = false;
        for (const core::NodeName& node : candidates) {
          if (!claim_choice.placement.node.value().empty() && node != claim_choice.placement.node) continue;
          const Pool& pool = *s.pool_of.at(node.value());
          const core::NodeState& state = *s.cluster.FindNode(node.value());
          for (size_t k = 0; k < pool.devices.size(); ++k) {
            const Device& dev = pool.devices[k];
            if (dev.tainted) continue;
            if (!dev.cores.Consumed(alt.cores) || !dev.memory.Consumed(alt.memory)) continue;
            DeviceView view{formats::kDraDriver, &dev.attributes};
            bool match = true;
            const std::array<const std::vector<Selector>*, 2> lists = {
                &classes_.at(alt.device_class).selectors, &alt.selectors};
            for (const std::vector<Selector>* list : lists) {
              for (const Selector& sel : *list) {
                Verdict v = sel.Evaluate(view);
                if (v == Verdict::kError) error = true;
                match = match && v == Verdict::kMatch;
              }
            }
            if (!match) continue;
            std::string group;
            if (r.match_attribute) {
              auto a = dev.attributes.find(*r.match_attribute);
              if (a == dev.attributes.end()) continue;
              const AttributeValue& v = a->second;
              group = v.kind == AttributeValue::Kind::kInt    ? StrCat("i", v.i)
                      : v.kind == AttributeValue::Kind::kBool ? StrCat("b", v.b ? 1 : 0)
                                                              : StrCat("s", v.s);
            }
            groups[group].push_back(state.info().gpus[k].uuid);
          }
        }
        if (error) {
          undo();
          d.kind = PodDecision::Kind::kHandOver;
          d.reason = StrCat("claim ", claim_name,
                            ": a selector fails on some device (CEL runtime error); "
                            "kube-scheduler's allocator reports it");
          return d;
        }
        for (const auto& [group, uuids] : groups) {
          core::PodRequest request;
          request.uid = core::PodUid(StrCat("try/", ++s.next_uid));
          request.ns = core::Namespace(Str(Field(pod, "metadata"), "namespace"));
          request.name = Str(Field(pod, "metadata"), "name");
          core::ContainerRequest c;
          c.name = "claim";
          // Whole percent and MiB, rounded up by the policy; memory not asked for is all of the GPU's.
          const int64_t milli = alt.cores ? *alt.cores * 1000 / kCoresCapacity : 1000;
          const core::MemorySpec memory =
              alt.memory ? core::MemorySpec{core::MemorySpec::Kind::kMiB, (*alt.memory + kMiB - 1) / kMiB}
                         : core::MemorySpec{core::MemorySpec::Kind::kPercent, 100};
          for (int64_t k = 0; k < alt.count; ++k) c.vgpus.push_back({core::MilliGpu(milli), memory});
          request.containers.push_back(c);
          request.uuid_include = uuids;
          std::vector<core::NodeName> where = claim_choice.placement.node.value().empty()
                                                  ? candidates
                                                  : std::vector<core::NodeName>{claim_choice.placement.node};
          absl::StatusOr<core::Placement> p = s.placer->Place(s.cluster, request, s.rng, where, s.rank);
          if (!p.ok()) {
            why = std::string(p.status().message());
            continue;
          }
          if (!p->compressions.empty()) continue;  // never on the DRA path (docs/dra.md)
          if (!found || p->score > found->first.score) found.emplace(*p, &alt);
        }
        if (found) break;  // firstAvailable: the first alternative that fits
      }
      if (!found) {
        placed_all = false;
        break;
      }
      // Count it before the next request, so that they do not take the same share twice.
      core::PodRequest held;
      held.uid = core::PodUid(StrCat("held/", ++s.next_uid));
      held.ns = core::Namespace(Str(Field(pod, "metadata"), "namespace"));  // the next claim sees its quota
      held.containers = {{.name = "claim", .vgpus = {}}};
      core::Placement& p = found->first;
      for (const core::VGpuAssignment& v : p.containers[0].vgpus) {
        held.containers[0].vgpus.push_back({v.cores, {core::MemorySpec::Kind::kMiB, v.memory.value()}});
      }
      if (absl::Status st = s.cluster.Commit(held, p); !st.ok()) {
        placed_all = false;
        why = std::string(st.message());
        break;
      }
      committed.push_back(held.uid);
      if (claim_choice.placement.node.value().empty()) claim_choice.placement.node = p.node;
      for (const core::VGpuAssignment& v : p.containers[0].vgpus) {
        core::ContainerAssignment a;
        a.name = r.name;
        a.vgpus = {v};
        claim_choice.placement.containers.push_back(a);
        claim_choice.alternatives.push_back(found->second);
      }
    }
    if (!placed_all) {
      undo();
      d.reason = StrCat("claim ", claim_name,
                        " fits no node: ", why.empty() ? "no device matches its selectors" : why);
      return d;
    }
    chosen[i] = std::move(claim_choice);
    if (!fixed) {
      fixed = chosen[i]->placement.node.value();
      candidates = {chosen[i]->placement.node};
    }
  }
  // The allocations, as kube-scheduler writes them.
  d.kind = PodDecision::Kind::kPlaced;
  d.node = fixed.value_or("");
  const Pool& pool = *s.pool_of.at(d.node);
  for (size_t i = 0; i < input.claims.size(); ++i) {
    if (!chosen[i]) {
      d.allocations.emplace_back(std::nullopt);
      continue;
    }
    Json results = Json::array();
    std::map<std::string, std::set<std::string>> class_requests;  // class -> result request names
    for (size_t k = 0; k < chosen[i]->placement.containers.size(); ++k) {
      const core::VGpuAssignment& v = chosen[i]->placement.containers[k].vgpus[0];
      const Alternative& alt = *chosen[i]->alternatives[k];
      const Device& dev = pool.devices[static_cast<size_t>(v.gpu_index)];
      Json result = {
          {"request", alt.name}, {"driver", formats::kDraDriver}, {"pool", pool.name}, {"device", dev.name}};
      if (dev.shared) {
        result["consumedCapacity"] = {{"cores", StrCat(*dev.cores.Consumed(alt.cores))},
                                      {"memory", CanonicalBytes(*dev.memory.Consumed(alt.memory))}};
        result["shareID"] = ShareIdFor(Str(Field(input.claims[i], "metadata"), "uid"), results.size());
      }
      results.push_back(std::move(result));
      class_requests[alt.device_class].insert(alt.name);
    }
    Json config = Json::array();
    for (const auto& [cls, names] : class_requests) {
      for (const Json& c : classes_.at(cls).config) {
        Json entry = c;
        entry["source"] = "FromClass";
        entry["requests"] = Json(std::vector<std::string>(names.begin(), names.end()));
        config.push_back(std::move(entry));
      }
    }
    if (const Json& claim_config = Path(input.claims[i], {"spec", "devices", "config"});
        claim_config.is_array()) {
      for (const Json& c : claim_config) {
        Json entry = c;
        entry["source"] = "FromClaim";
        config.push_back(std::move(entry));
      }
    }
    Json devices = {{"results", std::move(results)}};
    if (!config.empty()) devices["config"] = std::move(config);
    d.allocations.emplace_back(Json{
        {"devices", std::move(devices)},
        {"nodeSelector",
         {{"nodeSelectorTerms", Json::array({{{"matchFields", Json::array({{{"key", "metadata.name"},
                                                                            {"operator", "In"},
                                                                            {"values", {d.node}}}})}}})}}}});
  }
  // The pod's CPU and memory are taken on the node for the pods decided after it.
  if (auto it = s.cpu_free.find(d.node); it != s.cpu_free.end()) it->second -= host.cpu_milli;
  if (auto it = s.memory_free.find(d.node); it != s.memory_free.end()) it->second -= host.memory_bytes;
  return d;
}

std::map<std::string, HostRequest> RequestedByNode(std::span<const PodOnNode> pods,
                                                   std::span<const Json> allocated) {
  std::map<std::string, std::string> unbound_on;  // pod UID -> the node its claims are allocated on
  for (const Json& c : allocated) {
    const std::string node = AllocatedNode(c);
    if (node.empty()) continue;
    for (const Json& r : Field(Field(c, "status"), "reservedFor")) {
      if (Str(r, "resource") == "pods") unbound_on.emplace(Str(r, "uid"), node);
    }
  }
  std::map<std::string, HostRequest> requested;
  for (const PodOnNode& p : pods) {
    std::string node = p.node;
    if (node.empty()) {
      auto it = unbound_on.find(p.uid);
      if (it == unbound_on.end()) continue;
      node = it->second;
    }
    requested[node].cpu_milli += p.host.cpu_milli;
    requested[node].memory_bytes += p.host.memory_bytes;
  }
  return requested;
}

std::string AllocatedNode(const Json& claim) {
  const Json& terms = Path(claim, {"status", "allocation", "nodeSelector", "nodeSelectorTerms"});
  if (!terms.is_array() || terms.size() != 1) return "";
  const Json& fields = Field(terms[0], "matchFields");
  if (!fields.is_array() || fields.size() != 1 || !Field(terms[0], "matchExpressions").is_null()) return "";
  const Json& r = fields[0];
  const Json& values = Field(r, "values");
  if (Str(r, "key") != "metadata.name" || Str(r, "operator") != "In" || !values.is_array() ||
      values.size() != 1 || !values[0].is_string()) {
    return "";
  }
  return values[0].get<std::string>();
}

}  // namespace tessera::scheduler::dra

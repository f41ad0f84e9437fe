#include "node/dra_claim.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "core/quantity.h"
#include "core/strings.h"
#include "k8s/objects.h"

namespace tessera::node {

namespace fs = std::filesystem;

namespace {

constexpr char kDevicePrefix[] = "gpu-";

// The GPUs joined to `index` by links `near` accepts, directly or through others: the smallest index among
// them names the domain (a claim's matchAttribute on it keeps its GPUs within one).
template <typename Near>
int LinkDomain(const core::LinkMatrix& links, int index, Near near) {
  const int n = links.size();
  if (index >= n) return index;
  std::vector<bool> seen(static_cast<size_t>(n), false);
  std::vector<int> stack = {index};
  seen[static_cast<size_t>(index)] = true;
  int smallest = index;
  while (!stack.empty()) {
    const int a = stack.back();
    stack.pop_back();
    smallest = std::min(smallest, a);
    for (int b = 0; b < n; ++b) {
      if (!seen[static_cast<size_t>(b)] && near(links.at(a, b).kind)) {
        seen[static_cast<size_t>(b)] = true;
        stack.push_back(b);
      }
    }
  }
  return smallest;
}

// `mib` MiB as kube-apiserver writes a binary quantity back (its canonical form: the largest binary suffix that
// keeps the number whole, 32768Mi -> 32Gi), so that the slice read back compares equal to the one written.
std::string CanonicalMiB(int64_t mib) {
  static constexpr const char* kSuffixes[] = {"Mi", "Gi", "Ti", "Pi", "Ei"};
  if (mib == 0) return "0";
  size_t i = 0;
  while (i + 1 < std::size(kSuffixes) && mib % 1024 == 0) {
    mib /= 1024;
    ++i;
  }
  return StrCat(mib, kSuffixes[i]);
}

// A string field of a JSON object, "" when absent or not a string.
std::string Str(const Json& j, const char* key) {
  if (!j.is_object()) return "";
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

const Json* Path(const Json& j, std::initializer_list<const char*> keys) {
  const Json* at = &j;
  for (const char* k : keys) {
    if (!at->is_object()) return nullptr;
    auto it = at->find(k);
    if (it == at->end()) return nullptr;
    at = &*it;
  }
  return at;
}

// The tenant settings a claim may carry as opaque configuration for this driver
// (spec.devices.config[].opaque.parameters, copied into the allocation): {"computePolicy": "hard"|"elastic",
// "priority": "low"|"high"}.
absl::Status ApplyOpaqueConfig(const Json& parameters, ContainerRecord* r) {
  if (!parameters.is_object()) {
    return absl::InvalidArgumentError("the opaque parameters of gpu.tessera.dev must be a JSON object");
  }
  for (const auto& [key, value] : parameters.items()) {
    if (key == "apiVersion" || key == "kind") continue;
    if (key == "computePolicy") {
      std::optional<core::ComputePolicy> p =
          value.is_string() ? core::ComputePolicyFromString(value.get<std::string>()) : std::nullopt;
      if (!p) return absl::InvalidArgumentError("computePolicy must be \"hard\" or \"elastic\"");
      r->compute_policy = *p;
    } else if (key == "priority") {
      std::optional<core::Priority> p =
          value.is_string() ? core::PriorityFromString(value.get<std::string>()) : std::nullopt;
      if (!p) return absl::InvalidArgumentError("priority must be \"low\" or \"high\"");
      r->priority = *p;
    } else {
      return absl::InvalidArgumentError(StrCat("unknown parameter \"", key,
                                               "\" for gpu.tessera.dev; known: computePolicy, priority"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string DraDeviceName(int index) { return StrCat(kDevicePrefix, index); }

int DraDeviceIndex(std::string_view name) {
  if (!name.starts_with(kDevicePrefix)) return -1;
  int i = -1;
  if (!ParseInt(name.substr(sizeof(kDevicePrefix) - 1), &i) || i < 0) return -1;
  if (DraDeviceName(i) != name) return -1;  // "gpu-01", "gpu-+1"
  return i;
}

Json ResourceSliceFor(const DraDriverConfig& config, const formats::GpuInventory& inventory,
                      const std::string& node_uid, int64_t generation) {
  Json devices = Json::array();
  for (const formats::InventoryGpu& g : inventory.gpus) {
    if (!config.gpus.contains(g.info.index)) continue;
    const std::string memory = CanonicalMiB(g.info.memory.value());
    Json attributes = {{"model", {{"string", g.info.model}}},
                       {"uuid", {{"string", g.info.uuid.value()}}},
                       {"index", {{"int", g.info.index}}},
                       {"nvlinkDomain",
                        {{"int", LinkDomain(inventory.links, g.info.index,
                                            [](core::LinkKind k) { return k == core::LinkKind::kNvLink; })}}},
                       // Behind one PCIe switch (nvidia-smi's PIX) or joined by NVLink: peer-to-peer without
                       // crossing a host bridge.
                       {"pcieSwitch",
                        {{"int", LinkDomain(inventory.links, g.info.index, [](core::LinkKind k) {
                            return k == core::LinkKind::kNvLink || k == core::LinkKind::kPix;
                          })}}}};
    if (g.info.numa_node >= 0) attributes["numaNode"] = {{"int", g.info.numa_node}};
    if (!g.pci_bus_id.empty()) attributes["pciBusID"] = {{"string", g.pci_bus_id}};
    Json device = {
        {"name", DraDeviceName(g.info.index)},
        {"allowMultipleAllocations", true},
        {"attributes", attributes},
        // A claim that asks for neither capacity takes all of both: a whole GPU. Shares are asked in whole
        // percent and MiB (the limits file's units).
        {"capacity",
         {{"cores",
           {{"value", StrCat(kCoresCapacity)},
            {"requestPolicy",
             {{"default", StrCat(kCoresCapacity)},
              {"validRange", {{"min", "1"}, {"max", StrCat(kCoresCapacity)}, {"step", "1"}}}}}}},
          {"memory",
           {{"value", memory},
            {"requestPolicy",
             {{"default", memory}, {"validRange", {{"min", "1Mi"}, {"max", memory}, {"step", "1Mi"}}}}}}}}}};
    if (g.info.health != core::GpuHealth::kHealthy) {
      device["taints"] = Json::array({{{"key", "gpu.tessera.dev/unhealthy"}, {"effect", "NoSchedule"}}});
    }
    devices.push_back(std::move(device));
  }
  Json slice = {{"apiVersion", "resource.k8s.io/v1"},
                {"kind", "ResourceSlice"},
                {"metadata", {{"name", StrCat(config.node_name, "-", config.driver)}}},
                {"spec",
                 {{"driver", config.driver},
                  {"nodeName", config.node_name},
                  {"pool", {{"name", config.node_name}, {"generation", generation}, {"resourceSliceCount", 1}}},
                  {"devices", devices}}}};
  if (!node_uid.empty()) {
    slice["metadata"]["ownerReferences"] = Json::array(
        {{{"apiVersion", "v1"}, {"kind", "Node"}, {"name", config.node_name}, {"uid", node_uid}, {"controller", true}}});
  }
  return slice;
}

absl::StatusOr<ClaimOnNode> ReadClaim(const Json& claim, const kubelet::DraClaim& ref,
                                      const DraDriverConfig& config, const formats::GpuInventory& inventory) {
  const std::string what = StrCat("claim ", ref.ns, "/", ref.name);
  if (!claim.is_object()) return absl::InvalidArgumentError(StrCat(what, " is not a JSON object"));
  const std::string uid = k8s::Uid(claim);
  if (uid != ref.uid) {
    return absl::NotFoundError(StrCat(what, " is now another object (UID ", uid, ", the kubelet asked for ",
                                      ref.uid, "); it was deleted and made again"));
  }
  const Json* results = Path(claim, {"status", "allocation", "devices", "results"});
  if (results == nullptr || !results->is_array()) {
    return absl::FailedPreconditionError(StrCat(what, " is not allocated (no status.allocation)"));
  }
  ClaimOnNode out;
  ContainerRecord& r = out.record;
  r.claim = ContainerRecord::Claim{ref.uid, ref.ns, ref.name, {}};
  r.ns = ref.ns;
  if (const Json* reserved = Path(claim, {"status", "reservedFor"}); reserved != nullptr && reserved->is_array()) {
    for (const Json& c : *reserved) {
      if (Str(c, "resource") != "pods" || Str(c, "uid").empty()) continue;
      if (r.claim->consumers.empty()) r.pod_name = Str(c, "name");
      r.claim->consumers.push_back(Str(c, "uid"));
    }
  }
  if (r.claim->consumers.empty()) {
    return absl::FailedPreconditionError(StrCat(what, " is reserved for no pod (status.reservedFor)"));
  }
  r.pod_uid = r.claim->consumers[0];
  std::set<std::string> our_requests;
  std::map<int, size_t> by_index;  // GPU index -> r.vgpus entry
  for (const Json& res : *results) {
    if (Str(res, "driver") != config.driver || Str(res, "pool") != config.node_name) continue;
    const std::string device = Str(res, "device");
    const int index = DraDeviceIndex(device);
    if (index < 0 || !config.gpus.contains(index) || static_cast<size_t>(index) >= inventory.gpus.size()) {
      return absl::NotFoundError(StrCat(what, " was allocated device ", device, ", which this node does not "
                                        "publish to DRA; delete the claim's pod so that it is allocated again"));
    }
    const formats::InventoryGpu& g = inventory.gpus[static_cast<size_t>(index)];
    int64_t percent = kCoresCapacity;
    int64_t mib = g.info.memory.value();
    if (const Json* consumed = Path(res, {"consumedCapacity"}); consumed != nullptr && consumed->is_object()) {
      for (const auto& [name, value] : consumed->items()) {
        if (!value.is_string()) return absl::InvalidArgumentError(StrCat(what, ": consumedCapacity ", name, " is not a quantity"));
        absl::StatusOr<core::K8sQuantity> q = core::ParseQuantity(value.get<std::string>());
        if (!q.ok()) return absl::InvalidArgumentError(StrCat(what, ": consumedCapacity ", name, ": ", Message(q.status())));
        if (name == "cores") {
          percent = q->Ceil();
        } else if (name == "memory") {
          mib = q->milli / 1000 / (int64_t{1} << 20);  // whole MiB, never above what was consumed
        }
      }
    }
    if (percent < 1 || percent > kCoresCapacity || mib < 1 || mib > g.info.memory.value()) {
      return absl::InvalidArgumentError(StrCat(what, " consumes ", percent, "% and ", mib, " MiB of ", device,
                                               ", outside 1-100% and 1-", g.info.memory.value(), " MiB"));
    }
    // A configuration may name the request, or for a firstAvailable alternative "<request>/<subrequest>" or
    // only its parent request.
    const std::string request = Str(res, "request");
    our_requests.insert(request);
    our_requests.insert(request.substr(0, request.find('/')));
    kubelet::DraPreparedDevice d;
    // The kubelet gives a container the CDI devices of the devices whose request names contain the request its
    // resources.claims[].request names, which is always a top-level request: a firstAvailable alternative's
    // "<request>/<subrequest>" is reported as "<request>" (as k8s.io/dynamic-resource-allocation's kubeletplugin
    // does).
    d.requests = {request.substr(0, request.find('/'))};
    d.pool = config.node_name;
    d.device = device;
    d.share_id = Str(res, "shareID");
    out.devices.push_back(std::move(d));
    // Two requests of one claim on the same GPU are one tenant there: their shares add up.
    auto [it, fresh] = by_index.try_emplace(index, r.vgpus.size());
    if (fresh) {
      core::VGpuAssignment v;
      v.gpu_index = index;
      v.uuid = g.info.uuid;
      r.vgpus.push_back(v);
    }
    core::VGpuAssignment& v = r.vgpus[it->second];
    v.cores = core::MilliGpu(std::min<int32_t>(1000, v.cores.value() + static_cast<int32_t>(percent * 10)));
    v.memory = core::MiB(std::min<int64_t>(g.info.memory.value(), v.memory.value() + mib));
  }
  if (r.vgpus.empty()) {
    return absl::NotFoundError(StrCat(what, " allocates no device of driver ", config.driver, " on node ",
                                      config.node_name));
  }
  // NUMA binding when every GPU of the claim is on one NUMA node.
  const int numa = inventory.gpus[static_cast<size_t>(r.vgpus[0].gpu_index)].info.numa_node;
  if (numa >= 0 && std::all_of(r.vgpus.begin(), r.vgpus.end(), [&](const core::VGpuAssignment& v) {
        return inventory.gpus[static_cast<size_t>(v.gpu_index)].info.numa_node == numa;
      })) {
    const std::map<int, std::string> cpus = inventory.NumaCpus();
    if (auto it = cpus.find(numa); it != cpus.end()) {
      r.numa_node = numa;
      r.cpus = it->second;
    }
  }
  if (const Json* configs = Path(claim, {"status", "allocation", "devices", "config"}); configs != nullptr && configs->is_array()) {
    for (const Json& c : *configs) {
      const Json* opaque = Path(c, {"opaque"});
      if (opaque == nullptr || Str(*opaque, "driver") != config.driver) continue;
      bool applies = true;
      if (const Json* requests = Path(c, {"requests"}); requests != nullptr && requests->is_array() && !requests->empty()) {
        applies = std::any_of(requests->begin(), requests->end(), [&](const Json& q) {
          return q.is_string() && our_requests.contains(q.get<std::string>());
        });
      }
      if (!applies) continue;
      const Json* parameters = Path(*opaque, {"parameters"});
      if (parameters == nullptr) continue;
      if (absl::Status s = ApplyOpaqueConfig(*parameters, &r); !s.ok()) {
        return absl::InvalidArgumentError(StrCat(what, ": ", Message(s)));
      }
    }
  }
  return out;
}

std::string CdiDeviceId(const std::string& claim_uid) { return StrCat(kCdiKind, "=", claim_uid); }

std::string CdiSpecPath(const DraDriverConfig& config, const std::string& claim_uid) {
  return (fs::path(config.cdi_dir) / StrCat("tessera.dev-claim_", claim_uid, ".json")).string();
}

std::string CdiSpec(const std::string& claim_uid, const kubelet::ContainerAllocation& edits) {
  Json env = Json::array();
  for (const auto& [k, v] : edits.envs) env.push_back(StrCat(k, "=", v));
  Json mounts = Json::array();
  for (const kubelet::Mount& m : edits.mounts) {
    Json options = Json::array({m.read_only ? "ro" : "rw", "nosuid", "nodev", "rbind"});
    mounts.push_back({{"hostPath", m.host_path}, {"containerPath", m.container_path}, {"options", options}});
  }
  Json device_nodes = Json::array();
  for (const kubelet::DeviceNode& d : edits.devices) {
    device_nodes.push_back({{"path", d.container_path}, {"hostPath", d.host_path}, {"permissions", d.permissions}});
  }
  Json container_edits = {{"env", env}, {"mounts", mounts}};
  if (!device_nodes.empty()) container_edits["deviceNodes"] = device_nodes;
  const Json spec = {{"cdiVersion", "0.6.0"},
                     {"kind", kCdiKind},
                     {"devices", Json::array({{{"name", claim_uid}, {"containerEdits", container_edits}}})}};
  return spec.dump(2) + "\n";
}

}  // namespace tessera::node

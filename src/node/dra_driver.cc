#include "node/dra_driver.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>

#include "common/exposition.h"
#include "common/files.h"
#include "common/log.h"
#include "core/strings.h"
#include "k8s/api_status.h"
#include "k8s/objects.h"

namespace tessera::node {

namespace fs = std::filesystem;
using k8s::Json;

DraDriver::DraDriver(DraDriverConfig config, k8s::KubeApi* api, NodeAgent* agent, formats::GpuInventory inventory)
    : config_(std::move(config)), api_(api), agent_(agent), inventory_(std::move(inventory)) {}

DraDriver::~DraDriver() { Stop(); }

Mutex& DraDriver::ClaimLock(const std::string& uid) {
  return claim_locks_[std::hash<std::string>{}(uid) % claim_locks_.size()];
}

absl::StatusOr<std::vector<kubelet::DraPreparedDevice>> DraDriver::Prepare(const kubelet::DraClaim& ref) {
  if (!SafePathName(ref.uid)) return absl::InvalidArgumentError(StrCat("claim UID \"", ref.uid, "\" is not a UID"));
  MutexLock claim_lock(&ClaimLock(ref.uid));
  absl::StatusOr<Json> claim = api_->Get(k8s::kResourceClaims, ref.ns, ref.name);
  if (!claim.ok()) {
    return absl::UnavailableError(StrCat("cannot read claim ", ref.ns, "/", ref.name, " from the API server: ",
                                         Message(claim.status()), "; the kubelet will retry"));
  }
  formats::GpuInventory inventory;
  {
    MutexLock lock(&mu_);
    inventory = inventory_;
  }
  absl::StatusOr<ClaimOnNode> on_node = ReadClaim(*claim, ref, config_, inventory);
  if (!on_node.ok()) return on_node.status();
  absl::StatusOr<ContainerRecord> record = agent_->PrepareClaim(std::move(on_node->record));
  if (!record.ok()) return record.status();
  std::error_code ec;
  fs::create_directories(config_.cdi_dir, ec);
  if (absl::Status s = WriteTextFileAtomically(CdiSpecPath(config_, ref.uid), CdiSpec(ref.uid, agent_->Response(*record)));
      !s.ok()) {
    return absl::InternalError(StrCat(Message(s), "; check that tessera-node may write to ", config_.cdi_dir));
  }
  // One CDI device carries the whole claim. The kubelet gives a container the CDI IDs of every device of the
  // requests it uses, so the ID goes on the first device of each request only (not once per GPU).
  std::set<std::string> requests_given;
  for (kubelet::DraPreparedDevice& d : on_node->devices) {
    if (requests_given.insert(d.requests.empty() ? "" : d.requests[0]).second) d.cdi_device_ids = {CdiDeviceId(ref.uid)};
  }
  return on_node->devices;
}

absl::Status DraDriver::Unprepare(const kubelet::DraClaim& ref) {
  if (!SafePathName(ref.uid)) return absl::InvalidArgumentError(StrCat("claim UID \"", ref.uid, "\" is not a UID"));
  MutexLock claim_lock(&ClaimLock(ref.uid));
  if (absl::Status s = agent_->UnprepareClaim(ref.uid); !s.ok()) return s;
  std::error_code ec;
  fs::remove(CdiSpecPath(config_, ref.uid), ec);
  if (ec) return absl::InternalError(StrCat("cannot remove ", CdiSpecPath(config_, ref.uid), ": ", ec.message()));
  return absl::OkStatus();
}

absl::Status DraDriver::PublishSlice() {
  formats::GpuInventory inventory;
  {
    MutexLock lock(&mu_);
    inventory = inventory_;
  }
  std::string node_uid;
  if (absl::StatusOr<Json> node = api_->Get(k8s::kNodes, "", config_.node_name); node.ok()) {
    node_uid = k8s::Uid(*node);
  }
  const std::string name = StrCat(config_.node_name, "-", config_.driver);
  absl::StatusOr<Json> current = api_->Get(k8s::kResourceSlices, "", name);
  if (absl::IsNotFound(current.status())) {
    absl::StatusOr<Json> made = api_->Create(k8s::kResourceSlices, "", ResourceSliceFor(config_, inventory, node_uid, 1));
    if (made.ok()) log::Info("ResourceSlice published", {{"slice", name}, {"devices", StrCat(config_.gpus.size())}});
    return made.status();
  }
  if (!current.ok()) return current.status();
  const Json generation_field = current->value("/spec/pool/generation"_json_pointer, Json());
  const int64_t generation = generation_field.is_number_integer() ? generation_field.get<int64_t>() : 0;
  Json wanted = ResourceSliceFor(config_, inventory, node_uid, generation);
  // The API server writes quantities in canonical form (ResourceSliceFor does too) and stamps each taint's
  // timeAdded: compare without the stamps, or the slice would be rewritten at every resync.
  Json have = (*current)["spec"];
  if (have.contains("devices") && have["devices"].is_array()) {
    for (Json& d : have["devices"]) {
      if (!d.is_object() || !d.contains("taints") || !d["taints"].is_array()) continue;
      for (Json& t : d["taints"]) {
        if (t.is_object()) t.erase("timeAdded");
      }
    }
  }
  if (have == wanted["spec"]) return absl::OkStatus();
  wanted = ResourceSliceFor(config_, inventory, node_uid, generation + 1);
  wanted["metadata"]["resourceVersion"] = k8s::ResourceVersion(*current);
  absl::StatusOr<Json> updated = api_->Update(k8s::kResourceSlices, "", wanted);
  if (updated.ok()) log::Info("ResourceSlice updated", {{"slice", name}, {"generation", StrCat(generation + 1)}});
  return updated.status();
}

int DraDriver::SweepForgottenClaims() {
  std::vector<ContainerRecord> claims = agent_->Records();
  std::erase_if(claims, [](const ContainerRecord& r) { return !r.is_claim(); });
  // The node's pods are read only where there is a claim to check against them.
  const std::optional<std::set<std::string>> listed =
      claims.empty() ? std::optional<std::set<std::string>>() : agent_->ListedPodUids();
  const auto now = std::chrono::steady_clock::now();
  std::set<std::string> prepared;  // claim UIDs with a record
  std::set<std::string> wanted;    // of those, the ones this sweep found still wanted (a pod, a process, the claim)
  std::vector<kubelet::DraClaim> due;
  for (const ContainerRecord& r : claims) {
    prepared.insert(r.claim->uid);
    // What cannot be read decides nothing: the claim keeps its mark, neither set nor cleared.
    if (!listed) continue;
    // The node's own knowledge first, so that a claim in use costs the API server nothing: a pod of it still
    // listed (its teardown, and the kubelet's unprepare, to come) or a process of it still running.
    std::vector<std::string> pods = r.claim->consumers;
    pods.push_back(r.pod_uid);
    if (std::any_of(pods.begin(), pods.end(), [&](const std::string& uid) { return listed->contains(uid); }) ||
        !agent_->TenantPids(r.pod_uid, r.container).empty()) {
      wanted.insert(r.claim->uid);
      continue;
    }
    absl::StatusOr<Json> claim = api_->Get(k8s::kResourceClaims, r.claim->ns, r.claim->name);
    if (!claim.ok() && !absl::IsNotFound(claim.status())) continue;
    if (claim.ok() && k8s::Uid(*claim) == r.claim->uid) {  // the kubelet will unprepare it
      wanted.insert(r.claim->uid);
      continue;
    }
    MutexLock lock(&mu_);
    const auto since = forgotten_since_.try_emplace(r.claim->uid, now).first;  // kept from an earlier sweep
    if (now - since->second >= config_.forgotten_claim_grace) {
      due.push_back(kubelet::DraClaim{r.claim->ns, r.claim->uid, r.claim->name});
    }
  }
  {
    MutexLock lock(&mu_);
    std::erase_if(forgotten_since_, [&](const auto& entry) {
      return !prepared.contains(entry.first) || wanted.contains(entry.first);
    });
  }
  int unprepared = 0;
  for (const kubelet::DraClaim& ref : due) {
    if (absl::Status s = Unprepare(ref); !s.ok()) {
      log::Warn("cannot unprepare a claim the kubelet forgot; will retry",
                {{"claim", StrCat(ref.ns, "/", ref.name)}, {"uid", ref.uid}, {"error", Message(s)}});
      continue;
    }
    ++unprepared;
    log::Warn("unprepared a claim the kubelet forgot: its ResourceClaim is gone from the API server, no pod of "
              "it is on the node and no process of it is registered",
              {{"claim", StrCat(ref.ns, "/", ref.name)}, {"uid", ref.uid},
               {"grace_ms", StrCat(config_.forgotten_claim_grace.count())}});
    MutexLock lock(&mu_);
    forgotten_since_.erase(ref.uid);
    ++forgotten_unprepared_;
  }
  return unprepared;
}

std::string DraDriver::MetricsText() const {
  uint64_t n = 0;
  {
    MutexLock lock(&mu_);
    n = forgotten_unprepared_;
  }
  std::string out;
  exposition::AppendFamily(&out, "tessera_node_dra_forgotten_claims_unprepared_total",
                           "Claims prepared here that the kubelet never unprepared and that tessera-node "
                           "unprepared itself: the ResourceClaim gone from the API server, no pod of it on the "
                           "node, no process of it registered, for the grace period (docs/dra.md).",
                           "counter", StrCat("tessera_node_dra_forgotten_claims_unprepared_total ", n, "\n"));
  return out;
}

void DraDriver::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void DraDriver::Loop() {
  while (true) {
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (absl::Status s = PublishSlice(); !s.ok()) {
      log::Warn("cannot publish the node's ResourceSlice; will retry", {{"error", Message(s)}});
    }
    SweepForgottenClaims();
    const auto until = std::chrono::steady_clock::now() + config_.resync;
    MutexLock lock(&mu_);
    while (!stopping_ && !publish_now_) {
      if (!cv_.WaitUntil(&mu_, until)) break;
    }
    publish_now_ = false;
  }
}

void DraDriver::SetGpuHealth(const core::GpuUuid& uuid, bool healthy) {
  {
    MutexLock lock(&mu_);
    for (formats::InventoryGpu& g : inventory_.gpus) {
      if (g.info.uuid == uuid) g.info.health = healthy ? core::GpuHealth::kHealthy : core::GpuHealth::kUnhealthy;
    }
    publish_now_ = true;
  }
  cv_.SignalAll();
}

void DraDriver::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tessera::node
